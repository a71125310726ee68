"""The reaper of every long-lived door (``forkpoint serve``, the E2B gateway, MCP):
lifetimes end and log caps hold while nobody runs the CLI, and running sessions' metrics
are sampled (``runtime/metrics.py``). One per runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from forkpoint.runtime.metrics import INTERVAL_S

__all__ = ["Duties", "reap_forever", "reaping"]

_log = logging.getLogger("forkpoint.reaper")


class Duties(Protocol):
    """What a reaper drives (the runtime: ``Lifetimes.expire``, ``Metrics.sample``)."""

    async def expire(self) -> list[str]: ...

    async def sample_metrics(self) -> int: ...


async def reap_forever(
    runtime: Duties, interval_s: float = 1.0, metrics_interval_s: float = INTERVAL_S
) -> None:
    """``runtime.expire()`` every ``interval_s`` seconds and ``runtime.sample_metrics()``
    every ``metrics_interval_s``, side by side (a slow sample never delays a timeout),
    until cancelled."""

    async def expire() -> None:
        for session_id in await runtime.expire():
            _log.info("session %s reached its timeout", session_id)

    async def sample() -> None:
        await runtime.sample_metrics()

    await asyncio.gather(
        _every(interval_s, expire, "the session reaper failed"),
        _every(metrics_interval_s, sample, "sampling metrics failed"),
    )


async def _every(interval_s: float, duty: Callable[[], Awaitable[None]], failed: str) -> None:
    while True:
        try:
            await duty()
        except Exception:  # keep going: one bad round must not stop the next
            _log.exception(failed)
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def reaping(runtime: Duties, interval_s: float = 1.0) -> AsyncIterator[None]:
    """Run :func:`reap_forever` while inside (a door's lifespan)."""
    task = asyncio.create_task(reap_forever(runtime, interval_s))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
