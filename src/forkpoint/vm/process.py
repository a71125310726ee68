"""QEMU processes that outlive the forkpoint process that started them.

A VM is found again by its pid (pidfile or store) and recognised by the unique ``-name``
in its command line, so a recycled pid is never mistaken for it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["exit_status", "is_running", "kill_and_wait", "spawn_detached"]

# Children we spawned, kept so they are reaped instead of lingering as zombies.
_children: dict[int, subprocess.Popen[bytes]] = {}


def spawn_detached(argv: list[str], log: Path, pass_fds: tuple[int, ...] = ()) -> int:
    """Start ``argv`` in its own session with stdout/stderr appended to ``log``."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    _children[proc.pid] = proc
    return proc.pid


def exit_status(pid: int) -> str:
    """How a child we spawned ended ("exit code 1", "killed by SIGKILL"), if known."""
    proc = _children.get(pid)
    code = proc.poll() if proc is not None else None
    if code is None:
        return "unknown exit status"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _reap(pid: int) -> None:
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        del _children[pid]


def is_running(pid: int | None, marker: str) -> bool:
    """True if ``pid`` is alive, not a zombie, and its command line contains ``marker``."""
    if not pid:
        return False
    _reap(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        return False
    if not cmdline:
        # Mid-exec (just spawned) or mid-exit, /proc shows no command line for a moment.
        child = _children.get(pid)
        return child.poll() is None if child is not None else state != "I"
    return marker.encode() in cmdline


def kill_and_wait(pid: int | None, marker: str, timeout_s: float = 10.0) -> None:
    """SIGKILL the process if it is ours and wait until it is gone."""
    if not is_running(pid, marker):
        return
    assert pid is not None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        proc = _children.pop(pid, None)
        if proc is not None:
            proc.wait(timeout_s)
            return
        deadline = time.monotonic() + timeout_s
        while is_running(pid, marker) and time.monotonic() < deadline:
            select.select([pidfd], [], [], 0.05)
    finally:
        os.close(pidfd)
