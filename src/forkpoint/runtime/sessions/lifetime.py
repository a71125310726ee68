"""A session's lifetime: when it ends (``timeout``) and what happens then — removal, or a
pause (a hidden checkpoint, the VM stopped) that ``resume`` undoes. Every CLI call and the
reaper of every long-lived door end the lifetimes that are over (:meth:`Lifetimes.expire`).
"""

from __future__ import annotations

import asyncio
import logging

from forkpoint.errors import Conflict, ForkpointError
from forkpoint.models import CheckpointKind, Expiry, Session, SessionState
from forkpoint.runtime.checkpoints.service import Checkpoints
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.housekeeping.collector import Collector
from forkpoint.runtime.housekeeping.upkeep import due_to_pause, expires_after, record_expired
from forkpoint.runtime.restore.service import Restore
from forkpoint.runtime.sessions.service import Sessions
from forkpoint.store import KEEP, session_lock_async

__all__ = ["Lifetimes"]

_log = logging.getLogger(__name__)


class Lifetimes:
    def __init__(
        self,
        context: RuntimeContext,
        sessions: Sessions,
        checkpoints: Checkpoints,
        restore: Restore,
        collector: Collector,
    ) -> None:
        self.context = context
        self.sessions = sessions
        self.checkpoints = checkpoints
        self.restore = restore
        self.collector = collector

    async def set_timeout(
        self, session: str, timeout_s: float | None, on_expiry: Expiry | str | None = None
    ) -> Session:
        """End the session's lifetime ``timeout_s`` seconds from now (None: never), and
        then remove or pause it (``on_expiry``; None: as it was). Every CLI call and the
        reaper of every long-lived door act on it (see :meth:`expire`).

        :raises NotFound: :raises InvalidInput: a lifetime out of range.
        """
        from forkpoint.requests import TimeoutRequest, parse

        request = parse(TimeoutRequest, timeout_s=timeout_s, on_expiry=on_expiry)
        record = await asyncio.to_thread(self.context.store.get_session, session)
        async with session_lock_async(self.context.home, record.id):
            record = await asyncio.to_thread(
                self.context.store.update_session, record.id,
                expires_at=expires_after(request.timeout_s),
                on_expiry=KEEP if request.on_expiry is None else request.on_expiry,
            )  # fmt: skip
        return await asyncio.to_thread(self.context.queries.session_of, record)

    async def expire(self) -> list[str]:
        """End the lifetimes that are over: remove those sessions, or pause them; returns
        their ids. Every CLI call and the reaper of every long-lived door run it."""
        ended = await asyncio.to_thread(self.context.queries.upkeep)
        paused = []
        for session_id in await asyncio.to_thread(due_to_pause, self.context.queries):
            try:
                await self.pause(session_id)
            except ForkpointError as error:  # the next round tries again
                _log.warning("forkpoint: pausing %s at its timeout: %s", session_id, error.message)
                continue
            paused.append(session_id)
        await asyncio.to_thread(record_expired, self.context.store, paused, Expiry.PAUSE)
        ended += paused
        if ended:
            await asyncio.to_thread(self.collector.collect_hidden_checkpoints)
        return ended

    # -- pause -------------------------------------------------------------------------

    async def pause(self, session: str) -> Session:
        """Checkpoint a running session (a hidden ``pause`` checkpoint) and stop its VM;
        :meth:`resume` brings it back as it was — same id, host ports, processes at the
        same PIDs. A paused session does not expire.

        :raises Conflict: it is not running.
        """
        record = await asyncio.to_thread(self.context.store.get_session, session)
        async with session_lock_async(self.context.home, record.id):
            await self.checkpoints.checkpoint_held(record.id, None, CheckpointKind.PAUSE)
            await asyncio.to_thread(self.sessions.stop_held, record.id, expires_at=None)
            record = await asyncio.to_thread(self.context.store.get_session, record.id)
        return await asyncio.to_thread(self.context.queries.session_of, record)

    async def resume(self, session: str) -> Session:
        """Bring a paused session back from its pause checkpoint (a rollback to it); a
        crashed one from its latest checkpoint, as :meth:`rollback` would.

        :raises Conflict: it is neither paused nor crashed.
        """
        record = await asyncio.to_thread(self.context.store.get_session, session)
        paused_at = await asyncio.to_thread(self.paused_at, record.id)
        if paused_at is None and record.state != SessionState.CRASHED:
            raise Conflict(f"session {record.id} is {record.state}, not paused")
        return await self.restore.rollback(record.id, paused_at)

    def paused_at(self, session: str) -> str | None:
        """The checkpoint a stopped session was paused at (None: it is not paused)."""
        record = self.context.store.get_session(session)
        if record.state != SessionState.STOPPED:
            return None
        own = self.context.store.list_checkpoints(session_id=record.id)
        if not own or own[-1].kind != CheckpointKind.PAUSE:
            return None  # stopped by hand, not paused
        return own[-1].id
