"""AgentClient: the host side of the agent protocol (asyncio).

One client = one connection to the agent (QEMU's chardev socket of the session, or any
pair of streams). Requests carry ids, so many can run at once over the connection.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import fcntl
import logging
import os
import secrets
import shlex
import signal as signal_mod
import struct
import termios
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from types import TracebackType
from typing import IO, Any, Final, TypeVar

from ..errors import AgentError, ForkpointError, InvalidInput
from ..polling import poll_until
from ..protocol import (
    CHUNK_BYTES,
    MAX_HOOK_TIMEOUT_S,
    PROTOCOL_VERSION,
    SYNC,
    SYNC_MAGIC,
    DirEntry,
    Empty,
    Event,
    EventKind,
    ExecArgs,
    ExecResult,
    FrameDecoder,
    GuestStats,
    HelloArgs,
    HelloResult,
    KillArgs,
    ListDirArgs,
    ListDirResult,
    MakeDirArgs,
    MakeDirResult,
    Op,
    PathArgs,
    PidArgs,
    ProcAttachArgs,
    ProcEndResult,
    ProcessInfo,
    ProcInputArgs,
    ProcListResult,
    ProcResizeArgs,
    ProcSignalArgs,
    ProcStartArgs,
    ProtocolError,
    PsResult,
    PtySize,
    ReadFileResult,
    RemoveArgs,
    RemoveResult,
    RenameArgs,
    Response,
    RestoreFacts,
    RestoreIdentityArgs,
    RestoreIdentityResult,
    RestoreStatus,
    RestoreStatusArgs,
    ScanArgs,
    ScanResult,
    SpawnArgs,
    SpawnResult,
    StatArgs,
    StatResult,
    StreamCancelArgs,
    TrackedProcessInfo,
    TunnelOpenArgs,
    WatchDirArgs,
    WriteBeginArgs,
    WriteBeginResult,
    WriteChunkArgs,
    WriteCommitArgs,
    WriteCommitResult,
    WriteHandleArgs,
    encode_frame,
    from_wire,
    parse_reply,
    request_message,
    to_wire,
)
from ._errors import error_from_agent
from .processes import ProcessStream
from .streams import EventStream
from .tunnel import TunnelReader, TunnelWriter
from .watch import WatchStream

__all__ = ["AgentClient", "OutputCallback", "confirm_restore", "fresh_identity", "post_identity"]

log = logging.getLogger(__name__)

OutputCallback = Callable[[bytes], Awaitable[None]]
"""Receives one chunk of a command's stdout or stderr as it is produced."""

_EventCallback = Callable[[EventKind, bytes], Awaitable[None]]
_R = TypeVar("_R")

_READ_BYTES: Final = 256 * 1024
_CONNECT_RETRY_S: Final = 0.01
# A hello may be lost (e.g. sent before a restore completed): resend, backing off so a
# slow (TCG) agent is not made to drop answers it is about to send.
# Short first: right after a restore the guest may miss the first hello.
_HELLO_RESEND_S: Final = (0.05, 0.1, 0.2, 0.5, 1.0)
_POST_TIMEOUT_S: Final = 2.0
_UPLOAD_WINDOW: Final = 4  # write_chunk requests in flight per upload
_EXEC_GRACE_S: Final = 30.0  # beyond an exec's own timeout, for kill + reply


class _Default(enum.Enum):
    TOKEN = 0  # "use the client's request_timeout"


@dataclass
class _Pending:
    future: asyncio.Future[Response]
    on_event: _EventCallback | None
    last_activity: float


def _model(cls: Callable[..., _R], /, **kwargs: Any) -> _R:
    """Build an args model; its validation errors become InvalidInput."""
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise InvalidInput(str(e)) from None


def _signal_number(sig: int | str) -> int:
    if isinstance(sig, int):
        return sig
    name = sig.upper()
    try:
        return int(signal_mod.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:
        raise InvalidInput(f"unknown signal: {sig}") from None


class AgentClient:
    """A connection to one in-guest agent. Create with :meth:`connect` or :meth:`over_streams`.

    Every method raises AgentError when the channel breaks, InvalidInput for bad
    arguments (checked before sending, and by the agent), NotFound for a missing path,
    command or process. ``request_timeout`` (s) bounds how long a request may go without
    any sign of life from the agent (exec uses its own timeout plus a grace instead).
    Output callbacks run on the connection's reader: they must not wait for other
    requests of this client.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        label: str,
        request_timeout: float | None,
    ) -> None:
        """Internal: use :meth:`connect` or :meth:`over_streams` (they do the handshake)."""
        self._reader = reader
        self._writer = writer
        self._label = label
        self._request_timeout = request_timeout
        self._decoder = FrameDecoder(require_sync=True)
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._broken: AgentError | None = None
        self._closed = False
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())
        self.info: HelloResult | None = None
        """The agent's hello answer (pid, hostname, boot id, protocol version)."""

    # -- lifecycle ---------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        request_timeout: float | None = 60.0,
        identity: RestoreIdentityArgs | None = None,
    ) -> AgentClient:
        """Connect to the agent socket at ``path`` and handshake, all within ``timeout`` s.

        Retries while the socket is missing or refuses (QEMU creates it a few ms after
        starting, also after a restore). ``identity``: the agent applies it (once per
        token) before answering. Raises AgentError on timeout.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        reader, writer = await _open(path, deadline, timeout)
        return await cls._start(
            reader, writer, str(path), deadline, timeout, request_timeout, identity
        )

    @classmethod
    async def over_streams(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        timeout: float = 10.0,
        request_timeout: float | None = 60.0,
        label: str = "agent",
        identity: RestoreIdentityArgs | None = None,
    ) -> AgentClient:
        """Handshake over an existing connection within ``timeout`` s (the client owns it
        from now on), as :meth:`connect` does. Raises AgentError on timeout."""
        deadline = asyncio.get_running_loop().time() + timeout
        return await cls._start(reader, writer, label, deadline, timeout, request_timeout, identity)

    @classmethod
    async def _start(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        label: str,
        deadline: float,
        timeout: float,
        request_timeout: float | None,
        identity: RestoreIdentityArgs | None,
    ) -> AgentClient:
        client = cls(reader, writer, label=label, request_timeout=request_timeout)
        try:
            client.info = await client._handshake(deadline, timeout, identity)
        except BaseException:
            await client.close()
            raise
        return client

    async def _handshake(
        self, deadline: float, timeout: float, identity: RestoreIdentityArgs | None
    ) -> HelloResult:
        """Send SYNC_MAGIC + hello(nonce) until an answer carries our nonce.

        The magic makes the agent drop anything left from an earlier connection (or from
        before a VM restore); the nonce makes us ignore stale answers.
        """
        loop = asyncio.get_running_loop()
        nonce = secrets.token_hex(16)
        waiting: dict[asyncio.Future[Response], int] = {}
        attempt = 0
        try:
            while True:
                now = loop.time()
                if now >= deadline:
                    raise AgentError(
                        f"agent at {self._label} did not answer the handshake within "
                        f"{timeout:g} s (not running yet, or another client is connected)"
                    )
                rid, pend = self._register(None)
                waiting[pend.future] = rid
                await self._send(SYNC_MAGIC + _hello_frame(rid, nonce, identity))
                attempt += 1
                done, _ = await asyncio.wait(
                    set(waiting),
                    timeout=min(
                        _HELLO_RESEND_S[min(attempt, len(_HELLO_RESEND_S)) - 1], deadline - now
                    ),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for fut in done:
                    resp = fut.result()  # AgentError if the channel broke
                    if resp.error is not None:
                        raise error_from_agent(Op.HELLO, resp.error)
                    hello = self._decode(HelloResult, resp)
                    if hello.nonce != nonce:
                        continue
                    if hello.protocol_version != PROTOCOL_VERSION:
                        raise AgentError(
                            f"agent speaks protocol {hello.protocol_version}, "
                            f"this host speaks {PROTOCOL_VERSION}: rebuild the image"
                        )
                    return hello
        finally:
            for fut, rid in waiting.items():
                self._pending.pop(rid, None)
                if fut.done() and not fut.cancelled():
                    fut.exception()  # retrieved: no "never retrieved" noise

    async def close(self) -> None:
        """Close the connection; pending requests fail with AgentError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._reader_task.cancel()
        try:
            await self._reader_task
        except (asyncio.CancelledError, Exception):
            pass
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (OSError, asyncio.CancelledError):
            pass

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once closed or the connection broke."""
        return self._closed or self._broken is not None

    # -- plumbing ----------------------------------------------------------------------

    def _register(self, on_event: _EventCallback | None) -> tuple[int, _Pending]:
        if self._closed:
            raise AgentError(f"agent client for {self._label} is closed")
        if self._broken is not None:
            raise AgentError(self._broken.message)
        self._next_id += 1
        loop = asyncio.get_running_loop()
        pend = _Pending(loop.create_future(), on_event, loop.time())
        self._pending[self._next_id] = pend
        return self._next_id, pend

    async def _send(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as e:
            raise AgentError(f"agent connection {self._label} broken: {e}") from e

    async def _read_loop(self) -> None:
        """Decode frames; route events to callbacks and responses to waiters."""
        error = AgentError(f"agent client for {self._label} is closed")
        try:
            while True:
                data = await self._reader.read(_READ_BYTES)
                if not data:
                    error = AgentError(f"agent connection {self._label} closed by the agent")
                    return
                self._decoder.feed(data)
                while (item := self._decoder.next()) is not None:
                    if item is SYNC:
                        continue
                    assert isinstance(item, dict)
                    await self._dispatch(parse_reply(item))
        except ProtocolError as e:
            error = AgentError(f"agent {self._label} sent a malformed frame: {e}")
        except (ConnectionError, OSError) as e:
            error = AgentError(f"agent connection {self._label} broken: {e}")
        finally:
            self._broken = error
            for pend in self._pending.values():
                if not pend.future.done():
                    pend.future.set_exception(error)

    async def _dispatch(self, msg: Response | Event) -> None:
        pend = self._pending.get(msg.id) if msg.id is not None else None
        if pend is None:
            if msg.id is None and isinstance(msg, Response) and msg.error is not None:
                log.warning("agent %s rejected a message: %s", self._label, msg.error.message)
            return  # stale: a request we gave up on, or from an earlier connection
        pend.last_activity = asyncio.get_running_loop().time()
        if pend.future.done():
            return
        if isinstance(msg, Response):
            pend.future.set_result(msg)
        elif pend.on_event is not None:
            try:
                await pend.on_event(msg.kind, msg.data)
            except Exception as e:  # the caller's sink failed: fail that request only
                pend.future.set_exception(e)

    async def _call(
        self,
        op: Op,
        args: object,
        *,
        on_event: _EventCallback | None = None,
        timeout: float | None | _Default = _Default.TOKEN,
        command: str | None = None,
        exec_timeout: float | None = None,
    ) -> Response:
        """Send one request and wait for its final response (raising mapped errors)."""
        try:
            frame_args = to_wire(args)
            rid, pend = self._register(on_event)
        except ValueError as e:
            raise InvalidInput(str(e)) from None
        try:
            try:
                frame = encode_frame(request_message(rid, op, frame_args))
            except ProtocolError as e:
                raise InvalidInput(f"{op} request too large: {e}") from e
            await self._send(frame)
            idle = self._request_timeout if isinstance(timeout, _Default) else timeout
            resp = await self._wait(op, pend, idle)
        finally:
            self._pending.pop(rid, None)
        if resp.error is not None:
            raise error_from_agent(op, resp.error, command=command, timeout_s=exec_timeout)
        return resp

    async def _open_stream(self, op: Op, args: object, window: int) -> EventStream:
        """Send a streaming request; its events and final response come through the
        returned stream (no idle timeout: such streams may be quiet for hours)."""
        try:
            frame_args = to_wire(args)
            rid, pend = self._register(None)
        except ValueError as e:
            raise InvalidInput(str(e)) from None

        async def call(op: Op, args: object) -> Response:
            return await self._call(op, args)

        def forget() -> None:
            self._pending.pop(rid, None)

        stream = EventStream(rid, pend.future, window, call, forget)
        pend.on_event = stream.on_event
        try:
            await self._send(encode_frame(request_message(rid, op, frame_args)))
        except BaseException:
            self._pending.pop(rid, None)
            raise
        return stream

    @staticmethod
    def _raise_for(op: Op, resp: Response) -> None:
        if resp.error is not None:
            raise error_from_agent(op, resp.error)

    async def _wait(self, op: Op, pend: _Pending, idle: float | None) -> Response:
        loop = asyncio.get_running_loop()
        while True:
            wait = None if idle is None else pend.last_activity + idle - loop.time()
            if wait is not None and wait <= 0:
                raise AgentError(f"agent {self._label} did not answer {op} within {idle:g} s")
            done, _ = await asyncio.wait({pend.future}, timeout=wait)
            if done:
                return pend.future.result()

    @staticmethod
    def _decode(cls: type[_R], resp: Response) -> _R:
        try:
            return from_wire(cls, resp.result, what="result")
        except ProtocolError as e:
            raise AgentError(f"agent sent a malformed result: {e}") from e

    async def _simple(self, op: Op, args: object, result: type[_R]) -> _R:
        return self._decode(result, await self._call(op, args))

    # -- ops ---------------------------------------------------------------------------

    async def hello(self) -> HelloResult:
        """Ping the agent (no resync). Returns its identity."""
        return await self._simple(
            Op.HELLO, HelloArgs(secrets.token_hex(8), PROTOCOL_VERSION), HelloResult
        )

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run ``command`` (a shell string, or an argv list) to completion.

        ``timeout`` in seconds: past it the agent kills the command's whole process group
        and this raises CommandTimeout. A non-zero exit is not an error: check
        ``exit_code`` (128+N and ``signal`` N when killed by a signal). Collected stdout
        and stderr are capped at 1 MiB each (``truncated``); callbacks see everything.
        Raises NotFound for a missing command or cwd, InvalidInput for bad arguments.
        ``user``: run as that guest user (None: the image's ``USER``, else root).
        """
        is_shell = isinstance(command, str)
        args = _model(
            ExecArgs,
            argv=None if is_shell else list(command),
            shell=command if is_shell else None,
            cwd=cwd,
            env=dict(env or {}),
            stdin=stdin,
            timeout=timeout,
            stream=on_stdout is not None or on_stderr is not None,
            user=user,
        )

        async def on_event(kind: EventKind, data: bytes) -> None:
            if kind == EventKind.STDOUT and on_stdout is not None:
                await on_stdout(data)
            elif kind == EventKind.STDERR and on_stderr is not None:
                await on_stderr(data)

        shown = command if isinstance(command, str) else shlex.join(command)
        resp = await self._call(
            Op.EXEC,
            args,
            on_event=on_event,
            timeout=None if timeout is None else timeout + _EXEC_GRACE_S,
            command=shown,
            exec_timeout=timeout,
        )
        return self._decode(ExecResult, resp)

    async def spawn(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> SpawnResult:
        """Start ``command`` detached (own session; stdout+stderr to ``log_path``).

        It survives this client, agent restarts, checkpoints, forks and rollbacks.
        Raises NotFound for a missing command or cwd.
        """
        is_shell = isinstance(command, str)
        args = _model(
            SpawnArgs,
            argv=None if is_shell else list(command),
            shell=command if is_shell else None,
            cwd=cwd,
            env=dict(env or {}),
            user=user,
        )
        return await self._simple(Op.SPAWN, args, SpawnResult)

    async def read_file(self, path: str) -> bytes:
        """The whole file (for big files prefer :meth:`read_file_to`).

        Raises NotFound if missing, InvalidInput for a directory or non-regular file.
        """
        parts: list[bytes] = []

        async def sink(data: bytes) -> None:
            parts.append(data)

        await self._read(path, sink)
        return b"".join(parts)

    async def read_file_to(self, path: str, dest: IO[bytes]) -> int:
        """Stream the file into ``dest`` chunk by chunk (bounded memory). Returns bytes."""

        async def sink(data: bytes) -> None:
            dest.write(data)

        return await self._read(path, sink)

    async def _read(self, path: str, sink: Callable[[bytes], Awaitable[None]]) -> int:
        received = 0

        async def on_event(kind: EventKind, data: bytes) -> None:
            nonlocal received
            if kind == EventKind.CHUNK:
                received += len(data)
                await sink(data)

        resp = await self._call(Op.READ_FILE, _model(PathArgs, path=path), on_event=on_event)
        size = self._decode(ReadFileResult, resp).size
        if size != received:
            raise AgentError(f"read_file {path}: agent reported {size} bytes, sent {received}")
        return size

    async def write_file(
        self,
        path: str,
        data: bytes | bytearray | memoryview | IO[bytes],
        *,
        mode: int = 0o644,
        make_parents: bool = True,
        user: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> int:
        """Write ``data`` (bytes, or a binary file object read chunk by chunk) to ``path``.

        Atomic: the agent writes a temp file next to ``path`` and renames it on success.
        Chunks are pipelined, memory stays bounded on both sides. Returns bytes written.
        ``user``: the file, and the parents it creates, belong to that guest user.
        ``metadata``: stored on the file (extended attributes; stat and list return it).
        Raises InvalidInput if ``path`` is a directory or not absolute.
        """
        begin = _model(
            WriteBeginArgs, path=path, mode=mode, make_parents=make_parents, user=user,
            metadata=dict(metadata) if metadata else None,
        )  # fmt: skip
        handle = (await self._simple(Op.WRITE_BEGIN, begin, WriteBeginResult)).handle
        in_flight: set[asyncio.Task[Response]] = set()
        size = 0
        try:
            for chunk in _chunks(data):
                chunk_args = WriteChunkArgs(handle=handle, offset=size, data=chunk)
                in_flight.add(asyncio.create_task(self._call(Op.WRITE_CHUNK, chunk_args)))
                size += len(chunk)
                if len(in_flight) >= _UPLOAD_WINDOW:
                    done, in_flight = await asyncio.wait(
                        in_flight, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in done:
                        task.result()
            if in_flight:
                done, in_flight = await asyncio.wait(in_flight)
                for task in done:
                    task.result()
            commit = WriteCommitArgs(handle=handle, size=size)
            return (await self._simple(Op.WRITE_COMMIT, commit, WriteCommitResult)).size
        except BaseException as e:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            if isinstance(e, Exception) and not self.closed:
                try:
                    await self._call(Op.WRITE_ABORT, WriteHandleArgs(handle), timeout=5.0)
                except ForkpointError:
                    pass
            raise

    async def list_dir(self, path: str, *, depth: int = 1) -> list[DirEntry]:
        """Entries of a directory (``depth`` levels: 2 adds its subdirectories' entries),
        sorted by path. Raises NotFound / InvalidInput."""
        args = _model(ListDirArgs, path=path, depth=depth)
        return (await self._simple(Op.LIST_DIR, args, ListDirResult)).entries

    async def make_dir(self, path: str, *, user: str | None = None) -> bool:
        """``mkdir -p`` (what it creates belongs to ``user``); False if it existed.
        Raises InvalidInput when a file is in the way, NotFound for an unknown user."""
        args = _model(MakeDirArgs, path=path, user=user)
        return (await self._simple(Op.MAKE_DIR, args, MakeDirResult)).created

    async def rename(self, src: str, dst: str, *, user: str | None = None) -> None:
        """Move ``src`` to ``dst`` (with ``user``: only where that user may write).
        Raises NotFound, InvalidInput (also when ``user`` may not)."""
        await self._call(Op.RENAME, _model(RenameArgs, src=src, dst=dst, user=user))

    # -- processes the agent owns (envd-like) ------------------------------------------

    async def start_process(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        stdin: bool = False,
        tag: str | None = None,
        timeout: float | None = None,
        pty: PtySize | None = None,
    ) -> ProcessStream:
        """Start ``argv`` as a process the agent owns; await ``started()`` for its pid.

        It outlives this stream and this client (``attach_process`` streams it again).
        ``timeout`` (s) bounds its life: its process group is killed then. ``pty``: on a
        terminal of that size (its output comes as ``pty`` events; ``send_stdin`` types).
        """
        args = _model(
            ProcStartArgs, argv=list(argv), cwd=cwd, env=dict(env or {}), user=user,
            stdin=stdin, tag=tag, timeout=timeout or None, pty=pty,
        )  # fmt: skip
        return self._process_stream(Op.PROC_START, await self._open_stream(
            Op.PROC_START, args, args.window
        ))  # fmt: skip

    async def attach_process(self, pid: int) -> ProcessStream:
        """Stream a process started by :meth:`start_process` again (start, new output,
        end; at once start + end if it has ended). ``started()`` raises NotFound."""
        args = _model(ProcAttachArgs, pid=pid)
        stream = await self._open_stream(Op.PROC_ATTACH, args, args.window)
        return self._process_stream(Op.PROC_ATTACH, stream)

    def _process_stream(self, op: Op, stream: EventStream) -> ProcessStream:
        return ProcessStream(op, stream, self._raise_for, partial(self._decode, ProcEndResult))

    async def send_stdin(self, pid: int, data: bytes) -> None:
        """Write to the stdin of a process started with ``stdin=True`` (returns once the
        pipe took it). Raises NotFound, Conflict (no stdin, or closed)."""
        await self._call(Op.PROC_INPUT, ProcInputArgs(pid, data), timeout=None)

    async def close_stdin(self, pid: int) -> None:
        """Raises NotFound, Conflict (started without stdin)."""
        await self._call(Op.PROC_CLOSE_STDIN, PidArgs(pid))

    async def resize_process(self, pid: int, size: PtySize) -> None:
        """Set the window size of a process's PTY. Raises NotFound, Conflict (no PTY, or
        it has ended)."""
        await self._call(Op.PROC_RESIZE, ProcResizeArgs(pid, size))

    async def signal_process(self, pid: int, signal: int | str) -> None:
        """Signal a started process's group. Raises NotFound (unknown, or ended)."""
        await self._call(
            Op.PROC_SIGNAL, _model(ProcSignalArgs, pid=pid, signal=_signal_number(signal))
        )

    async def list_processes(self) -> list[TrackedProcessInfo]:
        """Processes started with :meth:`start_process`: running ones, then ended ones."""
        return (await self._simple(Op.PROC_LIST, Empty(), ProcListResult)).processes

    @contextlib.asynccontextmanager
    async def tunnel(self, port: int) -> AsyncIterator[tuple[TunnelReader, TunnelWriter]]:
        """A byte stream to 127.0.0.1:``port`` inside the guest.

        Raises NotFound when nothing listens there. Leaving the block closes it.
        """
        args = _model(TunnelOpenArgs, port=port)
        stream = await self._open_stream(Op.TUNNEL_OPEN, args, args.window)
        try:
            first = await stream.next()
            if first is None:
                self._raise_for(Op.TUNNEL_OPEN, stream.response())
                raise AgentError(f"agent closed the tunnel to guest port {port} at once")

            async def cancel() -> None:
                with contextlib.suppress(ForkpointError):
                    await self._call(Op.STREAM_CANCEL, StreamCancelArgs(stream.rid), timeout=5.0)

            reader = TunnelReader(stream)
            writer = TunnelWriter(stream.rid, self._call, cancel)
            try:
                yield reader, writer
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        finally:
            await stream.cancel()

    async def watch_dir(
        self, path: str, *, recursive: bool = False, entries: bool = False
    ) -> WatchStream:
        """Watch directory ``path``'s changes; await ``started()`` before relying on it."""
        args = _model(WatchDirArgs, path=path, recursive=recursive, entries=entries)
        stream = await self._open_stream(Op.WATCH_DIR, args, args.window)

        async def call(op: Op, call_args: object) -> Response:
            return await self._call(op, call_args)

        return WatchStream(stream, call, self._raise_for)

    async def stat(self, path: str, *, follow_symlinks: bool = True) -> StatResult:
        """Type, size (bytes), mode, mtime (ns), owner. Raises NotFound."""
        args = _model(StatArgs, path=path, follow_symlinks=follow_symlinks)
        return await self._simple(Op.STAT, args, StatResult)

    async def remove(self, path: str, *, recursive: bool = True) -> RemoveResult:
        """Remove a file, symlink or directory tree. Raises NotFound / InvalidInput."""
        args = _model(RemoveArgs, path=path, recursive=recursive)
        return await self._simple(Op.REMOVE, args, RemoveResult)

    async def stats(self) -> GuestStats:
        """The guest's memory and root filesystem use (bytes)."""
        return await self._simple(Op.STATS, Empty(), GuestStats)

    async def ps(self) -> list[ProcessInfo]:
        """Processes in the guest (kernel threads left out), by pid."""
        return (await self._simple(Op.PS, Empty(), PsResult)).processes

    async def scan(self, roots: list[str], exclude: list[str]) -> ScanResult:
        """The file tree under ``roots`` (packed, see ``ScanResult``; streamed, gathered
        here into ``paths``/``numbers``), the processes and the listening TCP sockets."""
        received = bytearray()

        async def on_event(kind: EventKind, data: bytes) -> None:
            if kind == EventKind.CHUNK:
                received.extend(data)

        args = _model(ScanArgs, roots=roots, exclude=exclude)
        result = self._decode(ScanResult, await self._call(Op.SCAN, args, on_event=on_event))
        if len(received) != result.paths_bytes + result.numbers_bytes:
            raise AgentError(
                f"scan: agent announced {result.paths_bytes + result.numbers_bytes} bytes, "
                f"sent {len(received)}"
            )
        return replace(
            result,
            paths=base64.b64encode(received[: result.paths_bytes]).decode("ascii"),
            numbers=base64.b64encode(received[result.paths_bytes :]).decode("ascii"),
        )

    async def kill(self, pid: int, signal: int | str = "TERM", *, group: bool = False) -> None:
        """Send ``signal`` (number or name like "KILL") to ``pid`` (or its group).

        Raises NotFound if there is no such process, InvalidInput for pid <= 1.
        """
        args = _model(KillArgs, pid=pid, signal=_signal_number(signal), group=group)
        await self._call(Op.KILL, args)

    async def restore_status(self, wait_s: float = 0.0) -> RestoreStatus:
        """What the guest made of its latest restore (generation, processes told, hooks
        run), waiting up to ``wait_s`` for its hooks to finish."""
        args = _model(RestoreStatusArgs, wait_s=wait_s)
        idle = None if self._request_timeout is None else self._request_timeout + wait_s
        resp = await self._call(Op.RESTORE_STATUS, args, timeout=idle)
        return self._decode(RestoreStatus, resp)

    async def restore_identity(
        self, time_ns: int, entropy: bytes, hostname: str | None = None
    ) -> RestoreIdentityResult:
        """After a restore/fork: set the guest clock to ``time_ns`` (ns since the epoch),
        mix ``entropy`` (16..4096 bytes) into the kernel RNG and reseed it, and set the
        hostname. Raises InvalidInput for bad values or if the agent lacks privileges."""
        args = _model(RestoreIdentityArgs, time_ns=time_ns, entropy=entropy, hostname=hostname)
        return await self._simple(Op.RESTORE_IDENTITY, args, RestoreIdentityResult)


def fresh_identity(
    token: str, hostname: str, restore: RestoreFacts | None = None
) -> RestoreIdentityArgs:
    """The host's clock and 64 fresh random bytes, for the restore named ``token``
    (``restore``: what it was, for the guest's processes)."""
    return RestoreIdentityArgs(time.time_ns(), os.urandom(64), hostname, token, restore)


async def confirm_restore(
    path: str | os.PathLike[str],
    identity: RestoreIdentityArgs,
    timeout: float,
    hook_timeout_s: float,
) -> RestoreStatus:
    """Hand a just-restored guest its identity and wait for what it did with it: the
    processes told (before the hello answers) and its restore hooks run (each within
    ``hook_timeout_s``). :raises AgentError: it did not answer within ``timeout`` s."""
    async with await AgentClient.connect(path, timeout=timeout, identity=identity) as agent:
        status = await agent.restore_status()
        if status.hooks_running:
            wait = min(hook_timeout_s * max(1, status.hooks) + 5.0, 2 * MAX_HOOK_TIMEOUT_S)
            status = await agent.restore_status(wait_s=wait)
        return status


async def post_identity(
    path: str | os.PathLike[str], identity: RestoreIdentityArgs, timeout: float = _POST_TIMEOUT_S
) -> bool:
    """Hand a just-restored guest its identity without waiting for it to answer.

    Under TCG a restored guest needs a good part of a second before its agent answers;
    the VM is usable long before. Returns once QEMU has moved the request into the
    guest's receive buffers (nothing is lost when we hang up then), or False if it did
    not within ``timeout`` s. Every later connection sends the identity again in its
    hello, so a lost one is applied by the next user of the agent at the latest.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        _, writer = await _open(path, deadline, timeout)
    except AgentError:
        return False
    try:
        writer.write(SYNC_MAGIC + _hello_frame(1, secrets.token_hex(8), identity))
        await writer.drain()
        sock = writer.get_extra_info("socket")
        while _unread_bytes(sock.fileno()) > 0:
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.001)
        return True
    except OSError:
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _open(
    path: str | os.PathLike[str], deadline: float, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect, retrying while the socket is missing or refuses, until ``deadline``."""
    refused: OSError | None = None

    async def attempt() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        nonlocal refused
        try:
            return await asyncio.open_unix_connection(os.fspath(path))
        except (FileNotFoundError, ConnectionRefusedError) as e:
            refused = e  # not there yet (QEMU creates it a few ms after starting)
            return None
        except OSError as e:
            raise AgentError(f"cannot connect to the agent socket {path}: {e}") from e

    def timed_out() -> AgentError:
        reason = refused.strerror or refused if refused else "timed out"
        return AgentError(
            f"cannot connect to the agent socket {os.fspath(path)} within {timeout:g} s: {reason}"
        )

    return await poll_until(
        attempt,
        timeout_s=deadline - asyncio.get_running_loop().time(),
        timed_out=timed_out,
        interval_s=_CONNECT_RETRY_S,
    )


def _hello_frame(rid: int, nonce: str, identity: RestoreIdentityArgs | None) -> bytes:
    args = HelloArgs(nonce, PROTOCOL_VERSION, identity)
    return encode_frame(request_message(rid, Op.HELLO, to_wire(args)))


def _unread_bytes(fd: int) -> int:
    """Bytes we sent on a unix socket that the peer has not read yet (SIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0])


def _chunks(data: bytes | bytearray | memoryview | IO[bytes]) -> Iterator[bytes]:
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_BYTES):
            yield bytes(view[start : start + CHUNK_BYTES])
        return
    while chunk := data.read(CHUNK_BYTES):
        yield chunk
