"""The request bodies of the REST API, with every limit of :mod:`forkpoint.models` as a
validation rule — and :func:`parse`, which the runtime uses to check its own arguments,
so every interface (REST, CLI, SDK, MCP) enforces exactly the same limits.

pydantic models: they are what FastAPI reads request bodies into and documents in the
OpenAPI spec. Imported only where input is checked (not by ``forkpoint ls``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from forkpoint.egress import (
    HEADER_NAME_REGEX,
    HOST_NAME_REGEX,
    MAX_HEADER_HOSTS,
    MAX_HEADER_VALUE,
    MAX_HEADERS_PER_HOST,
    parse_headers,
    parse_rule,
)
from forkpoint.errors import InvalidInput
from forkpoint.models import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    MAX_CPUS,
    MAX_DISK_MIB,
    MAX_EGRESS_RULES,
    MAX_FORKS,
    MAX_MEMORY_MIB,
    MAX_PORTS,
    MAX_TIMEOUT_S,
    MAX_VOLUME_FILE_BYTES,
    MIN_MEMORY_MIB,
    NAME_PATTERN,
    Expiry,
    Network,
    OutputEncoding,
)
from forkpoint.volume_fs import MAX_LIST_DEPTH

__all__ = [
    "BackgroundExecRequest",
    "EgressRule",
    "CheckpointRequest",
    "Cpus",
    "CreateSessionRequest",
    "ExecRequest",
    "ForegroundExecRequest",
    "ForkCount",
    "Flag",
    "ForkRequest",
    "TerminalInputRequest",
    "TerminalRequest",
    "TerminalSizeRequest",
    "GuestPath",
    "GuestPort",
    "MemoryMiB",
    "Name",
    "PauseRequest",
    "PortRequest",
    "Ref",
    "DiffRequest",
    "EgressRequest",
    "EventsRequest",
    "RollbackPreviewRequest",
    "UndoRequest",
    "WatchRequest",
    "WatcherEventsRequest",
    "MetricsRequest",
    "MAX_OWNER_ID",
    "CreateVolumeRequest",
    "VolumeDirRequest",
    "VolumeEntriesRequest",
    "VolumeMetadataRequest",
    "VolumePathRequest",
    "VolumeWriteRequest",
    "RollbackRequest",
    "TimeoutRequest",
    "TimeoutS",
    "describe_invalid",
    "parse",
]


# Numbers and flags as JSON Schema means them: pydantic's lax mode would take `true` for 1,
# "5" for 5 and "yes" for true (the API fuzzer's {"timeout_s": true} was answered 200),
# its strict mode would refuse 2.0, which JSON Schema counts as an integer.
def _json_integer(value: object) -> object:
    if isinstance(value, bool | str):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


# After the constraints: before them, pydantic's schema would say "ge", not "minimum".
_JSON_INTEGER = BeforeValidator(_json_integer)


def _json_flag(value: object) -> object:
    # A Literal[True]/Literal[False] compares by ==, so it would take 1 and 0 (the API
    # fuzzer's {"background": 0} was run as a foreground command).
    if not isinstance(value, bool):
        raise PydanticCustomError("bool_type", "Input should be a valid boolean")
    return value


_JSON_FLAG = BeforeValidator(_json_flag)


def _iso_instant(value: object) -> object:
    # pydantic would read "0.0" or 17 as seconds since 1970; the schema says date-time (the
    # API fuzzer's ?start=0.0 was answered 200).
    if isinstance(value, str) and re.match(r"\d{4}-\d{2}-\d{2}", value):
        return value
    if isinstance(value, datetime):
        return value
    raise PydanticCustomError("datetime_type", "Input should be an ISO 8601 date and time")


Instant = Annotated[datetime, BeforeValidator(_iso_instant)]
Number = Annotated[float, Field(strict=True)]  # strict floats take ints, not bools or strings
Flag = Annotated[bool, Field(strict=True)]
GuestPort = Annotated[
    int, Field(ge=1, le=65535, description="A TCP port inside the guest."), _JSON_INTEGER
]
MemoryMiB = Annotated[
    int,
    Field(ge=MIN_MEMORY_MIB, le=MAX_MEMORY_MIB, description="Guest RAM in MiB."),
    _JSON_INTEGER,
]
Cpus = Annotated[int, Field(ge=1, le=MAX_CPUS, description="Virtual CPUs."), _JSON_INTEGER]
TimeoutS = Annotated[
    Number,
    Field(gt=0, le=MAX_TIMEOUT_S, description="Seconds until the session is removed."),
]
ForkCount = Annotated[
    int, Field(ge=1, le=MAX_FORKS, description="Sessions to start."), _JSON_INTEGER
]
Name = Annotated[
    str,
    StringConstraints(pattern=NAME_PATTERN),
    Field(description="1-63 of [A-Za-z0-9._-], starting with a letter or digit."),
]
# An id or a name: ids (ID_PATTERN) are names too, so nothing else can name anything.
Ref = Annotated[str, StringConstraints(pattern=NAME_PATTERN), Field(description="An id or a name.")]
# What the guest's agent accepts (protocol/models.py): absolute paths, no NUL anywhere
# (execve and the kernel refuse it), no "=" in an environment variable's name.
GuestPath = Annotated[
    str,
    StringConstraints(pattern=r"^/[^\x00]*$", max_length=4096),
    Field(description="An absolute path in the guest."),
]
_NO_NUL = r"^[^\x00]*$"
#: A volume mount's place in the guest: absolute, normalised, no hidden components.
_MOUNT_PATH = r"^(/[A-Za-z0-9_-][A-Za-z0-9._-]{0,62}){1,16}$"
MountPath = Annotated[
    str,
    StringConstraints(pattern=_MOUNT_PATH),
    Field(description="An absolute guest path to mount a volume at."),
]
MAX_MOUNTS = 16
_MOUNTS_DOC = (
    "Volumes to mount: {guest path: volume id or name}. A volume is outside every "
    "checkpoint: forks share it, a rollback does not undo it."
)
Mounts = Annotated[
    dict[MountPath, Annotated[str, StringConstraints(pattern=NAME_PATTERN)]],
    Field(max_length=MAX_MOUNTS, description=_MOUNTS_DOC),
    # Stated whole (pydantic would say patternProperties, which lets other keys through).
    WithJsonSchema({
        "type": "object", "maxProperties": MAX_MOUNTS, "description": _MOUNTS_DOC,
        "propertyNames": {"pattern": _MOUNT_PATH},
        "additionalProperties": {"type": "string", "pattern": NAME_PATTERN},
    }),
]  # fmt: skip
EnvKey = Annotated[str, StringConstraints(pattern=r"^[^=\x00]+$", max_length=256)]
Env = Annotated[
    dict[EnvKey, Annotated[str, StringConstraints(pattern=_NO_NUL, max_length=65536)]],
    Field(max_length=1024),
    # pydantic states key rules as patternProperties, which leave other keys unchecked
    WithJsonSchema({
        "type": "object",
        "maxProperties": 1024,
        "propertyNames": {"pattern": r"^[^=\x00]+$", "maxLength": 256},
        "additionalProperties": {"type": "string", "pattern": _NO_NUL, "maxLength": 65536},
    }),
]  # fmt: skip
# Exactly what base64.b64decode(validate=True) accepts.
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_Arg = Annotated[str, StringConstraints(pattern=_NO_NUL, max_length=65536)]
_Program = Annotated[str, StringConstraints(pattern=_NO_NUL, min_length=1, max_length=65536)]


def _schema_of(kind: Any) -> dict[str, Any]:
    return TypeAdapter(kind).json_schema()


def _program_named(argv: list[str]) -> list[str]:
    if not argv[0]:
        raise ValueError("the program (the command's first item) cannot be empty")
    return argv


#: An argv list: a program (not empty), then its arguments.
Argv = Annotated[
    list[_Arg],
    Field(min_length=1),
    AfterValidator(_program_named),
    WithJsonSchema(
        {
            "type": "array",
            "minItems": 1,
            "prefixItems": [_schema_of(_Program)],
            "items": _schema_of(_Arg),
        }
    ),
]
Command = Annotated[
    Argv | Annotated[str, StringConstraints(pattern=_NO_NUL, min_length=1, max_length=1 << 20)],
    Field(description="An argv list (run directly) or a string (run by /bin/sh -c)."),
]


def _egress_rule(text: str) -> str:
    try:  # a CIDR's host bits are cleared (10.1.2.3/16 is 10.1.0.0/16): no pattern can tell
        return parse_rule(text)
    except InvalidInput as error:
        raise ValueError(error.message) from None


# What ipaddress.ip_network accepts, stated in the schema (an address, optionally /prefix),
# or a host name: the API fuzzer sends anything a pattern allows.
_V4 = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H = "[0-9a-fA-F]{1,4}"
_EGRESS_PATTERN = (
    rf"^({_V4}(\.{_V4}){{3}}(/(3[0-2]|[12]?[0-9]))?"
    rf"|(({_H}:){{7}}{_H}|({_H}:){{1,7}}:|({_H}:){{1,6}}:{_H}|({_H}:){{1,5}}(:{_H}){{1,2}}"
    rf"|({_H}:){{1,4}}(:{_H}){{1,3}}|({_H}:){{1,3}}(:{_H}){{1,4}}|({_H}:){{1,2}}(:{_H}){{1,5}}"
    rf"|{_H}:(:{_H}){{1,6}}|:((:{_H}){{1,7}}|:))(/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?"
    rf"|{HOST_NAME_REGEX})$"
)

EgressRule = Annotated[
    str,
    StringConstraints(max_length=253),
    AfterValidator(_egress_rule),  # says "not a CIDR" in words, where the pattern would be quoted
    Field(
        description="An IPv4 or IPv6 network, e.g. 10.1.0.0/16 (a bare address: /32, /128), "
        "or a host name (pypi.org; *.example.com: every name under it, not itself), judged by "
        "the name an HTTP or TLS connection asks for.",
        json_schema_extra={"pattern": _EGRESS_PATTERN},
    ),
]
EgressRules = Annotated[tuple[EgressRule, ...], Field(max_length=MAX_EGRESS_RULES)]


def _headers(headers: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    try:
        return {host: dict(fields) for host, fields in parse_headers(headers)}
    except InvalidInput as error:
        raise ValueError(error.message) from None


InjectHeaders = Annotated[
    dict[str, dict[str, str]],
    Field(
        max_length=MAX_HEADER_HOSTS,
        description="Headers set on the guest's plain-HTTP requests to a host, e.g. "
        '{"api.example.com": {"Authorization": "Bearer ..."}} (``*.example.com``: every name '
        "under it; the exact name wins, else the longest match). The values stay on the host: "
        "the guest never sees them, and forkpoint shows only the header names.",
        # What the validator accepts, stated in the schema (the API fuzzer sends anything
        # it allows): host names, 1-16 HTTP field names each, one-line values.
        json_schema_extra={
            "propertyNames": {"pattern": f"^{HOST_NAME_REGEX}$", "maxLength": 253},
            "additionalProperties": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": MAX_HEADERS_PER_HOST,
                "propertyNames": {"pattern": f"^{HEADER_NAME_REGEX}$"},
                "additionalProperties": {
                    "type": "string",
                    "maxLength": MAX_HEADER_VALUE,
                    "pattern": r"^[^\r\n\x00]*$",
                },
            },
        },
    ),
    AfterValidator(_headers),
]


class _Request(BaseModel):
    # Requests reject what they do not know: a misspelt option is an error, not ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


def _distinct(ports: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(ports)) != len(ports):
        raise ValueError("a guest port is listed twice")
    return ports


class CreateSessionRequest(_Request):
    image: Name = "default"
    memory_mib: MemoryMiB = DEFAULT_MEMORY_MIB
    cpus: Cpus = DEFAULT_CPUS
    name: Name | None = None
    ports: Annotated[
        tuple[GuestPort, ...],
        Field(max_length=MAX_PORTS, json_schema_extra={"uniqueItems": True}),
        AfterValidator(_distinct),
    ] = ()
    network: Network = Network.USER
    allow_net: EgressRules = Field(
        default=(),
        description="CIDRs or host names the guest may reach despite the default egress denies.",
    )
    deny_net: EgressRules = Field(
        default=(),
        description="CIDRs or host names the guest may not reach, on top of the default denies.",
    )
    inject_headers: InjectHeaders = Field(default_factory=dict)
    timeout_s: TimeoutS | None = None
    disk_mib: Annotated[int, Field(ge=1, le=MAX_DISK_MIB), _JSON_INTEGER] | None = None
    history: Flag = False  # a checkpoint before every exec and file write (undo)
    history_keep: Annotated[int, Field(ge=1, le=1000), _JSON_INTEGER] = 20  # automatic ones kept
    on_expiry: Expiry = Field(
        default=Expiry.REMOVE, description="What happens when its lifetime ends."
    )
    volumes: Mounts = Field(default_factory=dict)


class PauseRequest(_Request):
    """``keep_memory=False``: keep only the disk; resuming boots the guest anew from it."""

    keep_memory: Flag = True


class EgressRequest(_Request):
    """A session's egress adjustments, replacing the ones it has (empty: the defaults)."""

    allow_net: EgressRules = Field(
        default=(),
        description="CIDRs or host names the guest may reach despite the default egress denies.",
    )
    deny_net: EgressRules = Field(
        default=(),
        description="CIDRs or host names the guest may not reach, on top of the default denies.",
    )
    inject_headers: InjectHeaders = Field(default_factory=dict)


#: What a REST/MCP image build may carry: the Dockerfile and its build context's files.
MAX_DOCKERFILE_BYTES = 1 << 20
MAX_CONTEXT_BYTES = 16 << 20


class ImageBuildRequest(_Request):
    """An image to build: a minimal Debian plus ``packages``, or a ``dockerfile`` (podman)
    with ``files`` as its build context (relative path -> base64 content)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
    packages: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9+.-]{0,99}$")]] = Field(
        default_factory=list, max_length=200, description="Extra Debian packages."
    )
    dockerfile: str | None = Field(
        default=None, max_length=MAX_DOCKERFILE_BYTES,
        description="A Dockerfile (LABEL dev.forkpoint.ready-cmd=... : its service's ready check).",
    )  # fmt: skip
    files: dict[Annotated[str, Field(max_length=4096)], str] = Field(
        default_factory=dict, max_length=10_000,
        description="The Dockerfile's build context: relative path -> base64 content.",
    )  # fmt: skip
    start: Flag = Field(default=True, description="Start the image's CMD in every session.")

    @model_validator(mode="after")
    def _one_source(self) -> ImageBuildRequest:
        if self.dockerfile is not None and self.packages:
            raise PydanticCustomError(
                "bad_build", "packages are for Debian images: RUN apt-get in the Dockerfile"
            )
        if self.dockerfile is None and self.files:
            raise PydanticCustomError("bad_build", "files are a Dockerfile's build context")
        total = 0
        for path, content in self.files.items():
            parts = path.split("/")
            if path.startswith("/") or ".." in parts or "" in parts or "Dockerfile" == path:
                raise PydanticCustomError(
                    "bad_path", "context path {path!r}: relative, no '..'", {"path": path}
                )
            total += len(content) * 3 // 4
        if total > MAX_CONTEXT_BYTES:
            raise PydanticCustomError("too_big", "build context over 16 MiB")
        return self

    def context_files(self) -> dict[str, bytes]:
        """:raises InvalidInput: content that is not base64."""
        try:
            return {
                path: base64.b64decode(data, validate=True) for path, data in self.files.items()
            }
        except ValueError:
            raise InvalidInput("files: every content must be base64") from None


class TimeoutRequest(_Request):
    """A session's new lifetime, from now (0: it ends at once — removed or paused by the
    next expiry round); None: it never expires. ``on_expiry``: what happens then (None:
    as before)."""

    timeout_s: (
        Annotated[
            Number,
            Field(ge=0, le=MAX_TIMEOUT_S, description="Seconds from now; 0: it ends now."),
        ]
        | None
    )
    on_expiry: Expiry | None = None
    keep_memory: Flag | None = Field(
        default=None, description="Whether a pause at its end keeps its memory (None: as before)."
    )


class _ExecBase(_Request):
    command: Command
    cwd: GuestPath | None = None
    env: Env = {}


class ForegroundExecRequest(_ExecBase):
    """Run ``command`` to completion and answer with its result. ``stdin``: text, or
    base64 with ``stdin_encoding: "base64"``."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {
                "properties": {"stdin_encoding": {"const": "base64"}},
                "required": ["stdin_encoding"],
            },
            "then": {
                "properties": {
                    "stdin": {"anyOf": [{"type": "string", "pattern": _BASE64}, {"type": "null"}]}
                }
            },
        }
    )

    background: Annotated[Literal[False], _JSON_FLAG] = False
    stdin: Annotated[str, StringConstraints(max_length=16 << 20)] | None = None
    stdin_encoding: OutputEncoding = "text"
    timeout: Annotated[Number, Field(gt=0, le=7 * 86400, description="Seconds.")] | None = None
    output_encoding: OutputEncoding = Field(
        default="text", description="How stdout/stderr are returned: UTF-8 text (lossy) or base64."
    )

    @model_validator(mode="after")
    def _stdin_decodes(self) -> ForegroundExecRequest:
        if self.stdin is not None and self.stdin_encoding == "base64":
            if not re.fullmatch(_BASE64, self.stdin):
                raise ValueError("stdin is not valid base64")
        return self

    def stdin_bytes(self) -> bytes | None:
        """``stdin`` decoded."""
        if self.stdin is None:
            return None
        if self.stdin_encoding == "base64":
            return base64.b64decode(self.stdin, validate=True)
        return self.stdin.encode()


class BackgroundExecRequest(_ExecBase):
    """Start ``command`` detached and answer at once (no stdin, no timeout)."""

    background: Annotated[Literal[True], _JSON_FLAG]


def _exec_kind(value: Any) -> str:
    """The union's branch; anything but an object goes to foreground, which rejects it."""
    if isinstance(value, dict):
        background = value.get("background")
    else:
        background = getattr(value, "background", None)
    return "background" if background is True else "foreground"


ExecRequest = Annotated[
    Annotated[ForegroundExecRequest, Tag("foreground")]
    | Annotated[BackgroundExecRequest, Tag("background")],
    Discriminator(_exec_kind),
]


class PortRequest(_Request):
    guest_port: GuestPort


class CheckpointRequest(_Request):
    name: Name | None = None


class ForkRequest(_Request):
    count: ForkCount = 1
    spread: Flag = Field(
        default=False,
        description="On a cluster: spread the forks over as many nodes as Ray can, instead "
        "of packing them on as few as hold them. One host: no effect.",
    )


S3Url = Annotated[
    str,
    StringConstraints(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\x00]{0,900})?$"),
    Field(description="s3://BUCKET or s3://BUCKET/PREFIX."),
]
# What a pushed checkpoint is known by: its digest, or a ref (an id or a name).
PortableRef = Annotated[
    str,
    StringConstraints(pattern=r"^(sha256:)?[0-9a-f]{64}$|" + NAME_PATTERN),
    Field(description="sha256:<digest>, or the id or name it was pushed under."),
]


class PushRequest(_Request):
    """Upload the checkpoint to ``to``. Endpoint and credentials are the server's own (its
    AWS variables): a client cannot point the server at another host."""

    to: S3Url


class PullRequest(_Request):
    """Download checkpoint ``ref`` from ``from`` into this home."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    ref: PortableRef
    source: S3Url = Field(alias="from")


class RollbackRequest(_Request):
    checkpoint: Ref | None = None


class RollbackPreviewRequest(_Request):
    """What ``rollback`` to ``checkpoint`` would undo (``patch``: small text diffs)."""

    checkpoint: Ref | None = None
    patch: Flag = False


class DiffRequest(_Request):
    """``a`` and ``b``: checkpoints or sessions (``b`` None: see ``Runtime.diff``)."""

    a: Ref
    b: Ref | None = None
    patch: Flag = False
    include_tmp: Flag = False
    exclude: Annotated[tuple[GuestPath, ...], Field(max_length=64)] = ()


#: A guest user name (what the agent accepts: a POSIX login name).
GuestUser = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_-]{0,31}\$?$")]
_PtyCols = Annotated[int, Field(ge=1, le=1000, description="Columns."), _JSON_INTEGER]
_PtyRows = Annotated[int, Field(ge=1, le=1000, description="Rows."), _JSON_INTEGER]
#: What a terminal runs unless told otherwise: an interactive login shell (as E2B's does).
DEFAULT_TERMINAL_COMMAND = ("/bin/bash", "-i", "-l")


class TerminalRequest(_Request):
    """A terminal: ``command`` (default: an interactive login shell) on a new PTY of
    ``cols`` × ``rows``, as ``user`` (default root), in ``cwd`` (default its home)."""

    cols: _PtyCols = 80
    rows: _PtyRows = 24
    command: Argv = list(DEFAULT_TERMINAL_COMMAND)
    cwd: GuestPath | None = None
    env: Env = {}
    user: GuestUser | None = None


class TerminalInputRequest(_Request):
    """Bytes typed into a terminal (base64)."""

    data: Annotated[str, StringConstraints(pattern=_BASE64, max_length=1 << 20)]


class TerminalSizeRequest(_Request):
    cols: _PtyCols
    rows: _PtyRows


class WatchRequest(_Request):
    """Watch directory ``path`` (``recursive``: its subdirectories too, also new ones;
    ``entries``: each event carries the path's entry)."""

    path: GuestPath
    recursive: Flag = False
    entries: Flag = False


VolumePath = Annotated[
    str,
    StringConstraints(pattern=_NO_NUL, min_length=1, max_length=4096),
    Field(description="A path in the volume (relative to its root; `..` stays inside)."),
]
FileMode = Annotated[
    int, Field(ge=0, le=0o7777, description="Permission bits (e.g. 420 = 0o644)."),
    _JSON_INTEGER,
]  # fmt: skip
#: The largest uid or gid (2**32 - 1 means "no change" to chown).
MAX_OWNER_ID = 2**32 - 2
OwnerId = Annotated[int, Field(ge=0, le=MAX_OWNER_ID, description="A uid or gid."), _JSON_INTEGER]
# base64 of at most MAX_VOLUME_FILE_BYTES bytes.
_VOLUME_DATA_CHARS = 4 * -(-MAX_VOLUME_FILE_BYTES // 3)


class CreateVolumeRequest(_Request):
    name: Name


class VolumePathRequest(_Request):
    path: VolumePath


class VolumeEntriesRequest(_Request):
    """The entries below directory ``path``, ``depth`` levels deep."""

    path: VolumePath = "/"
    # A query string: its values arrive as text, so numbers are read from it (not strict).
    depth: Annotated[int, Field(ge=1, le=MAX_LIST_DEPTH)] = 1


class VolumeWriteRequest(_Request):
    """Write ``data`` (base64) to file ``path``, whose directory must exist; ``force``
    replaces an existing file."""

    path: VolumePath
    data: Annotated[str, StringConstraints(pattern=_BASE64, max_length=_VOLUME_DATA_CHARS)]
    force: Flag = False
    mode: FileMode | None = None
    uid: OwnerId | None = None
    gid: OwnerId | None = None

    def content(self) -> bytes:
        return base64.b64decode(self.data, validate=True)


class VolumeDirRequest(_Request):
    """Make directory ``path``; ``force``: its parents too, and an existing one is fine."""

    path: VolumePath
    force: Flag = False
    mode: FileMode | None = None
    uid: OwnerId | None = None
    gid: OwnerId | None = None


class VolumeMetadataRequest(_Request):
    path: VolumePath
    mode: FileMode | None = None
    uid: OwnerId | None = None
    gid: OwnerId | None = None


class WatcherEventsRequest(_Request):
    """``wait``: with no change yet, wait up to this many seconds for the first."""

    wait: Annotated[Number, Field(ge=0, le=60)] = 0.0


class MetricsRequest(_Request):
    """The samples taken from ``start`` to ``end`` (ISO 8601; without a zone: UTC; either
    may be left out)."""

    start: Instant | None = None
    end: Instant | None = None


# SQLite's INTEGER is 64-bit signed: a larger event id cannot exist, nor be asked for.
MAX_EVENT_ID = 2**63 - 1


class EventsRequest(_Request):
    """The events after event ``after`` (of one ``session``, if given), at most ``limit``;
    with none yet, wait up to ``wait`` seconds for the first."""

    # A query string: its values arrive as text, so numbers are read from it (not strict).
    after: Annotated[int, Field(ge=0, le=MAX_EVENT_ID)] = 0
    session: Ref | None = None
    wait: Annotated[float, Field(ge=0, le=60)] = 0.0
    limit: Annotated[int, Field(ge=1, le=1000)] = 100


class UndoRequest(_Request):
    steps: Annotated[int, Field(ge=1, le=1000), _JSON_INTEGER] = 1


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], **fields: Any) -> M:
    """``model(**fields)``, or :class:`~forkpoint.errors.InvalidInput` saying in one line
    what is wrong."""
    try:
        return model(**fields)
    except ValidationError as error:
        raise InvalidInput(describe_invalid(error.errors())) from error


# Parts of an error's location that name no field: the body itself, a union's tag or
# branch ("foreground", "list[constrained-str]", "function-after[...]").
_NOT_A_FIELD = re.compile(r"^(body|foreground|background|[a-z-]+\[.*\]|constrained-\w+|str)$")


def describe_invalid(problems: Iterable[Mapping[str, Any]]) -> str:
    """One line from pydantic's error list: ``memory_mib: Input should be ≥ 128; …``."""
    parts = []
    for item in list(problems)[:5]:
        if item.get("type") == "json_invalid":
            detail = (item.get("ctx") or {}).get("error", "")
            return f"malformed JSON body: {detail}".rstrip(": ")
        loc = ".".join(str(p) for p in item.get("loc", ()) if not _NOT_A_FIELD.match(str(p)))
        parts.append(f"{loc}: {item.get('msg', 'invalid')}" if loc else str(item.get("msg")))
    return "; ".join(parts) or "invalid request"
