"""Values of guest commands and processes: a finished command, a started process's events,
a process the agent tracks. Part of :mod:`forkpoint.models` (import them from there)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal

from forkpoint.models import OutputEncoding

__all__ = ["CommandResult", "ProcessEvent", "ProcessEventKind", "TrackedProcess"]


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
        return CommandResult.of(
            exit_code=self.exit_code, signal=self.signal, stdout=self.stdout_bytes,
            stderr=self.stderr_bytes, truncated=self.truncated, duration_ms=self.duration_ms,
            pid=self.pid,
        )  # fmt: skip

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


ProcessEventKind = Literal["start", "stdout", "stderr", "pty", "end"]


@dataclass(frozen=True)
class ProcessEvent:
    """One event of a process started with ``Runtime.start_process``: ``start`` (first,
    with the pid), ``stdout``/``stderr`` chunks (``data``; ``pty`` for a process on a
    PTY: its terminal's output), then ``end``: ``exit_code``
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
    pty: bool = False
