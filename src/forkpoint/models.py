"""forkpoint's data model: one type per concept, and every limit, defined once.

These are the values users see. The runtime returns them, the REST API declares them as
its response types, the CLI prints them with ``--json``, MCP tools return them, and the SDK
parses its responses into them. Guest-side values that cross the agent protocol unchanged
(a process, a directory entry, a started background process) are the
:mod:`forkpoint.protocol` dataclasses, re-exported here under their public names. The
request bodies, with these limits as validation rules, are :mod:`forkpoint.requests`.

Frozen standard-library dataclasses, not pydantic models, on purpose: importing this
module costs next to nothing, so ``forkpoint ls --json`` stays fast (pydantic alone takes
longer to import than the whole command may). pydantic validates and serialises these
dataclasses wherever it is already loaded (REST, SDK, MCP).
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from forkpoint.protocol.models import DirEntry as FileEntry
    from forkpoint.protocol.models import ProcessInfo as Process
    from forkpoint.protocol.models import SpawnResult as BackgroundProcess
    from forkpoint.protocol.models import StatResult as FileStat

# The guest-protocol values are loaded on first use: the protocol package costs more to
# import than `forkpoint ls --json` may take, and `ls` needs none of them.
_FROM_PROTOCOL = {
    "FileEntry": "DirEntry",
    "Process": "ProcessInfo",
    "BackgroundProcess": "SpawnResult",
    "FileStat": "StatResult",
}


def __getattr__(name: str) -> Any:
    if name in _FROM_PROTOCOL:
        from forkpoint.protocol import models

        return getattr(models, _FROM_PROTOCOL[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ID_PATTERN",
    "MAX_CPUS",
    "MAX_FORKS",
    "MAX_MEMORY_MIB",
    "MAX_PORTS",
    "MIN_MEMORY_MIB",
    "NAME_PATTERN",
    "BackgroundProcess",
    "Checkpoint",
    "CheckpointKind",
    "CommandResult",
    "ErrorDetail",
    "ErrorResponse",
    "FileEntry",
    "FileStat",
    "Health",
    "Network",
    "OutputEncoding",
    "Port",
    "Process",
    "ProcessEvent",
    "ProcessEventKind",
    "Session",
    "SessionState",
    "TrackedProcess",
    "to_json_data",
]

# -- limits ----------------------------------------------------------------------------

MIN_MEMORY_MIB, MAX_MEMORY_MIB = 128, 65536  # guest RAM
MAX_CPUS = 64
MAX_FORKS = 64  # sessions one fork call may start
MAX_PORTS = 64  # guest ports forwarded at create
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
ID_PATTERN = r"^[sc]-[0-9a-f]{10}$"  # names may not look like this (ids and names share refs)

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


@dataclass(frozen=True)
class Port:
    """A guest port forwarded to ``127.0.0.1:host_port`` on the host (never elsewhere).
    ``url`` is always ``http://127.0.0.1:<host_port>`` (derived, whatever is passed)."""

    guest_port: int
    host_port: int
    url: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", f"http://127.0.0.1:{self.host_port}")


@dataclass(frozen=True)
class Session:
    """One session (one microVM). ``id`` is stable across rollbacks; ``created_at`` is
    ISO-8601 UTC (``2026-05-01T12:00:00.123Z``); ``parent_checkpoint`` is the checkpoint
    it was last restored from."""

    id: str
    name: str | None
    image: str
    state: SessionState
    created_at: str
    parent_checkpoint: str | None
    memory_mib: int
    cpus: int
    network: Network
    ports: tuple[Port, ...] = ()

    def port(self, guest_port: int) -> Port | None:
        """The forward of ``guest_port``, if there is one."""
        return next((p for p in self.ports if p.guest_port == guest_port), None)


@dataclass(frozen=True)
class Checkpoint:
    """An immutable checkpoint: memory, device state and disk of a session at one moment.
    ``pause_ms``: how long the VM was paused; ``guest_ports``: what its forks forward."""

    id: str
    session_id: str
    name: str | None
    kind: CheckpointKind
    created_at: str
    parent_checkpoint: str | None
    image: str
    size_bytes: int
    duration_ms: float
    pause_ms: float
    guest_ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class CommandResult:
    """A finished command. ``exit_code`` is 128+N when killed by signal N (``signal``).

    ``stdout``/``stderr`` are UTF-8 text (undecodable bytes replaced) when ``encoding`` is
    ``text``, or the exact bytes in base64; ``stdout_bytes``/``stderr_bytes`` are always
    the exact bytes (the SDK fetches base64 and hands out text with the bytes kept).
    Each stream keeps at most 1 MiB (``truncated`` says more was produced).
    """

    exit_code: int
    stdout: str
    stderr: str
    duration_ms: float
    signal: int | None = None
    encoding: OutputEncoding = "text"
    truncated: bool = False
    pid: int = 0

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
        object.__setattr__(result, "_raw", (stdout, stderr))  # not a field: never serialised
        return result

    def as_text(self) -> CommandResult:
        """The same result with text output; ``stdout_bytes`` stay exact."""
        raw = self.stdout_bytes, self.stderr_bytes
        text = replace(
            self, stdout=raw[0].decode("utf-8", "replace"),
            stderr=raw[1].decode("utf-8", "replace"), encoding="text",
        )  # fmt: skip
        object.__setattr__(text, "_raw", raw)
        return text

    def _bytes(self, index: int, text: str) -> bytes:
        raw: tuple[bytes, bytes] | None = getattr(self, "_raw", None)
        if raw is not None:
            return raw[index]
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


ProcessEventKind = Literal["start", "stdout", "stderr", "end"]


@dataclass(frozen=True)
class ProcessEvent:
    """One event of a process started with ``Runtime.start_process``: ``start`` (first,
    with the pid), ``stdout``/``stderr`` chunks (``data``), then ``end``: ``exit_code``
    (128+N when signal N killed it, then ``signal`` is N) and ``error`` as Go's
    ``exec.ExitError`` words it ("exit status 3", "signal: killed"; None for exit 0)."""

    kind: ProcessEventKind
    pid: int
    data: bytes = b""
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class TrackedProcess:
    """A process started with ``Runtime.start_process``: ``cmd`` the executable, ``args``
    its arguments, ``env`` the per-call environment it was given; ``exit_code`` once it
    ended (``running`` False)."""

    pid: int
    cmd: str
    args: tuple[str, ...]
    cwd: str
    env: tuple[tuple[str, str], ...]
    tag: str | None
    running: bool
    exit_code: int | None


@dataclass(frozen=True)
class ErrorDetail:
    """A :class:`~forkpoint.errors.ForkpointError` on the wire: its ``code``, one-line
    ``message`` and the structured fields of its class (None when they do not apply)."""

    code: str
    message: str
    log_tail: str | None = None
    command: str | None = None
    timeout_s: float | None = None
    package: str | None = None


@dataclass(frozen=True)
class ErrorResponse:
    """Every error body of the REST API, and a failed fork's slot."""

    error: ErrorDetail

    @classmethod
    def of(cls, error: Any) -> ErrorResponse:
        """From a :class:`~forkpoint.errors.ForkpointError`."""
        return cls(ErrorDetail(**error.to_dict()))


@dataclass(frozen=True)
class Health:
    status: str
    version: str


def to_json_data(value: Any) -> Any:
    """``value`` (these values, lists/tuples of them, dicts, enums) as plain JSON data."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_json_data(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_json_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_data(v) for v in value]
    return value
