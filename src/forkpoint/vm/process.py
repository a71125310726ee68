"""QEMU processes that outlive the forkpoint process that started them.

A VM is found again by its pid (pidfile or store) and recognised by the unique ``-name``
in its command line, so a recycled pid is never mistaken for it. Children are started
with ``posix_spawn`` (no Popen object to outlive, or to warn about at exit) and reaped
here, so a long-running server never collects zombies.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "Dying",
    "exit_status",
    "is_running",
    "kill",
    "kill_and_wait",
    "pids_with_arg",
    "spawn_detached",
    "stat_fields",
]

# Children we spawned and have not reaped yet, and the wait statuses of those we have.
_children: set[int] = set()
_exited: dict[int, int] = {}


def spawn_detached(argv: list[str], log: Path, pass_fds: tuple[int, ...] = ()) -> int:
    """Start ``argv`` in its own session, stdin from /dev/null, stdout/stderr appended to
    ``log``; the file descriptors in ``pass_fds`` are inherited under the same numbers."""
    with log.open("ab") as out:
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
            (os.POSIX_SPAWN_DUP2, out.fileno(), 2),
        ]
        # dup2 onto itself clears close-on-exec in the child only: no other thread's
        # child can inherit these descriptors by accident.
        actions += [(os.POSIX_SPAWN_DUP2, fd, fd) for fd in pass_fds]
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=actions, setsid=True)
    _children.add(pid)
    return pid


def _reap(pid: int) -> None:
    if pid not in _children:
        return
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        _children.discard(pid)
        return
    if done:
        _children.discard(pid)
        _exited[pid] = status


def exit_status(pid: int) -> str:
    """How a child we spawned ended ("exit code 1", "killed by SIGKILL"), if known."""
    _reap(pid)
    if pid not in _exited:
        return "unknown exit status"
    code = os.waitstatus_to_exitcode(_exited[pid])
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from its third field on (the state; index 11 is utime, 19
    starttime), split after the command name, which may hold spaces; None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def is_running(pid: int | None, marker: str) -> bool:
    """True if ``pid`` is alive, not a zombie, and its command line contains ``marker``."""
    if not pid:
        return False
    _reap(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    fields = stat_fields(pid)
    if fields is None:
        return False
    state = fields[0]
    if state in ("Z", "X"):
        return False
    if not cmdline:
        # Mid-exec (just spawned) or mid-exit, /proc shows no command line for a moment.
        return pid in _children or state != "I"
    return marker.encode() in cmdline


def kill_and_wait(pid: int | None, marker: str, timeout_s: float = 10.0) -> None:
    """SIGKILL the process if it is ours and wait until it is gone (reaped if our child)."""
    kill([(pid, marker)]).wait(timeout_s)


class Dying:
    """Processes sent SIGKILL and not yet waited for (see :func:`kill`)."""

    def __init__(self, pidfds: dict[int, int]) -> None:
        self._pidfds = pidfds  # pid → pidfd

    def wait(self, timeout_s: float = 10.0) -> None:
        """Return once all are gone (reaped if our children), or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            waiting = list(self._pidfds.values())
            while waiting and (left := deadline - time.monotonic()) > 0:
                # A pidfd becomes readable when the process exits, child or not.
                done, _, _ = select.select(waiting, [], [], left)
                waiting = [fd for fd in waiting if fd not in done]
        finally:
            for pid, pidfd in self._pidfds.items():
                _reap(pid)
                os.close(pidfd)
            self._pidfds = {}


def kill(targets: Iterable[tuple[int | None, str]]) -> Dying:
    """SIGKILL each ``(pid, marker)`` that runs and is ours (see :func:`is_running`) at
    once; :meth:`Dying.wait` waits for them all to be gone."""
    pidfds: dict[int, int] = {}
    for pid, marker in targets:
        if pid is None or pid in pidfds or not is_running(pid, marker):
            continue
        try:
            pidfds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return Dying(pidfds)


def pids_with_arg(matches: Callable[[str], bool]) -> list[tuple[int, str]]:
    """``(pid, argument)`` of every process with a command-line argument that ``matches``:
    finds VMs (by ``-name``) and helpers whose pid was never recorded, e.g. when the
    forkpoint process starting them was killed."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in argv:
            text = arg.decode(errors="replace")
            if matches(text):
                found.append((int(entry.name), text))
                break
    return found
