"""The server's reaper: session timeouts and log caps hold while nobody runs the CLI."""

from __future__ import annotations

import asyncio
import logging

from .queries import Queries
from .upkeep import upkeep

__all__ = ["upkeep_forever"]

_log = logging.getLogger("forkpoint.reaper")


async def upkeep_forever(queries: Queries, interval_s: float = 1.0) -> None:
    """:func:`~.upkeep.upkeep` every ``interval_s`` seconds until cancelled (``forkpoint
    serve``, the E2B gateway)."""
    while True:
        try:
            for session_id in await asyncio.to_thread(upkeep, queries):
                _log.info("session %s reached its timeout and was removed", session_id)
        except Exception:  # keep reaping: one bad round must not stop the timeouts
            _log.exception("the session reaper failed")
        await asyncio.sleep(interval_s)
