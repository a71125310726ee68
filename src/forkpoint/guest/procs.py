"""Process ops: exec (run to completion, streaming), spawn (detached), ps, kill."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from typing import IO, Any, Final

from ..protocol import (
    Empty,
    ErrorCode,
    EventKind,
    ExecArgs,
    ExecResult,
    KillArgs,
    ProcessInfo,
    PsResult,
    SpawnArgs,
    SpawnResult,
)
from .context import Context, GuestError
from .image_config import image_defaults, resolve_user
from .users import Account

__all__ = ["DEFAULT_PATH", "ProcessOps", "command_env", "start_error"]

DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_READ_BYTES: Final = 64 * 1024
_STDIN_BYTES: Final = 64 * 1024
# After the command exits, wait this long (s) for EOF on its pipes: a background
# grandchild may hold them open forever.
_EXIT_GRACE_S: Final = 0.2


def command_env(extra: dict[str, str]) -> dict[str, str]:
    """A clean environment (the agent's own, e.g. PYTHONPATH, does not leak) + ``extra``."""
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        # The guest CPU (qemu64) says AuthenticAMD, so OpenBLAS (numpy's, matplotlib's)
        # picks its Opteron kernels, whose instructions that model lacks: SIGILL. Prescott
        # is exactly qemu64's level (SSE3).
        "OPENBLAS_CORETYPE": "Prescott",
    }
    env.update(extra)
    return env


def _identity(
    user: str | None, cwd: str | None, env: dict[str, str]
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """cwd, environment and Popen user arguments of a command: what it asks for, else the
    image's ``WORKDIR``/``ENV``/``USER`` (OCI images), else root in ``/root``."""
    defaults = image_defaults()
    spec = user if user is not None else defaults.user
    acct: Account | None = resolve_user(spec) if spec is not None else None
    merged = {**defaults.env, **env}
    if acct is None:
        return cwd or defaults.cwd or _default_cwd(), command_env(merged), {}
    home_env = {"HOME": acct.home, "USER": acct.name, "LOGNAME": acct.name}
    user_kw = {"user": acct.uid, "group": acct.gid, "extra_groups": list(acct.groups)}
    fallback = acct.home if os.path.isdir(acct.home) else "/"  # as docker run: "/" if none
    return cwd or defaults.cwd or fallback, command_env({**home_env, **merged}), user_kw


def _argv(argv: list[str] | None, shell: str | None) -> list[str]:
    return argv if argv is not None else ["/bin/sh", "-c", shell or ""]


def _default_cwd() -> str:
    return "/root" if os.path.isdir("/root") and os.access("/root", os.X_OK) else "/"


def start_error(e: OSError, argv: list[str], cwd: str) -> GuestError:
    """Why Popen failed, naming the command or the working directory."""
    what = f"working directory {cwd}" if e.filename == cwd else f"command {argv[0]!r}"
    if isinstance(e, FileNotFoundError):
        if e.filename == cwd:
            return GuestError(ErrorCode.NOT_FOUND, f"working directory not found: {cwd}")
        return GuestError(ErrorCode.NOT_FOUND, f"command not found: {argv[0]}")
    if isinstance(e, PermissionError):
        return GuestError(ErrorCode.PERMISSION_DENIED, f"permission denied: {what}")
    if isinstance(e, NotADirectoryError):
        return GuestError(ErrorCode.INVALID_INPUT, f"not a directory: {cwd}")
    return GuestError(ErrorCode.INVALID_INPUT, f"cannot start {what}: {e.strerror or e}")


class _Output:
    """Collected output of one stream, capped at ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.truncated = False

    def add(self, data: bytes) -> None:
        room = self.limit - self.size
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        if data:
            self.parts.append(data)
            self.size += len(data)

    def value(self) -> bytes:
        return b"".join(self.parts)


class ProcessOps:
    """Handlers for exec, spawn, ps and kill. ``log_dir``: where spawn writes its logs."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def exec(self, ctx: Context, args: ExecArgs) -> ExecResult:
        """Run to completion. Raises GuestError (not_found, timeout, ...)."""
        argv = _argv(args.argv, args.shell)
        cwd, env, user_kw = _identity(args.user, args.cwd, args.env)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE if args.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills all of it
                **user_kw,
            )
        except OSError as e:
            raise start_error(e, argv, cwd) from None
        try:
            out, err, timed_out = self._pump(ctx, proc, args, started)
        finally:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        if timed_out:
            shown = args.shell if args.shell is not None else " ".join(argv)
            raise GuestError(
                ErrorCode.TIMEOUT,
                f"command timed out after {args.timeout:g} s and was killed: {shown}",
            )
        rc = proc.wait()
        sig = -rc if rc < 0 else None
        return ExecResult(
            exit_code=128 + sig if sig is not None else rc,
            signal=sig,
            stdout=out.value(),
            stderr=err.value(),
            truncated=out.truncated or err.truncated,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            pid=proc.pid,
        )

    def _pump(
        self, ctx: Context, proc: subprocess.Popen[bytes], args: ExecArgs, started: float
    ) -> tuple[_Output, _Output, bool]:
        """Move stdin/stdout/stderr until the command is done; kill it on timeout."""
        out, err = _Output(args.max_output), _Output(args.max_output)
        sel = selectors.DefaultSelector()
        streams: dict[int, tuple[_Output, EventKind]] = {}
        for pipe, collected, kind in (
            (proc.stdout, out, EventKind.STDOUT),
            (proc.stderr, err, EventKind.STDERR),
        ):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe.fileno(), selectors.EVENT_READ)
            streams[pipe.fileno()] = (collected, kind)
        stdin: IO[bytes] | None = proc.stdin
        pending = memoryview(args.stdin or b"")
        if stdin is not None:
            os.set_blocking(stdin.fileno(), False)
            sel.register(stdin.fileno(), selectors.EVENT_WRITE)
        pidfd = -1
        try:
            pidfd = os.pidfd_open(proc.pid)
            sel.register(pidfd, selectors.EVENT_READ)
        except (OSError, AttributeError):
            pass  # old kernel: fall back to polling proc.poll()
        deadline = started + args.timeout if args.timeout is not None else None
        exit_deadline: float | None = None
        try:
            while streams:
                now = time.monotonic()
                if exit_deadline is None and pidfd < 0 and proc.poll() is not None:
                    exit_deadline = now + _EXIT_GRACE_S
                limits = [t for t in (deadline, exit_deadline) if t is not None]
                if limits and now >= min(limits):
                    if deadline is not None and now >= deadline and exit_deadline is None:
                        self._kill_group(proc)
                        return out, err, True
                    break  # exited; a background child keeps the pipes open
                wait = min(limits) - now if limits else None
                if pidfd < 0:
                    wait = 0.05 if wait is None else min(wait, 0.05)
                for key, _ in sel.select(wait):
                    fd = key.fd
                    if fd == pidfd:
                        sel.unregister(pidfd)
                        exit_deadline = time.monotonic() + _EXIT_GRACE_S
                    elif stdin is not None and fd == stdin.fileno():
                        try:
                            n = os.write(fd, pending[:_STDIN_BYTES])
                            pending = pending[n:]
                        except BlockingIOError:
                            continue
                        except OSError:  # the command closed stdin
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(fd)
                            stdin.close()
                            stdin = None
                    else:
                        try:
                            data = os.read(fd, _READ_BYTES)
                        except BlockingIOError:
                            continue
                        collected, kind = streams[fd]
                        if not data:
                            sel.unregister(fd)
                            del streams[fd]
                            continue
                        collected.add(data)
                        if args.stream:
                            ctx.emit(kind, data)
            if deadline is not None and proc.poll() is None:
                # Pipes closed but the command still runs: wait for it within the timeout.
                try:
                    proc.wait(max(deadline - time.monotonic(), 0))
                except subprocess.TimeoutExpired:
                    self._kill_group(proc)
                    return out, err, True
            return out, err, False
        finally:
            sel.close()
            if pidfd >= 0:
                os.close(pidfd)

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def spawn(self, ctx: Context, args: SpawnArgs) -> SpawnResult:
        """Start a detached command; output goes to ``<log_dir>/<pid>.log``.

        It gets its own session (setsid), so it survives host disconnects, agent
        restarts and checkpoint/fork/rollback. Raises GuestError if it cannot start.
        """
        argv = _argv(args.argv, args.shell)
        cwd, env, user_kw = _identity(args.user, args.cwd, args.env)
        os.makedirs(self.log_dir, exist_ok=True)
        tmp_log = os.path.join(self.log_dir, f".spawn-{os.getpid()}-{threading.get_ident()}.log")
        with open(tmp_log, "ab") as log:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    **user_kw,
                )
            except OSError as e:
                os.unlink(tmp_log)
                raise start_error(e, argv, cwd) from None
        log_path = os.path.join(self.log_dir, f"{proc.pid}.log")
        os.replace(tmp_log, log_path)  # the command keeps writing through its open fd
        # Reap it when it exits (no zombie while the agent lives); if the agent dies
        # first, init inherits it.
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
        return SpawnResult(pid=proc.pid, log_path=log_path)

    def ps(self, ctx: Context, args: Empty) -> PsResult:
        """All processes except kernel threads, from /proc."""
        procs: list[ProcessInfo] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read().decode("utf-8", "replace")
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue  # exited meanwhile
            comm = stat[stat.find("(") + 1 : stat.rfind(")")]
            fields = stat[stat.rfind(")") + 2 :].split()
            pid, ppid = int(entry), int(fields[1])
            if pid == 2 or ppid == 2:  # kthreadd and its kernel threads
                continue
            parts = cmdline.rstrip(b"\x00").split(b"\x00")
            cmd = " ".join(p.decode("utf-8", "replace") for p in parts) if cmdline else f"[{comm}]"
            procs.append(ProcessInfo(pid=pid, ppid=ppid, cmd=cmd))
        procs.sort(key=lambda p: p.pid)
        return PsResult(processes=procs)

    def kill(self, ctx: Context, args: KillArgs) -> Empty:
        """Send a signal. Raises GuestError not_found if there is no such process."""
        if args.pid == os.getpid():
            raise GuestError(ErrorCode.INVALID_INPUT, "refusing to signal the agent itself")
        try:
            if args.group:
                os.killpg(args.pid, args.signal)
            else:
                os.kill(args.pid, args.signal)
        except ProcessLookupError:
            raise GuestError(ErrorCode.NOT_FOUND, f"no such process: {args.pid}") from None
        return Empty()
