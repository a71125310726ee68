"""poll_until: the value of the first check that has one, or the caller's error in time."""

from __future__ import annotations

import asyncio
import time

import pytest

from forkpoint.errors import Conflict
from forkpoint.polling import poll_until, poll_until_sync


def test_returns_the_first_value_and_checks_until_then() -> None:
    calls = []

    def check() -> str | None:
        calls.append(time.monotonic())
        return "ready" if len(calls) == 4 else None

    assert poll_until_sync(check, timeout_s=5, timed_out=lambda: Conflict("late")) == "ready"
    assert len(calls) == 4


def test_times_out_with_the_callers_error_after_a_last_check() -> None:
    calls = 0

    async def never() -> int | None:
        nonlocal calls
        calls += 1
        return None

    started = time.monotonic()
    with pytest.raises(Conflict, match="busy"):
        asyncio.run(poll_until(never, timeout_s=0.2, timed_out=lambda: Conflict("busy")))
    assert 0.2 <= time.monotonic() - started < 1.0
    assert calls > 2


def test_a_zero_timeout_still_checks_once() -> None:
    assert poll_until_sync(lambda: 0, timeout_s=0, timed_out=lambda: Conflict("x")) == 0
    with pytest.raises(Conflict):
        poll_until_sync(lambda: None, timeout_s=0, timed_out=lambda: Conflict("x"))


def test_pauses_grow_to_the_maximum() -> None:
    times: list[float] = []

    def check() -> None:
        times.append(time.monotonic())

    with pytest.raises(Conflict):
        poll_until_sync(
            check, timeout_s=0.5, timed_out=lambda: Conflict("x"), interval_s=0.01,
            max_interval_s=0.08,
        )  # fmt: skip
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert gaps[0] < 0.05 and max(gaps) >= 0.07  # 10 ms first, then up to 80 ms
    assert len(times) < 20  # not a busy loop
