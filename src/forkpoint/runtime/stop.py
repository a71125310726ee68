"""Stopping a session: its VM and passt end, the session stays (state ``stopped``).

Its disk layers, port allocations and checkpoints stay, so ``rollback`` to a checkpoint
brings it back with the same id and host ports. Used by the E2B gateway's ``pause``
(checkpoint, then stop) and its resume (``rollback`` to that checkpoint).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from forkpoint.models import Session, SessionState
from forkpoint.store import session_lock_async

from .cleanup import kill_session_processes

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["stop_session"]


async def stop_session(runtime: Runtime, session: str) -> Session:
    """Kill the session's VM and mark it stopped (idempotent). :raises NotFound:"""
    record = await asyncio.to_thread(runtime.store.get_session, session)
    async with session_lock_async(runtime.home, record.id):
        await asyncio.to_thread(_stop_locked, runtime, record.id)
        record = await asyncio.to_thread(runtime.store.get_session, record.id)
    return await asyncio.to_thread(runtime.session_of, record)


def _stop_locked(runtime: Runtime, session_id: str) -> None:
    record = runtime.store.get_session(session_id)
    runtime.standbys.drop(record.id)  # a stopped VM holds nothing
    kill_session_processes(runtime.files(record.id), record)
    runtime.store.update_session(record.id, state=SessionState.STOPPED, qemu_pid=None, aux_pids=[])
