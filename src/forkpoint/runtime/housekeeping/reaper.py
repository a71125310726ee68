"""The reaper of every long-lived door (``forkpoint serve``, the E2B gateway, MCP):
lifetimes end and log caps hold while nobody runs the CLI. One per runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

__all__ = ["Expiring", "reap_forever", "reaping"]

_log = logging.getLogger("forkpoint.reaper")


class Expiring(Protocol):
    """What a reaper drives (the runtime: ``Lifetimes.expire``)."""

    async def expire(self) -> list[str]: ...


async def reap_forever(runtime: Expiring, interval_s: float = 1.0) -> None:
    """``runtime.expire()`` every ``interval_s`` seconds until cancelled."""
    while True:
        try:
            for session_id in await runtime.expire():
                _log.info("session %s reached its timeout", session_id)
        except Exception:  # keep reaping: one bad round must not stop the timeouts
            _log.exception("the session reaper failed")
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def reaping(runtime: Expiring, interval_s: float = 1.0) -> AsyncIterator[None]:
    """Run :func:`reap_forever` while inside (a door's lifespan)."""
    task = asyncio.create_task(reap_forever(runtime, interval_s))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
