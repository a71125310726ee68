"""Crash points: a test-only switch that makes forkpoint SIGKILL itself at a named step.

Every step of create, checkpoint, fork, rollback, rm and GC that writes a file, changes
the store, starts or stops a process calls :func:`point` with a stable name. Normally
that is one test of a module global (the switch is read once, at import). The fault
campaign (``tests/faults_campaign.py``) sets, for one forkpoint process:

- ``FORKPOINT_CRASH_TRACE=FILE``: append every point passed to FILE, one name a line
  (how the campaign learns which points an operation passes, in order);
- ``FORKPOINT_CRASH_AT=N``: SIGKILL at the Nth point passed (1-based), or
  ``FORKPOINT_CRASH_AT=NAME`` / ``NAME#K``: at the first (Kth) pass of that point.

SIGKILL, not an exception: nothing of Python's cleanup runs, exactly as when the host
kills the process, and QEMU and passt (in their own sessions) live on.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["CRASH_AT_ENV", "CRASH_TRACE_ENV", "point"]

CRASH_AT_ENV = "FORKPOINT_CRASH_AT"
CRASH_TRACE_ENV = "FORKPOINT_CRASH_TRACE"

_CRASH_AT = os.environ.get(CRASH_AT_ENV, "")
_TRACE = os.environ.get(CRASH_TRACE_ENV, "")
_ACTIVE = bool(_CRASH_AT or _TRACE)
_lock = threading.Lock()  # points are passed from worker threads too
_passed = 0
_passed_by_name: dict[str, int] = {}


def point(name: str) -> None:
    """A step named ``name`` is about to be, or has just been, made durable."""
    if _ACTIVE:
        _pass(name)


def _pass(name: str) -> None:
    global _passed
    with _lock:
        _passed += 1
        count = _passed_by_name[name] = _passed_by_name.get(name, 0) + 1
        if _TRACE:
            with open(_TRACE, "a") as trace:
                trace.write(name + "\n")
        if _CRASH_AT and _matches(_CRASH_AT, name, count, _passed):
            os.kill(os.getpid(), signal.SIGKILL)


def _matches(spec: str, name: str, count: int, passed: int) -> bool:
    if spec.isdigit():
        return int(spec) == passed
    wanted, _, nth = spec.partition("#")
    return wanted == name and (int(nth) if nth else 1) == count
