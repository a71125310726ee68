"""Timeouts are real: a sandbox past its end time is killed, or paused when it was
created with auto-pause. Paused sandboxes never expire (as in E2B)."""

from __future__ import annotations

import asyncio
import logging

from .sandboxes import Sandboxes

__all__ = ["reap_forever"]

_log = logging.getLogger("forkpoint.e2b")


async def reap_forever(sandboxes: Sandboxes, interval_s: float = 1.0) -> None:
    """Check every ``interval_s`` seconds until cancelled."""
    while True:
        try:
            for sandbox_id in await sandboxes.expire():
                _log.info("sandbox %s reached its timeout", sandbox_id)
        except Exception:  # keep reaping: one bad round must not stop the timeouts
            _log.exception("the sandbox reaper failed")
        await asyncio.sleep(interval_s)
