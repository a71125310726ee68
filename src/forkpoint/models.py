"""forkpoint's data model: one type per concept, and every limit, defined once.

These are the values users see. The runtime returns them, the REST API declares them as
``response_model`` and request bodies, the CLI prints them with ``--json``, MCP tools
return them, and the SDK parses its responses into them. Guest-side values that cross
the agent protocol unchanged (a process, a directory entry, a started background
process) are the :mod:`forkpoint.protocol` dataclasses, re-exported here under their
public names; pydantic validates and serialises them like the models below.

Light on purpose: pydantic and the standard library only, so ``import forkpoint.sdk``
stays fast and loads no runtime, VM or store code.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    model_validator,
)

from forkpoint.errors import InvalidInput
from forkpoint.protocol import DirEntry as FileEntry
from forkpoint.protocol import ProcessInfo as Process
from forkpoint.protocol import SpawnResult as BackgroundProcess

__all__ = [
    "ID_PATTERN",
    "MAX_FORKS",
    "MAX_PORTS",
    "NAME_PATTERN",
    "BackgroundProcess",
    "Checkpoint",
    "CheckpointKind",
    "CheckpointRequest",
    "CommandResult",
    "Cpus",
    "CreateSessionRequest",
    "ErrorDetail",
    "ErrorResponse",
    "ExecRequest",
    "FileEntry",
    "ForkRequest",
    "GuestPort",
    "Health",
    "MemoryMiB",
    "Name",
    "Network",
    "OutputEncoding",
    "Port",
    "PortRequest",
    "Process",
    "Ref",
    "RollbackRequest",
    "Session",
    "SessionState",
    "describe_invalid",
    "parse",
]

# -- limits ----------------------------------------------------------------------------

MAX_FORKS = 64  # sessions one fork call may start
MAX_PORTS = 64  # guest ports forwarded at create
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
ID_PATTERN = r"^[sc]-[0-9a-f]{10}$"  # names may not look like this (ids and names share refs)

GuestPort = Annotated[int, Field(ge=1, le=65535, description="A TCP port inside the guest.")]
MemoryMiB = Annotated[int, Field(ge=128, le=65536, description="Guest RAM in MiB.")]
Cpus = Annotated[int, Field(ge=1, le=64, description="Virtual CPUs.")]
Name = Annotated[
    str,
    StringConstraints(pattern=NAME_PATTERN),
    Field(description="1-63 of [A-Za-z0-9._-], starting with a letter or digit."),
]
Ref = Annotated[str, StringConstraints(min_length=1, max_length=128)]  # an id or a name
GuestPath = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
EnvKey = Annotated[str, StringConstraints(min_length=1, max_length=256)]
OutputEncoding = Literal["text", "base64"]


# -- states ----------------------------------------------------------------------------


class SessionState(StrEnum):
    """Lifecycle of a session. ``crashed``: its QEMU died without being asked to."""

    CREATING = "creating"
    RUNNING = "running"
    STOPPED = "stopped"
    CRASHED = "crashed"


class Network(StrEnum):
    """Guest networking: ``user`` (outbound + forwards) or ``none`` (a NIC with nothing
    behind it)."""

    USER = "user"
    NONE = "none"


class CheckpointKind(StrEnum):
    """``user``: made on request; ``template``: an image booted to "agent ready"."""

    USER = "user"
    TEMPLATE = "template"


# -- values ----------------------------------------------------------------------------


class _Value(BaseModel):
    # Frozen values; unknown fields from a newer server are ignored, not an error.
    model_config = ConfigDict(frozen=True, extra="ignore")


class Port(_Value):
    """A guest port forwarded to ``127.0.0.1:host_port`` on the host (never elsewhere)."""

    guest_port: int
    host_port: int
    url: str = Field(default="", description="Always http://127.0.0.1:<host_port>.")

    @model_validator(mode="before")
    @classmethod
    def _derive_url(cls, data: Any) -> Any:
        if isinstance(data, dict) and "host_port" in data:
            return {**data, "url": f"http://127.0.0.1:{data['host_port']}"}
        return data


class Session(_Value):
    """One session (one microVM). ``id`` is stable across rollbacks."""

    id: str
    name: str | None
    image: str
    state: SessionState
    created_at: str = Field(description="ISO-8601 UTC, e.g. 2026-05-01T12:00:00.123Z.")
    parent_checkpoint: str | None = Field(description="The checkpoint it was restored from.")
    ports: tuple[Port, ...] = ()
    memory_mib: int
    cpus: int
    network: Network

    def port(self, guest_port: int) -> Port | None:
        """The forward of ``guest_port``, if there is one."""
        return next((p for p in self.ports if p.guest_port == guest_port), None)


class Checkpoint(_Value):
    """An immutable checkpoint: memory, device state and disk of a session at one moment."""

    id: str
    session_id: str
    name: str | None
    kind: CheckpointKind
    created_at: str
    parent_checkpoint: str | None
    image: str
    size_bytes: int
    duration_ms: float
    pause_ms: float = Field(description="How long the VM was paused.")
    guest_ports: tuple[int, ...] = Field(default=(), description="Guest ports its forks forward.")


class CommandResult(_Value):
    """A finished command. ``exit_code`` is 128+N when killed by signal N (``signal``).

    ``stdout``/``stderr`` are UTF-8 text (undecodable bytes replaced) when ``encoding`` is
    ``text``, or the exact bytes in base64; ``stdout_bytes``/``stderr_bytes`` are always
    the exact bytes (the SDK fetches base64 and hands out text with the bytes kept).
    Each stream keeps at most 1 MiB (``truncated`` says more was produced).
    """

    exit_code: int
    signal: int | None = None
    stdout: str
    stderr: str
    encoding: OutputEncoding = "text"
    truncated: bool = False
    duration_ms: float
    pid: int = 0
    _raw: tuple[bytes, bytes] | None = PrivateAttr(default=None)

    @classmethod
    def of(
        cls,
        *,
        exit_code: int,
        signal: int | None,
        stdout: bytes,
        stderr: bytes,
        truncated: bool,
        duration_ms: float,
        pid: int,
        encoding: OutputEncoding = "text",
    ) -> CommandResult:
        """The result of a command whose output was these bytes."""

        def encode(data: bytes) -> str:
            if encoding == "base64":
                return base64.b64encode(data).decode()
            return data.decode("utf-8", "replace")

        result = cls(
            exit_code=exit_code, signal=signal, stdout=encode(stdout), stderr=encode(stderr),
            encoding=encoding, truncated=truncated, duration_ms=round(duration_ms, 1), pid=pid,
        )  # fmt: skip
        result._raw = (stdout, stderr)
        return result

    def as_text(self) -> CommandResult:
        """The same result with text output; ``stdout_bytes`` stay exact."""
        fields = self.model_dump(exclude={"stdout", "stderr", "encoding"})
        return CommandResult.of(**fields, stdout=self.stdout_bytes, stderr=self.stderr_bytes)

    def _bytes(self, index: int, text: str) -> bytes:
        if self._raw is not None:
            return self._raw[index]
        return base64.b64decode(text) if self.encoding == "base64" else text.encode()

    @property
    def stdout_bytes(self) -> bytes:
        return self._bytes(0, self.stdout)

    @property
    def stderr_bytes(self) -> bytes:
        return self._bytes(1, self.stderr)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class ErrorDetail(_Value):
    """A :class:`~forkpoint.errors.ForkpointError` on the wire: its ``code``, one-line
    ``message`` and the structured fields of its class (absent when they do not apply)."""

    code: str
    message: str
    log_tail: str | None = None
    command: str | None = None
    timeout_s: float | None = None
    package: str | None = None


class ErrorResponse(_Value):
    """Every error body of the REST API, and a failed fork's slot."""

    error: ErrorDetail


class Health(_Value):
    status: str
    version: str


# -- requests --------------------------------------------------------------------------


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
    count: Annotated[int, Field(ge=1, le=MAX_FORKS)] = 1


class RollbackRequest(_Request):
    checkpoint: Ref | None = None


# -- checking input --------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], **fields: Any) -> M:
    """``model(**fields)``, or :class:`~forkpoint.errors.InvalidInput` saying in one line
    what is wrong (the runtime checks its arguments with the request models, so every
    interface enforces the same limits)."""
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
