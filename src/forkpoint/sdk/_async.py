"""The async SDK core: :class:`AsyncSandbox` and :class:`AsyncCheckpoint`.

Every method is one backend call (embedded runtime or REST); nothing is orchestrated
here. Errors are :mod:`forkpoint.errors` classes, whichever backend is in use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, overload

from forkpoint.errors import ForkpointError, InvalidInput
from forkpoint.runtime import Runtime

from ._backend import JSON, Backend, connect

__all__ = [
    "AsyncCheckpoint",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncPorts",
    "AsyncSandbox",
    "BackgroundProcess",
    "CommandResult",
    "FileEntry",
    "Process",
]


@dataclass(frozen=True)
class CommandResult:
    """A finished command. ``exit_code`` is 128+N when killed by signal N (``signal``).

    Output is capped at 1 MiB per stream (``truncated``); ``stdout``/``stderr`` are the
    UTF-8 text (undecodable bytes replaced), ``*_bytes`` the exact bytes.
    """

    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    duration_ms: float
    signal: int | None = None
    truncated: bool = False
    pid: int = 0

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class BackgroundProcess:
    """A detached process: it keeps running across checkpoints, forks and rollbacks.
    Its stdout and stderr go to the guest file ``log_path``."""

    pid: int
    log_path: str


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    cmd: str


@dataclass(frozen=True)
class FileEntry:
    """``type``: file, dir, symlink or other; ``size`` in bytes; ``mtime_ns`` since epoch."""

    name: str
    type: str
    size: int
    mode: int
    mtime_ns: int


class AsyncCommands:
    """``sb.commands``: run commands and manage processes in the guest."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    @overload
    async def run(
        self, cmd: str | Sequence[str], background: Literal[False] = ..., *,
        cwd: str | None = ..., env: Mapping[str, str] | None = ...,
        timeout: float | None = ..., stdin: bytes | str | None = ...,
    ) -> CommandResult: ...  # fmt: skip
    @overload
    async def run(
        self, cmd: str | Sequence[str], background: Literal[True], *,
        cwd: str | None = ..., env: Mapping[str, str] | None = ...,
        timeout: float | None = ..., stdin: bytes | str | None = ...,
    ) -> BackgroundProcess: ...  # fmt: skip
    async def run(
        self,
        cmd: str | Sequence[str],
        background: bool = False,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
    ) -> CommandResult | BackgroundProcess:
        """Run ``cmd`` (a shell string, or an argv list) in the guest.

        Waits for it and returns a :class:`CommandResult` (a non-zero exit is not an
        error), or with ``background=True`` starts it detached and returns at once.
        ``timeout`` in seconds. :raises CommandTimeout: past ``timeout`` (it is killed).
        :raises NotFound: no such command or cwd.
        """
        backend, sid = self._sb._backend, self._sb.id
        if background:
            if timeout is not None or stdin is not None:
                raise InvalidInput("timeout and stdin do not apply to a background command")
            r = await backend.spawn(sid, cmd, cwd=cwd, env=env)
            return BackgroundProcess(pid=int(r["pid"]), log_path=str(r["log_path"]))
        data = stdin.encode() if isinstance(stdin, str) else stdin
        r = await backend.exec(sid, cmd, cwd=cwd, env=env, stdin=data, timeout=timeout)
        return CommandResult(
            exit_code=int(r["exit_code"]), stdout_bytes=r["stdout"], stderr_bytes=r["stderr"],
            duration_ms=float(r["duration_ms"]), signal=r.get("signal"),
            truncated=bool(r.get("truncated")), pid=int(r.get("pid", 0)),
        )  # fmt: skip

    async def ps(self) -> list[Process]:
        """Processes in the guest (kernel threads left out), by pid."""
        return [Process(**p) for p in await self._sb._backend.ps(self._sb.id)]

    async def kill(self, pid: int, signal: int | str = "TERM") -> None:
        """Send ``signal`` (a number or a name like "KILL") to ``pid``. :raises NotFound:"""
        await self._sb._backend.kill_process(self._sb.id, pid, signal)


class AsyncFiles:
    """``sb.files``: the guest's filesystem. Paths are absolute guest paths."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def read(self, path: str) -> bytes:
        """The file's bytes. :raises NotFound: :raises InvalidInput: not a regular file."""
        return await self._sb._backend.read_file(self._sb.id, path)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write (atomically replace) a file; parent directories are created."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await self._sb._backend.write_file(self._sb.id, path, payload, mode)

    async def list(self, path: str) -> list[FileEntry]:
        """Entries of a directory, sorted by name."""
        return [FileEntry(**e) for e in await self._sb._backend.list_files(self._sb.id, path)]

    async def remove(self, path: str) -> None:
        """Remove a file, symlink or whole directory tree. :raises NotFound:"""
        await self._sb._backend.remove_file(self._sb.id, path)


class AsyncPorts:
    """``sb.ports``: guest ports forwarded to the host's 127.0.0.1."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def forward(self, guest_port: int) -> str:
        """Forward ``guest_port``; returns its ``http://127.0.0.1:PORT`` URL (idempotent)."""
        info = await self._sb._backend.forward_port(self._sb.id, guest_port)
        await self._sb.refresh()
        return str(info["url"])

    def url(self, guest_port: int) -> str | None:
        """The URL of an already forwarded guest port (forks get their own), else None."""
        for port in self._sb.info.get("ports", []):
            if port["guest_port"] == guest_port:
                return str(port["url"])
        return None


class AsyncSandbox:
    """One forkpoint session (a microVM). Make one with :meth:`create` or :meth:`connect`.

    Without ``base_url`` the SDK runs forkpoint in-process (embedded); with
    ``base_url="unix:/path"`` or ``"http://127.0.0.1:PORT"`` it uses ``forkpoint serve``.
    Use as ``async with`` to kill the session on exit. Release the connection with
    :meth:`close` (or :meth:`kill`) when done.
    """

    def __init__(self, backend: Backend, info: JSON) -> None:
        self._backend = backend
        self._info = info
        self._closed = False
        backend.retain()

    # -- construction ------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        image: str = "default",
        *,
        memory_mib: int = 512,
        cpus: int = 1,
        name: str | None = None,
        ports: Sequence[int] = (),
        network: str = "user",
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> AsyncSandbox:
        """Start a new session from ``image`` (memory in MiB; ``ports``: guest ports to
        forward to 127.0.0.1). :raises NotFound: no such image. :raises InvalidInput:"""
        backend = connect(base_url, token, runtime)
        backend.retain()  # held while creating, so a failure closes the connection
        try:
            info = await backend.create(
                image=image, memory_mib=memory_mib, cpus=cpus, name=name, ports=ports,
                network=network,
            )  # fmt: skip
            return cls(backend, info)
        finally:
            await backend.release()

    @classmethod
    async def connect(
        cls,
        session: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> AsyncSandbox:
        """Attach to an existing session by id or name. :raises NotFound:"""
        backend = connect(base_url, token, runtime)
        backend.retain()
        try:
            return cls(backend, await backend.get(session))
        finally:
            await backend.release()

    @classmethod
    async def list_sessions(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[JSON]:
        """Every session (as session dicts)."""
        backend = connect(base_url, token, runtime)
        backend.retain()
        try:
            return await backend.list_sessions()
        finally:
            await backend.release()

    # -- state -------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return str(self._info["id"])

    @property
    def info(self) -> JSON:
        """The session dict as last seen (``refresh()`` to re-read it)."""
        return dict(self._info)

    @property
    def commands(self) -> AsyncCommands:
        return AsyncCommands(self)

    @property
    def files(self) -> AsyncFiles:
        return AsyncFiles(self)

    @property
    def ports(self) -> AsyncPorts:
        return AsyncPorts(self)

    async def refresh(self) -> JSON:
        self._info = await self._backend.get(self.id)
        return self.info

    # -- checkpoint / rollback / lifecycle ---------------------------------------------

    async def checkpoint(self, name: str | None = None) -> AsyncCheckpoint:
        """Checkpoint the running VM (memory, devices, disk, every process)."""
        return AsyncCheckpoint(self._backend, await self._backend.checkpoint(self.id, name))

    async def rollback(self, checkpoint: AsyncCheckpoint | str | None = None) -> None:
        """Reset this session (same id, same host ports) to ``checkpoint`` (default: its
        latest). :raises Conflict: the checkpoint is not in this session's lineage."""
        ck = checkpoint.id if isinstance(checkpoint, AsyncCheckpoint) else checkpoint
        self._info = await self._backend.rollback(self.id, ck)

    async def kill(self) -> None:
        """Destroy the session (its VM and files) and release the connection."""
        try:
            await self._backend.remove(self.id)
        finally:
            await self.close()

    async def close(self) -> None:
        """Release the connection; the session keeps running (idempotent)."""
        if not self._closed:
            self._closed = True
            await self._backend.release()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        await self.kill()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} via {self._backend.description}>"


class AsyncCheckpoint:
    """An immutable checkpoint; :meth:`fork` starts new sessions from it."""

    def __init__(self, backend: Backend, info: JSON) -> None:
        self._backend = backend
        self._info = info
        self._closed = False
        backend.retain()

    @classmethod
    async def get(
        cls,
        checkpoint: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> AsyncCheckpoint:
        """An existing checkpoint by id or name. :raises NotFound:"""
        backend = connect(base_url, token, runtime)
        backend.retain()
        try:
            return cls(backend, await backend.get_checkpoint(checkpoint))
        finally:
            await backend.release()

    @property
    def id(self) -> str:
        return str(self._info["id"])

    @property
    def info(self) -> JSON:
        return dict(self._info)

    async def fork(self, count: int = 1) -> list[AsyncSandbox | ForkpointError]:
        """Start ``count`` (1..64) sessions from this checkpoint, in parallel. A fork that
        failed is its error, in its slot; the others run."""
        slots = await self._backend.fork(self.id, count)
        return [
            s if isinstance(s, ForkpointError) else AsyncSandbox(self._backend, s) for s in slots
        ]

    async def remove(self) -> None:
        """Delete the checkpoint. :raises InUse: sessions or checkpoints depend on it."""
        await self._backend.remove_checkpoint(self.id)
        await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._backend.release()

    async def __aenter__(self) -> AsyncCheckpoint:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"
