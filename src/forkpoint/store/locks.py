"""Inter-process locks: ``flock`` on files under ``<home.root>/locks/``.

Several forkpoint processes (CLIs, a server) share one home. A session lock serializes
everything that changes one session (checkpoint, rollback, rm, port forwards); a global
lock covers the rare home-wide operations (e.g. ``global_lock(home, "ports")`` while
choosing host ports).

Locks are exclusive, not reentrant (a second acquire in the same process waits like any
other), and released when the ``with`` block exits or the process dies. The lock fds are
close-on-exec, so a QEMU started while a lock is held does not inherit it. Lock files are
never deleted: unlinking a lock file races with a process that has just opened it.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from pathlib import Path
from typing import TypedDict

from forkpoint.config import Home
from forkpoint.errors import Conflict, InvalidInput
from forkpoint.polling import poll_until, poll_until_sync

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "global_lock",
    "global_lock_async",
    "session_lock",
    "session_lock_async",
]

DEFAULT_LOCK_TIMEOUT_S = 60.0
_POLL_MIN_S = 0.002
_POLL_MAX_S = 0.05
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _lock_path(home: Home, key: str) -> Path:
    if not _KEY_RE.match(key):  # keys become file names: keep them inside locks/
        raise InvalidInput(f"invalid lock name: {key!r}")
    directory = home.root / "locks"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{key}.lock"


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try_lock(fd: int) -> bool | None:
    """True once locked; None while another holder has it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    return True


class _Waiting(TypedDict):
    timeout_s: float
    timed_out: Callable[[], BaseException]
    interval_s: float
    max_interval_s: float


def _waiting(timeout_s: float, busy: str) -> _Waiting:
    return {
        "timeout_s": timeout_s,
        "timed_out": lambda: Conflict(busy),
        "interval_s": _POLL_MIN_S,
        "max_interval_s": _POLL_MAX_S,
    }


@contextmanager
def _lock_file(path: Path) -> Iterator[int]:
    """The lock file's fd, unlocked (if it was locked) and closed on exit."""
    fd = _open(path)
    try:
        yield fd
    finally:
        # Unlock explicitly: a forked child sharing this open file would otherwise keep it.
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


@contextmanager
def _hold(path: Path, timeout_s: float, busy: str) -> Iterator[None]:
    with _lock_file(path) as fd:
        poll_until_sync(lambda: _try_lock(fd), **_waiting(timeout_s, busy))
        yield


@asynccontextmanager
async def _hold_async(path: Path, timeout_s: float, busy: str) -> AsyncIterator[None]:
    with _lock_file(path) as fd:

        async def locked() -> bool | None:
            return _try_lock(fd)

        await poll_until(locked, **_waiting(timeout_s, busy))
        yield


def _session_busy(session_id: str) -> str:
    return f"session {session_id} is busy (another forkpoint process holds it)"


def _global_busy(name: str) -> str:
    return f"forkpoint lock {name!r} is busy (another forkpoint process holds it)"


def session_lock(
    home: Home, session_id: str, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> AbstractContextManager[None]:
    """Hold the exclusive lock of one session (``with session_lock(home, sid): ...``).

    Waits up to ``timeout_s`` seconds.

    Raises:
        Conflict: another holder kept it for ``timeout_s`` seconds.
        InvalidInput: ``session_id`` is not a plain name.
    """
    return _hold(_lock_path(home, session_id), timeout_s, _session_busy(session_id))


def session_lock_async(
    home: Home, session_id: str, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> AbstractAsyncContextManager[None]:
    """``async with`` twin of :func:`session_lock` (polls, never blocks the event loop)."""
    return _hold_async(_lock_path(home, session_id), timeout_s, _session_busy(session_id))


def global_lock(
    home: Home, name: str, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> AbstractContextManager[None]:
    """Hold a home-wide lock named ``name`` (e.g. ``"ports"``, ``"gc"``).

    Raises:
        Conflict: another holder kept it for ``timeout_s`` seconds.
        InvalidInput: ``name`` is not a plain name.
    """
    return _hold(_lock_path(home, "global-" + name), timeout_s, _global_busy(name))


def global_lock_async(
    home: Home, name: str, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> AbstractAsyncContextManager[None]:
    """``async with`` twin of :func:`global_lock`."""
    return _hold_async(_lock_path(home, "global-" + name), timeout_s, _global_busy(name))
