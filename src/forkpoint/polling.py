"""Waiting for something that cannot be awaited directly: poll it until a deadline.

QEMU's monitor socket appearing, a migration finishing, an flock coming free: each is
checked, and checked again after a pause that grows from ``interval_s`` to
``max_interval_s`` (cheap while it comes fast, gentle while it takes long), until the
check gives a value or the time is up.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

__all__ = ["poll_until", "poll_until_sync"]

_T = TypeVar("_T")


async def poll_until(
    check: Callable[[], Awaitable[_T | None]],
    *,
    timeout_s: float,
    timed_out: Callable[[], BaseException],
    interval_s: float = 0.002,
    max_interval_s: float | None = None,
) -> _T:
    """Await ``check()`` until it returns something other than None, and return that.

    ``check`` is always called at least once, and once more at the deadline.
    :raises BaseException: ``timed_out()`` once ``timeout_s`` seconds passed without a
        value; whatever ``check`` raises.
    """
    import asyncio  # here: the blocking twin serves code that never loads asyncio

    for pause in _pauses(timeout_s, interval_s, max_interval_s):
        if (value := await check()) is not None:
            return value
        if pause is None:
            raise timed_out()
        await asyncio.sleep(pause)
    raise AssertionError("unreachable: _pauses ends with None")  # pragma: no cover


def poll_until_sync(
    check: Callable[[], _T | None],
    *,
    timeout_s: float,
    timed_out: Callable[[], BaseException],
    interval_s: float = 0.002,
    max_interval_s: float | None = None,
) -> _T:
    """:func:`poll_until` for a blocking caller (sleeps the thread between checks)."""
    for pause in _pauses(timeout_s, interval_s, max_interval_s):
        if (value := check()) is not None:
            return value
        if pause is None:
            raise timed_out()
        time.sleep(pause)
    raise AssertionError("unreachable: _pauses ends with None")  # pragma: no cover


def _pauses(
    timeout_s: float, interval_s: float, max_interval_s: float | None
) -> Iterator[float | None]:
    """The pause before each next check; None after the last check (time is up)."""
    deadline = time.monotonic() + timeout_s
    pause = interval_s
    while (remaining := deadline - time.monotonic()) > 0:
        yield min(pause, remaining)
        if max_interval_s is not None:
            pause = min(pause * 2, max_interval_s)
    yield None
