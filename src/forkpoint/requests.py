"""The request bodies of the REST API, with every limit of :mod:`forkpoint.models` as a
validation rule — and :func:`parse`, which the runtime uses to check its own arguments,
so every interface (REST, CLI, SDK, MCP) enforces exactly the same limits.

pydantic models: they are what FastAPI reads request bodies into and documents in the
OpenAPI spec. Imported only where input is checked (not by ``forkpoint ls``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from forkpoint.errors import InvalidInput
from forkpoint.models import (
    MAX_CPUS,
    MAX_DISK_MIB,
    MAX_EGRESS_RULES,
    MAX_FORKS,
    MAX_MEMORY_MIB,
    MAX_PORTS,
    MAX_TIMEOUT_S,
    MIN_MEMORY_MIB,
    NAME_PATTERN,
    Network,
    OutputEncoding,
)

__all__ = [
    "Cidr",
    "CheckpointRequest",
    "Cpus",
    "CreateSessionRequest",
    "ExecRequest",
    "ForkCount",
    "ForkRequest",
    "GuestPort",
    "MemoryMiB",
    "Name",
    "PortRequest",
    "Ref",
    "DiffRequest",
    "RollbackPreviewRequest",
    "UndoRequest",
    "RollbackRequest",
    "TimeoutRequest",
    "TimeoutS",
    "describe_invalid",
    "parse",
]

GuestPort = Annotated[int, Field(ge=1, le=65535, description="A TCP port inside the guest.")]
MemoryMiB = Annotated[
    int, Field(ge=MIN_MEMORY_MIB, le=MAX_MEMORY_MIB, description="Guest RAM in MiB.")
]
Cpus = Annotated[int, Field(ge=1, le=MAX_CPUS, description="Virtual CPUs.")]
TimeoutS = Annotated[
    float,
    Field(gt=0, le=MAX_TIMEOUT_S, description="Seconds until the session is removed."),
]
ForkCount = Annotated[int, Field(ge=1, le=MAX_FORKS, description="Sessions to start.")]
Name = Annotated[
    str,
    StringConstraints(pattern=NAME_PATTERN),
    Field(description="1-63 of [A-Za-z0-9._-], starting with a letter or digit."),
]
Ref = Annotated[str, StringConstraints(min_length=1, max_length=128)]  # an id or a name
GuestPath = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
EnvKey = Annotated[str, StringConstraints(min_length=1, max_length=256)]


def _cidr(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_network(text.strip()))
    except ValueError as error:
        raise ValueError(f"{text!r} is not a CIDR ({error})") from None


Cidr = Annotated[
    str,
    StringConstraints(max_length=64),
    AfterValidator(_cidr),
    Field(description="An IPv4 or IPv6 network, e.g. 10.1.0.0/16 (a bare address: /32, /128)."),
]
EgressRules = Annotated[tuple[Cidr, ...], Field(max_length=MAX_EGRESS_RULES)]


class _Request(BaseModel):
    # Requests reject what they do not know: a misspelt option is an error, not ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class CreateSessionRequest(_Request):
    image: Name = "default"
    memory_mib: MemoryMiB = 512
    cpus: Cpus = 1
    name: Name | None = None
    ports: Annotated[tuple[GuestPort, ...], Field(max_length=MAX_PORTS)] = ()
    network: Network = Network.USER
    allow_net: EgressRules = Field(
        default=(), description="CIDRs the guest may reach despite the default egress denies."
    )
    deny_net: EgressRules = Field(
        default=(), description="CIDRs the guest may not reach, on top of the default denies."
    )
    timeout_s: TimeoutS | None = None
    disk_mib: Annotated[int, Field(ge=1, le=MAX_DISK_MIB)] | None = None
    history: bool = False  # a checkpoint before every exec and file write (undo)
    history_keep: Annotated[int, Field(ge=1, le=1000)] = 20  # automatic checkpoints kept


class TimeoutRequest(_Request):
    """A session's new lifetime, from now; None: it never expires."""

    timeout_s: TimeoutS | None


class ExecRequest(_Request):
    """``command``: an argv list (run directly) or a string (run by ``/bin/sh -c``)."""

    command: (
        Annotated[list[Annotated[str, StringConstraints(max_length=65536)]], Field(min_length=1)]
        | Annotated[str, StringConstraints(min_length=1, max_length=1 << 20)]
    )
    cwd: GuestPath | None = None
    env: Annotated[
        dict[EnvKey, Annotated[str, StringConstraints(max_length=65536)]], Field(max_length=1024)
    ] = {}
    stdin: Annotated[str, StringConstraints(max_length=16 << 20)] | None = None
    stdin_encoding: OutputEncoding = "text"
    timeout: Annotated[float, Field(gt=0, le=7 * 86400, description="Seconds.")] | None = None
    background: bool = False
    output_encoding: OutputEncoding = Field(
        default="text", description="How stdout/stderr are returned: UTF-8 text (lossy) or base64."
    )


class PortRequest(_Request):
    guest_port: GuestPort


class CheckpointRequest(_Request):
    name: Name | None = None


class ForkRequest(_Request):
    count: ForkCount = 1


class RollbackRequest(_Request):
    checkpoint: Ref | None = None


class RollbackPreviewRequest(_Request):
    """What ``rollback`` to ``checkpoint`` would undo (``patch``: small text diffs)."""

    checkpoint: Ref | None = None
    patch: bool = False


class DiffRequest(_Request):
    """``a`` and ``b``: checkpoints or sessions (``b`` None: see ``Runtime.diff``)."""

    a: Ref
    b: Ref | None = None
    patch: bool = False
    include_tmp: bool = False
    exclude: Annotated[tuple[GuestPath, ...], Field(max_length=64)] = ()


class UndoRequest(_Request):
    steps: Annotated[int, Field(ge=1, le=1000)] = 1


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], **fields: Any) -> M:
    """``model(**fields)``, or :class:`~forkpoint.errors.InvalidInput` saying in one line
    what is wrong."""
    try:
        return model(**fields)
    except ValidationError as error:
        raise InvalidInput(describe_invalid(error.errors())) from error


def describe_invalid(problems: Iterable[Mapping[str, Any]]) -> str:
    """One line from pydantic's error list: ``memory_mib: Input should be ≥ 128; …``."""
    parts = []
    for item in list(problems)[:5]:
        if item.get("type") == "json_invalid":
            detail = (item.get("ctx") or {}).get("error", "")
            return f"malformed JSON body: {detail}".rstrip(": ")
        loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {item.get('msg', 'invalid')}" if loc else str(item.get("msg")))
    return "; ".join(parts) or "invalid request"
