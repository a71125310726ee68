"""The envd-like process model: processes the agent owns, whose output one can attach to.

``proc_start`` starts a process and streams ``start`` (its pid) first, then its output,
then how it ended. The process belongs to the agent, not to the request: a host that
goes away (or cancels its stream) leaves it running; ``proc_attach`` streams it again.
Output goes to whoever is attached now (nobody: it is read and dropped, so the process
never blocks on a full pipe); an attached host that reads slowly slows the process down
(flow control, ``streams``). Exit codes of the last ``_KEEP_ENDED`` ended processes are
kept for late attaches and ``proc_list``. All of it is guest memory, so a checkpoint
keeps the table, and a fork or rollback can attach to processes started before it.

A process started with ``pty`` runs on a pseudo-terminal of its own: the slave is its
controlling terminal and its stdin, stdout and stderr; the agent keeps the master, whose
output streams as ``pty`` events, which ``proc_input`` types into and ``proc_resize``
resizes (the kernel sends the foreground group SIGWINCH).
"""

from __future__ import annotations

import collections
import errno
import fcntl
import os
import selectors
import signal
import struct
import subprocess
import termios
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

from ..protocol import (
    STREAM_READ_BYTES,
    Empty,
    ErrorCode,
    EventKind,
    PidArgs,
    ProcAttachArgs,
    ProcEndResult,
    ProcInputArgs,
    ProcListResult,
    ProcResizeArgs,
    ProcSignalArgs,
    ProcStartArgs,
    PtySize,
    TrackedProcessInfo,
)
from .context import ConnectionGone, Context, GuestError
from .image_config import image_defaults
from .procs import DEFAULT_PATH, start_error
from .streams import Stream, StreamRegistry
from .users import Account, account

__all__ = ["ProcessTable", "process_env"]

_KEEP_ENDED: Final = 256
# After the process exits, wait this long (s) for EOF before reporting its end: a
# background grandchild may keep the pipes open (they are still drained, never closed
# under it, so it gets no SIGPIPE).
_EXIT_GRACE_S: Final = 0.2
_DEFAULT_TERM: Final = "xterm-256color"


def process_env(acct: Account | None, extra: dict[str, str]) -> dict[str, str]:
    """PATH, HOME, USER, LOGNAME (the account's, root's without one), LANG + ``extra``."""
    name, home = (acct.name, acct.home) if acct is not None else ("root", "/root")
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "USER": name,
        "LOGNAME": name,
        "LANG": "C.UTF-8",
    }
    if acct is not None:
        env["SHELL"] = acct.shell
    env.update(extra)
    return env


@dataclass
class _Tracked:
    args: ProcStartArgs
    cwd: str
    popen: subprocess.Popen[bytes]
    pty: int | None = None  # the master side of its PTY
    pty_closed: bool = False  # under both locks: after its end, once drained
    lock: threading.Lock = field(default_factory=threading.Lock)
    stdin_lock: threading.Lock = field(default_factory=threading.Lock)
    subscribers: list[Stream] = field(default_factory=list)
    ended: bool = False
    exit_code: int | None = None
    signal: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def info(self) -> TrackedProcessInfo:
        a = self.args
        return TrackedProcessInfo(
            pid=self.pid, argv=list(a.argv), cwd=self.cwd, env=dict(a.env), user=a.user,
            tag=a.tag, stdin=a.stdin, running=not self.ended, exit_code=self.exit_code,
            signal=self.signal, pty=self.pty is not None,
        )  # fmt: skip

    def end_result(self) -> ProcEndResult:
        return ProcEndResult(self.pid, True, self.exit_code, self.signal)


class ProcessTable:
    """Handlers of the proc_* ops; ``streams`` does the flow control of their output."""

    def __init__(self, streams: StreamRegistry) -> None:
        self._streams = streams
        self._running: dict[int, _Tracked] = {}
        self._ended: collections.OrderedDict[int, _Tracked] = collections.OrderedDict()
        self._lock = threading.Lock()

    # -- handlers ----------------------------------------------------------------------

    def start(self, ctx: Context, args: ProcStartArgs) -> ProcEndResult:
        """Start the process; stream start, output, end. Raises GuestError (not_found
        for a missing command, cwd or user)."""
        acct = account(args.user) if args.user is not None else None
        defaults = image_defaults()  # an OCI image's WORKDIR and ENV (not its USER: E2B names one)
        cwd = args.cwd or defaults.cwd or (acct.home if acct is not None else _root_cwd())
        user_kw: dict[str, Any] = {}
        if acct is not None:
            user_kw = {"user": acct.uid, "group": acct.gid, "extra_groups": list(acct.groups)}
        env = process_env(acct, {**defaults.env, **args.env})
        master = terminal = None
        if args.pty is not None:
            master, terminal = _open_pty(args.pty)
            env.setdefault("TERM", _DEFAULT_TERM)
            io: dict[str, Any] = {
                "stdin": terminal, "stdout": terminal, "stderr": terminal,
                "preexec_fn": _take_controlling_terminal,
            }  # fmt: skip
        else:
            stdin = subprocess.PIPE if args.stdin else subprocess.DEVNULL
            io = {"stdin": stdin, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        try:
            popen = subprocess.Popen(
                args.argv,
                cwd=cwd,
                env=env,
                start_new_session=True,  # its own group: signals and the timeout reach all
                **io,
                **user_kw,
            )
        except OSError as e:
            if master is not None:
                os.close(master)
            raise start_error(e, args.argv, cwd) from None
        finally:
            if terminal is not None:
                os.close(terminal)  # the process holds it now: EOF when it is gone
        tracked = _Tracked(args, cwd, popen, pty=master)
        stream = self._streams.open(ctx, args.window)
        tracked.subscribers.append(stream)
        with self._lock:
            self._ended.pop(tracked.pid, None)
            self._running[tracked.pid] = tracked
        # The start event goes out before the pump runs: nothing can precede it.
        stream.send(EventKind.START, str(tracked.pid).encode())
        threading.Thread(
            target=self._pump, args=(tracked,), name=f"proc-{tracked.pid}", daemon=True
        ).start()
        return self._follow(ctx, tracked, stream)

    def attach(self, ctx: Context, args: ProcAttachArgs) -> ProcEndResult:
        """Stream start, then new output and the end. Raises GuestError not_found."""
        tracked = self._get(args.pid)
        stream = self._streams.open(ctx, args.window)
        # Start and subscribe under the pump's lock: once the client has the start event
        # (and may type), every later byte of output reaches this stream, after the start.
        with tracked.lock:
            if not stream.send(EventKind.START, str(tracked.pid).encode()):
                self._streams.close(stream)
                raise ConnectionGone
            if tracked.ended:
                self._streams.close(stream)
                return tracked.end_result()
            tracked.subscribers.append(stream)
        return self._follow(ctx, tracked, stream)

    def _follow(self, ctx: Context, tracked: _Tracked, stream: Stream) -> ProcEndResult:
        """Wait until the process ended (its end) or the stream was cancelled."""
        try:
            if stream.wait_done():
                return tracked.end_result()
            if not ctx.alive:
                raise ConnectionGone
            return ProcEndResult(tracked.pid, False)
        finally:
            with tracked.lock:
                if stream in tracked.subscribers:
                    tracked.subscribers.remove(stream)
            self._streams.close(stream)

    def input(self, ctx: Context, args: ProcInputArgs) -> Empty:
        """Write to its stdin, or type into its PTY (blocks while the pipe or the
        terminal's input queue is full). Raises GuestError."""
        tracked = self._get(args.pid)
        if tracked.pty is not None:
            with tracked.stdin_lock:
                _type_into(tracked, args.data)
            return Empty()
        with tracked.stdin_lock:
            pipe = self._stdin_of(tracked)
            try:
                pipe.write(args.data)
                pipe.flush()
            except (BrokenPipeError, ValueError):
                raise GuestError(
                    ErrorCode.CONFLICT, f"process {args.pid} no longer reads its stdin"
                ) from None
        return Empty()

    def close_stdin(self, ctx: Context, args: PidArgs) -> Empty:
        tracked = self._get(args.pid)
        if tracked.pty is not None:
            raise GuestError(
                ErrorCode.CONFLICT,
                f"process {args.pid} reads a terminal: send it ^D (\\x04) to end its input",
            )
        with tracked.stdin_lock:
            pipe = self._stdin_of(tracked)
            try:
                pipe.close()
            except BrokenPipeError:
                pass
        return Empty()

    def signal(self, ctx: Context, args: ProcSignalArgs) -> Empty:
        """Signal the process's group. Raises GuestError not_found once it has ended."""
        tracked = self._get(args.pid)
        if tracked.ended:
            raise GuestError(ErrorCode.NOT_FOUND, f"process {args.pid} has already ended")
        try:
            os.killpg(tracked.pid, args.signal)
        except ProcessLookupError:
            raise GuestError(ErrorCode.NOT_FOUND, f"no such process: {args.pid}") from None
        return Empty()

    def resize(self, ctx: Context, args: ProcResizeArgs) -> Empty:
        """Set its PTY's window size. Raises GuestError (conflict: it has no PTY)."""
        tracked = self._get(args.pid)
        with tracked.lock:
            if tracked.ended or tracked.pty is None or tracked.pty_closed:
                what = "was started without a PTY" if tracked.pty is None else "has ended"
                raise GuestError(ErrorCode.CONFLICT, f"process {args.pid} {what}")
            _set_size(tracked.pty, args.size)
        return Empty()

    def list_processes(self, ctx: Context, args: Empty) -> ProcListResult:
        """Running processes, then recently ended ones, each by pid."""
        with self._lock:
            tracked = [*sorted(self._running.values(), key=lambda t: t.pid), *self._ended.values()]
        return ProcListResult(processes=[t.info() for t in tracked])

    # -- internals ---------------------------------------------------------------------

    def _get(self, pid: int) -> _Tracked:
        with self._lock:
            tracked = self._running.get(pid) or self._ended.get(pid)
        if tracked is None:
            raise GuestError(ErrorCode.NOT_FOUND, f"no process {pid} was started by the agent")
        return tracked

    @staticmethod
    def _stdin_of(tracked: _Tracked) -> Any:
        pipe = tracked.popen.stdin
        if pipe is None:
            raise GuestError(ErrorCode.CONFLICT, f"process {tracked.pid} was started without stdin")
        if pipe.closed:
            raise GuestError(ErrorCode.CONFLICT, f"stdin of process {tracked.pid} is closed")
        return pipe

    def _pump(self, tracked: _Tracked) -> None:
        """Read its output and fan it out, enforce the timeout, record the end."""
        popen = tracked.popen
        sel = selectors.DefaultSelector()
        kinds: dict[int, EventKind] = {}
        if tracked.pty is not None:
            kinds[tracked.pty] = EventKind.PTY
        for pipe, kind in ((popen.stdout, EventKind.STDOUT), (popen.stderr, EventKind.STDERR)):
            if pipe is not None:
                kinds[pipe.fileno()] = kind
        for fd in kinds:
            sel.register(fd, selectors.EVENT_READ)
        pidfd = -1
        try:
            pidfd = os.pidfd_open(popen.pid)
            sel.register(pidfd, selectors.EVENT_READ)
        except (OSError, AttributeError):
            pass  # old kernel: poll
        timeout = tracked.args.timeout
        deadline = time.monotonic() + timeout if timeout else None
        exited_at: float | None = None
        try:
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    _kill_group(popen.pid)
                    deadline = None
                if exited_at is None and pidfd < 0 and popen.poll() is not None:
                    exited_at = now
                if exited_at is not None and (not kinds or now >= exited_at + _EXIT_GRACE_S):
                    break
                for key, _ in sel.select(_select_wait(deadline, exited_at, pidfd)):
                    if key.fd == pidfd:
                        sel.unregister(pidfd)
                        exited_at = time.monotonic()
                    else:
                        self._read_one(tracked, sel, kinds, key.fd)
            self._finish(tracked)
            # A grandchild may still hold the pipes: drain them until it lets go.
            while kinds:
                for key, _ in sel.select(None):
                    if key.fd in kinds and not _read(key.fd):
                        sel.unregister(key.fd)
                        del kinds[key.fd]
        finally:
            sel.close()
            if pidfd >= 0:
                os.close(pidfd)
            for pipe in (popen.stdout, popen.stderr):
                if pipe is not None:
                    pipe.close()
            if tracked.pty is not None:
                with tracked.stdin_lock, tracked.lock:  # not while typing or resizing
                    os.close(tracked.pty)
                    tracked.pty_closed = True

    @staticmethod
    def _read_one(
        tracked: _Tracked, sel: selectors.BaseSelector, kinds: dict[int, EventKind], fd: int
    ) -> None:
        data = _read(fd)
        if not data:
            sel.unregister(fd)
            del kinds[fd]
            return
        with tracked.lock:
            subscribers = list(tracked.subscribers)
        for stream in subscribers:
            if not stream.send(kinds[fd], data):
                with tracked.lock:
                    if stream in tracked.subscribers:
                        tracked.subscribers.remove(stream)

    def _finish(self, tracked: _Tracked) -> None:
        rc = tracked.popen.wait()
        with tracked.stdin_lock:
            if tracked.popen.stdin is not None and not tracked.popen.stdin.closed:
                try:
                    tracked.popen.stdin.close()
                except BrokenPipeError:
                    pass
        with tracked.lock:
            tracked.signal = -rc if rc < 0 else None
            tracked.exit_code = 128 - rc if rc < 0 else rc
            tracked.ended = True
            subscribers, tracked.subscribers = tracked.subscribers, []
        with self._lock:
            if self._running.get(tracked.pid) is tracked:
                del self._running[tracked.pid]
            self._ended[tracked.pid] = tracked
            while len(self._ended) > _KEEP_ENDED:
                self._ended.popitem(last=False)
        for stream in subscribers:
            stream.finish()


def _select_wait(deadline: float | None, exited_at: float | None, pidfd: int) -> float | None:
    now = time.monotonic()
    limits = [t for t in (deadline, None if exited_at is None else exited_at + _EXIT_GRACE_S) if t]
    wait = max(min(limits) - now, 0.0) if limits else None
    if pidfd < 0:
        wait = 0.05 if wait is None else min(wait, 0.05)
    return wait


def _read(fd: int) -> bytes:
    """Up to a chunk of output; b"" at its end (a PTY's master says EIO once the last
    process holding its terminal is gone)."""
    try:
        return os.read(fd, STREAM_READ_BYTES)
    except OSError as e:
        if e.errno == errno.EIO:
            return b""
        raise


def _open_pty(size: PtySize) -> tuple[int, int]:
    """A new PTY of ``size``: (master, terminal)."""
    master, terminal = os.openpty()
    _set_size(terminal, size)
    return master, terminal


def _set_size(fd: int, size: PtySize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


def _take_controlling_terminal() -> None:
    """In the child, after ``setsid``: its stdin (the PTY) becomes its controlling
    terminal, so a shell gets job control and ^C reaches its foreground group."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _type_into(tracked: _Tracked, data: bytes) -> None:
    """Under ``stdin_lock``."""
    assert tracked.pty is not None
    if tracked.pty_closed:
        raise GuestError(ErrorCode.CONFLICT, f"process {tracked.pid} has ended")
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(tracked.pty, view) :]
    except OSError:
        raise GuestError(
            ErrorCode.CONFLICT, f"process {tracked.pid}'s terminal is closed"
        ) from None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _root_cwd() -> str:
    return "/root" if os.path.isdir("/root") and os.access("/root", os.X_OK) else "/"
