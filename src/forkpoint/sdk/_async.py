"""The async SDK core: :class:`AsyncSandbox` and :class:`AsyncCheckpoint`.

Every method is one REST call through :class:`~forkpoint.sdk._client.ApiClient` (to a
``forkpoint serve``, or embedded in this process); nothing is orchestrated here. Values
are :mod:`forkpoint.models`; errors are :mod:`forkpoint.errors` classes.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

from forkpoint.errors import ForkpointError, InternalError, InvalidInput
from forkpoint.models import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    BackgroundProcess,
    CheckpointTransfer,
    CommandResult,
    Event,
    FileCheck,
    FileEntry,
    FileEvent,
    GuestRestore,
    HistoryStep,
    HostStatus,
    ImageInfo,
    Metric,
    Network,
    Process,
    ProcessEvent,
    Session,
    StateDiff,
)
from forkpoint.models import Checkpoint as CheckpointInfo  # `Checkpoint` is the sync twin
from forkpoint.protocol.models import check_metadata

from ._client import ApiClient, command_body

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = [
    "AsyncCheckpoint",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncPorts",
    "AsyncSandbox",
    "AsyncTerminal",
    "AsyncTerminals",
    "AsyncWatcher",
]


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
        client, sid = self._sb._client, self._sb.id
        if background:
            if timeout is not None or stdin is not None:
                raise InvalidInput("timeout and stdin do not apply to a background command")
            return await client.spawn(sid, **command_body(cmd, cwd, env))
        data = stdin.encode() if isinstance(stdin, str) else stdin
        result = await client.exec(
            sid, **command_body(cmd, cwd, env), timeout=timeout, output_encoding="base64",
            stdin=None if data is None else base64.b64encode(data).decode(),
            stdin_encoding="base64",
        )  # fmt: skip
        return result.as_text()  # exact bytes fetched, text handed out

    async def ps(self) -> list[Process]:
        """Processes in the guest (kernel threads left out), by pid."""
        return await self._sb._client.ps(self._sb.id)

    async def kill(self, pid: int, signal: int | str = "TERM") -> None:
        """Send ``signal`` (a number or a name like "KILL") to ``pid``. :raises NotFound:"""
        await self._sb._client.kill_process(self._sb.id, pid, signal)


class AsyncFiles:
    """``sb.files``: the guest's filesystem. Paths are absolute guest paths."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def read(self, path: str) -> bytes:
        """The file's bytes. :raises NotFound: :raises InvalidInput: not a regular file."""
        return await self._sb._client.read_file(self._sb.id, path)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(
        self,
        path: str,
        data: bytes | str,
        mode: int = 0o644,
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Write (atomically replace) a file; parent directories are created. ``metadata``
        (keys: letters, digits, ``_.-``, lowercased; values: printable ASCII) is kept on
        the file until it is written again; :meth:`list` shows it."""
        try:
            check_metadata(metadata)  # before it becomes headers
        except ValueError as error:
            raise InvalidInput(str(error)) from None
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await self._sb._client.write_file(self._sb.id, path, payload, mode, metadata)

    async def list(self, path: str) -> list[FileEntry]:
        """Entries of a directory, sorted by name."""
        return await self._sb._client.list_files(self._sb.id, path)

    async def remove(self, path: str) -> None:
        """Remove a file, symlink or whole directory tree. :raises NotFound:"""
        await self._sb._client.remove_file(self._sb.id, path)

    async def watch(
        self, path: str, *, recursive: bool = False, entries: bool = False
    ) -> AsyncWatcher:
        """Watch directory ``path`` for changes (``recursive``: its subdirectories too,
        also new ones; ``entries``: each event carries the path's entry); returns once
        watching. :raises NotFound: no such directory. :raises InvalidInput: a file."""
        body = {"path": path, "recursive": recursive, "entries": entries}
        info = await self._sb._client.call("create_watcher", self._sb.id, body=body)
        return AsyncWatcher(self._sb, info.id)


class AsyncWatcher:
    """A watched directory (``sb.files.watch()``): :meth:`events` returns what changed
    since it was last called — each a :class:`~forkpoint.models.FileEvent` (``type``
    create, write, remove, rename or chmod; ``name`` relative to the directory)."""

    def __init__(self, sandbox: AsyncSandbox, watcher_id: str) -> None:
        self._sb = sandbox
        self._id = watcher_id

    @property
    def id(self) -> str:
        return self._id

    async def events(self, wait: float = 0.0) -> list[FileEvent]:
        """The changes since the last call, in order (every change made before this
        call is in it); with ``wait`` (s, at most 60) and none yet, waits for the first.
        :raises NotFound: the watcher has ended (its directory or session is gone)."""
        body = {"wait": wait}
        found: list[FileEvent] = await self._sb._client.call(
            "watcher_events", self._sb.id, self._id, body=body
        )
        return found

    async def stop(self) -> None:
        """Stop watching. :raises NotFound: it has ended already."""
        await self._sb._client.call("remove_watcher", self._sb.id, self._id)

    def __repr__(self) -> str:
        return f"<AsyncWatcher {self._id} in {self._sb.id}>"


class AsyncTerminal:
    """A program on a pseudo-terminal in the sandbox (``sb.terminals.open()``): type into
    it, resize it, read what it writes. It belongs to the guest, not to this object:
    :meth:`disconnect` leaves it running (``sb.terminals.connect(pid)`` reads it again),
    and it survives checkpoints, forks and rollbacks like any process (same PID)."""

    def __init__(
        self, sandbox: AsyncSandbox, pid: int, events: AsyncIterator[ProcessEvent]
    ) -> None:
        self._sb = sandbox
        self._pid = pid
        self._events = events
        self._exit_code: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def exit_code(self) -> int | None:
        """How the program ended (128+N if signal N killed it); None while it runs."""
        return self._exit_code

    async def send(self, data: bytes | str) -> None:
        """Type ``data`` (str: UTF-8) into the terminal."""
        raw = data.encode() if isinstance(data, str) else data
        await self._sb._client.type_into_terminal(self._sb.id, self._pid, raw)

    async def resize(self, cols: int, rows: int) -> None:
        """Set the window size; the program is told (SIGWINCH)."""
        await self._sb._client.resize_terminal(self._sb.id, self._pid, cols, rows)

    async def read(self) -> bytes | None:
        """The next output the terminal wrote; None once the program has ended (then
        :attr:`exit_code` says how)."""
        async for event in self._events:
            if event.kind == "end":
                self._exit_code = event.exit_code
                return None
            if event.data:
                return event.data
        return None

    async def wait(self, on_output: Callable[[bytes], object] | None = None) -> int:
        """Read until the program ends (each output to ``on_output``); its exit code."""
        while (data := await self.read()) is not None:
            if on_output is not None:
                on_output(data)
        if self._exit_code is None:
            raise InternalError(f"terminal {self._pid}'s stream ended without its exit")
        return self._exit_code

    async def kill(self) -> None:
        """End the program (its process group is killed)."""
        await self._sb._client.close_terminal(self._sb.id, self._pid)

    async def disconnect(self) -> None:
        """Stop reading; the program runs on."""
        await self._events.aclose()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"<AsyncTerminal {self._pid} in {self._sb.id}>"


class AsyncTerminals:
    """``sb.terminals``: programs on pseudo-terminals (interactive shells, TUIs)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def open(
        self,
        cols: int = 80,
        rows: int = 24,
        *,
        command: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> AsyncTerminal:
        """Start ``command`` (default: an interactive login shell, ``/bin/bash -i -l``) on
        a new ``cols`` × ``rows`` terminal, as ``user`` (default root)."""
        request: dict[str, Any] = {"cols": cols, "rows": rows, "cwd": cwd, "user": user}
        if command is not None:
            request["command"] = list(command)
        if env:
            request["env"] = dict(env)
        events = await self._sb._client.open_terminal(self._sb.id, **request)
        return await self._attached(events)

    async def connect(self, pid: int) -> AsyncTerminal:
        """Read terminal ``pid`` again (its output from now on, then its end).
        :raises NotFound: no terminal or process ``pid`` was started by the agent."""
        return await self._attached(await self._sb._client.connect_terminal(self._sb.id, pid))

    async def _attached(self, events: AsyncIterator[ProcessEvent]) -> AsyncTerminal:
        start = await anext(aiter(events))  # errors (no such session, pid) raise here
        return AsyncTerminal(self._sb, start.pid, events)


class AsyncPorts:
    """``sb.ports``: guest ports forwarded to the host's 127.0.0.1."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def forward(self, guest_port: int) -> str:
        """Forward ``guest_port``; returns its ``http://127.0.0.1:PORT`` URL (idempotent)."""
        port = await self._sb._client.forward_port(self._sb.id, guest_port)
        await self._sb.refresh()
        return port.url

    def url(self, guest_port: int) -> str | None:
        """The URL of an already forwarded guest port (forks get their own), else None."""
        port = self._sb.info.port(guest_port)
        return port.url if port else None


class AsyncSandbox:
    """One forkpoint session (a microVM). Make one with :meth:`create` or :meth:`connect`.

    Without ``base_url`` the SDK runs forkpoint in-process (embedded); with
    ``base_url="unix:/path"`` or ``"http://127.0.0.1:PORT"`` it uses ``forkpoint serve``.
    Use as ``async with`` to kill the session on exit. Release the connection with
    :meth:`close` (or :meth:`kill`) when done.
    """

    commands: AsyncCommands
    files: AsyncFiles
    ports: AsyncPorts
    terminals: AsyncTerminals

    def __init__(self, client: ApiClient, info: Session) -> None:
        self._client = client
        self._info = info
        self._closed = False
        client.retain()
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.ports = AsyncPorts(self)
        self.terminals = AsyncTerminals(self)

    # -- construction ------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        image: str = "default",
        *,
        memory_mib: int = DEFAULT_MEMORY_MIB,
        cpus: int = DEFAULT_CPUS,
        name: str | None = None,
        ports: Sequence[int] = (),
        network: Network | str = Network.USER,
        allow_net: Sequence[str] = (),
        deny_net: Sequence[str] = (),
        inject_headers: Mapping[str, Mapping[str, str]] | None = None,
        timeout: float | None = None,
        disk_mib: int | None = None,
        history: bool = False,
        history_keep: int = 20,
        on_expiry: str = "remove",
        volumes: Mapping[str, str] | None = None,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> AsyncSandbox:
        """Start a new session from ``image`` (memory in MiB; ``ports``: guest ports to
        forward to 127.0.0.1; ``allow_net``/``deny_net``: CIDRs and host names adjusting
        the default egress policy; ``inject_headers``: ``{host: {name: value}}`` set on the
        guest's plain-HTTP requests to that host, never seen by the guest; ``timeout``:
        seconds until it is removed, or paused with ``on_expiry="pause"``; ``disk_mib``:
        its virtual disk, at least the image's; ``history``: a checkpoint before every command and
        file write, see :meth:`history` and :meth:`undo`, the last ``history_keep`` kept;
        ``volumes``: ``{guest path: volume id or name}`` mounted in it — outside every
        checkpoint: forks share them, a rollback does not undo them).
        :raises NotFound: no such image. :raises InvalidInput:
        :raises LimitExceeded: the host's disk reserve or session count would be crossed."""
        async with ApiClient.held(base_url, token, runtime) as client:
            info = await client.create(
                image=image, memory_mib=memory_mib, cpus=cpus, name=name, ports=list(ports),
                network=str(network), allow_net=list(allow_net), deny_net=list(deny_net),
                inject_headers={h: dict(f) for h, f in (inject_headers or {}).items()},
                timeout_s=timeout, disk_mib=disk_mib, history=history,
                history_keep=history_keep, on_expiry=on_expiry, volumes=dict(volumes or {}),
            )  # fmt: skip
            return cls(client, info)

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
        async with ApiClient.held(base_url, token, runtime) as client:
            return cls(client, await client.get(session))

    @classmethod
    async def list_sessions(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[Session]:
        """Every session."""
        async with ApiClient.held(base_url, token, runtime) as client:
            return await client.list_sessions()

    @classmethod
    async def host_status(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> HostStatus:
        """The host's room against the limits: running sessions and the most allowed,
        memory available and given to guests, free disk and the reserve, VMs started ahead."""
        async with ApiClient.held(base_url, token, runtime) as client:
            return await client.host_status()

    @classmethod
    async def list_images(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[ImageInfo]:
        """Each guest image's newest build."""
        async with ApiClient.held(base_url, token, runtime) as client:
            return await client.images()

    @classmethod
    async def build_image(
        cls,
        name: str,
        *,
        packages: Sequence[str] = (),
        dockerfile: str | None = None,
        files: Mapping[str, bytes] | None = None,
        start: bool = True,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> ImageInfo:
        """Build a guest image (cached by content; minutes when new): a minimal Debian plus
        ``packages``, or ``dockerfile`` built with podman with ``files`` (relative path ->
        bytes) as its context. Its CMD runs in every session (``start``); ``LABEL
        dev.forkpoint.ready-cmd=...`` makes the boot wait until that command succeeds."""
        context = {p: base64.b64encode(data).decode() for p, data in (files or {}).items()}
        async with ApiClient.held(base_url, token, runtime) as client:
            return await client.build_image(
                name=name, packages=list(packages), dockerfile=dockerfile, files=context,
                start=start,
            )  # fmt: skip

    @classmethod
    async def remove_image(
        cls,
        name: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[str]:
        """Remove every build of image ``name`` (refused while a session or checkpoint
        needs it); returns the hashes removed."""
        async with ApiClient.held(base_url, token, runtime) as client:
            return await client.remove_image(name)

    @classmethod
    async def events(
        cls,
        after: int = 0,
        *,
        session: str | None = None,
        wait: float = 0.0,
        limit: int = 100,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[Event]:
        """What happened to sessions after event ``after`` (of ``session`` only), oldest
        first: created, forked, checkpointed, rolled_back, paused, resumed, removed,
        expired. ``wait``: with none yet, wait up to this many seconds for the next."""
        async with ApiClient.held(base_url, token, runtime) as client:
            return await client.events(after, session, wait, limit)

    @classmethod
    async def recover(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[AsyncSandbox | ForkpointError]:
        """Roll every crashed session back to its latest checkpoint (same id and ports),
        e.g. after the host restarted: one slot per session, a failure as its error."""
        async with ApiClient.held(base_url, token, runtime) as client:
            slots = await client.recover()
            return [s if isinstance(s, ForkpointError) else cls(client, s) for s in slots]

    # -- state -------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def info(self) -> Session:
        """The session as last seen (``refresh()`` to re-read it)."""
        return self._info

    async def refresh(self) -> Session:
        self._info = await self._client.get(self.id)
        return self._info

    # -- checkpoint / rollback / lifecycle ---------------------------------------------

    async def checkpoint(self, name: str | None = None) -> AsyncCheckpoint:
        """Checkpoint the running VM (memory, devices, disk, every process)."""
        return AsyncCheckpoint(self._client, await self._client.checkpoint(self.id, name))

    async def rollback(self, checkpoint: AsyncCheckpoint | str | None = None) -> None:
        """Reset this session (same id, same host ports) to ``checkpoint`` (default: its
        latest). :raises Conflict: the checkpoint is not in this session's lineage."""
        ck = checkpoint.id if isinstance(checkpoint, AsyncCheckpoint) else checkpoint
        self._info = await self._client.rollback(self.id, ck)

    async def set_timeout(
        self, seconds: float | None, on_expiry: str | None = None, keep_memory: bool | None = None
    ) -> None:
        """End this session's lifetime ``seconds`` from now (0: now; None: never): then it is
        removed, or paused (``on_expiry``: ``"remove"``/``"pause"``; None: as before), the
        pause keeping its memory or only its disk (``keep_memory``; None: as before)."""
        self._info = await self._client.set_timeout(self.id, seconds, on_expiry, keep_memory)

    async def set_egress(
        self,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
        inject_headers: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Replace where the guest may connect: ``allow``/``deny`` CIDRs and host names on
        top of the defaults, and the headers set on its plain-HTTP requests to a host
        (empty: the defaults, none). A running guest is held to them at once."""
        self._info = await self._client.set_egress(self.id, allow, deny, inject_headers)

    async def pause(self, keep_memory: bool = True) -> None:
        """Checkpoint this session and stop its VM; :meth:`resume` brings it back as it
        was (same id and ports, processes at the same PIDs). ``keep_memory=False`` keeps
        only its disk: resume boots it anew from that. :raises Conflict: not running."""
        self._info = await self._client.pause(self.id, keep_memory)

    async def resume(self) -> None:
        """Bring this paused session back. :raises Conflict: it is not paused."""
        self._info = await self._client.resume(self.id)

    async def rollback_preview(
        self, checkpoint: AsyncCheckpoint | str | None = None, *, patch: bool = False
    ) -> StateDiff:
        """What :meth:`rollback` to ``checkpoint`` would undo (files, processes, listening
        ports); changes nothing."""
        ck = checkpoint.id if isinstance(checkpoint, AsyncCheckpoint) else checkpoint
        return await self._client.rollback_preview(self.id, ck, patch)

    async def diff(
        self,
        since: AsyncCheckpoint | str | None = None,
        *,
        patch: bool = False,
        include_tmp: bool = False,
        exclude: Sequence[str] = (),
    ) -> StateDiff:
        """What changed in this session since checkpoint ``since`` (default: the one
        :meth:`rollback` would restore): files, processes, listening ports."""
        ck = since.id if isinstance(since, AsyncCheckpoint) else since
        return await self._client.diff(
            a=ck or self.id, b=self.id if ck else None, patch=patch, include_tmp=include_tmp,
            exclude=list(exclude),
        )  # fmt: skip

    async def metrics(
        self, start: datetime | None = None, end: datetime | None = None
    ) -> list[Metric]:
        """CPU, memory and disk samples from ``start`` to ``end`` (None: unbounded),
        oldest first: taken every 5 s while a long-lived door (``forkpoint serve``) runs,
        kept an hour."""
        return await self._client.metrics(self.id, start, end)

    async def restore_status(self) -> GuestRestore:
        """What the guest made of its latest restore (create, fork, rollback, resume):
        its generation, the processes it signalled, its restore hooks' results."""
        return await self._client.restore_status(self.id)

    async def history(self) -> list[HistoryStep]:
        """The steps of a session created with ``history=True``, oldest first.
        :raises Conflict: it keeps no history."""
        return await self._client.history(self.id)

    async def undo(self, steps: int = 1) -> None:
        """Undo the last ``steps`` commands or file writes, processes included (a rollback
        to the checkpoint taken before them). :raises Conflict: no history, too few steps."""
        self._info = await self._client.undo(self.id, steps)

    async def kill(self) -> None:
        """Destroy the session (its VM and files) and release the connection."""
        try:
            await self._client.remove(self.id)
        finally:
            await self.close()

    async def close(self) -> None:
        """Release the connection; the session keeps running (idempotent)."""
        if not self._closed:
            self._closed = True
            await self._client.release()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        await self.kill()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} via {self._client.description}>"


class AsyncCheckpoint:
    """An immutable checkpoint; :meth:`fork` starts new sessions from it."""

    def __init__(self, client: ApiClient, info: CheckpointInfo) -> None:
        self._client = client
        self._info = info
        self._closed = False
        client.retain()

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
        async with ApiClient.held(base_url, token, runtime) as client:
            return cls(client, await client.get_checkpoint(checkpoint))

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def info(self) -> CheckpointInfo:
        return self._info

    async def fork(
        self, count: int = 1, *, spread: bool = False
    ) -> list[AsyncSandbox | ForkpointError]:
        """Start ``count`` (1..64) sessions from this checkpoint, in parallel. A fork that
        failed is its error, in its slot; the others run. On a cluster, ``spread`` asks
        Ray to spread them over nodes (default: packed on as few as hold them)."""
        slots = await self._client.fork(self.id, count, spread)
        return [
            s if isinstance(s, ForkpointError) else AsyncSandbox(self._client, s) for s in slots
        ]

    async def verify(self) -> list[FileCheck]:
        """Hash every file of this checkpoint against its manifest: one verdict per file.
        :raises DamagedCheckpoint: its manifest is damaged."""
        return await self._client.verify_checkpoint(self.id)

    async def push(self, to: str) -> CheckpointTransfer:
        """Upload this checkpoint to ``s3://BUCKET/PREFIX`` with what the bucket lacks of
        its lineage (a child: the RAM pages that differ from its parent's). Endpoint and
        credentials: the AWS variables where forkpoint runs (the server, over REST)."""
        return await self._client.push_checkpoint(self.id, to)

    @classmethod
    async def pull(
        cls,
        ref: str,
        source: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> AsyncCheckpoint:
        """Download checkpoint ``ref`` (``sha256:<digest>``, or the id or name it was
        pushed under) from ``s3://BUCKET/PREFIX``, verified, and return it.

        :raises IncompatibleCheckpoint: this host cannot restore it (no RAM was
            downloaded); :raises DamagedCheckpoint: an object did not match its digest.
        """
        async with ApiClient.held(base_url, token, runtime) as client:
            pulled = await client.pull_checkpoint(ref, source)
            return cls(client, pulled.checkpoint)

    async def remove(self) -> None:
        """Delete the checkpoint. :raises InUse: sessions or checkpoints depend on it."""
        await self._client.remove_checkpoint(self.id)
        await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.release()

    async def __aenter__(self) -> AsyncCheckpoint:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"
