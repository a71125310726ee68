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
from forkpoint.runtime.checkpoints.writer import CheckpointOrigin
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.housekeeping.collector import Collector
from forkpoint.runtime.housekeeping.upkeep import due_to_pause, expires_after, record_expired
from forkpoint.runtime.restore.service import Restore
from forkpoint.runtime.sessions.service import Sessions
from forkpoint.store import KEEP, SessionRecord, global_lock_async, session_lock_async

__all__ = ["Lifetimes"]

_log = logging.getLogger(__name__)

#: How long a guest may take to write its files out before a filesystem-only pause.
_SYNC_TIMEOUT_S = 120.0
_GC_LOCK_TIMEOUT_S = 300.0


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
        self,
        session: str,
        timeout_s: float | None,
        on_expiry: Expiry | str | None = None,
        keep_memory: bool | None = None,
    ) -> Session:
        """End the session's lifetime ``timeout_s`` seconds from now (None: never), and
        then remove or pause it (``on_expiry``; None: as it was) — a pause keeping its
        memory or not (``keep_memory``; None: as it was, see :meth:`pause`). Every CLI
        call and the reaper of every long-lived door act on it (see :meth:`expire`).

        :raises NotFound: :raises InvalidInput: a lifetime out of range.
        """
        from forkpoint.requests import TimeoutRequest, parse

        request = parse(
            TimeoutRequest, timeout_s=timeout_s, on_expiry=on_expiry, keep_memory=keep_memory
        )
        record = await asyncio.to_thread(self.context.store.get_session, session)
        async with session_lock_async(self.context.home, record.id):
            record = await asyncio.to_thread(
                self.context.store.update_session, record.id,
                expires_at=expires_after(request.timeout_s),
                on_expiry=KEEP if request.on_expiry is None else request.on_expiry,
                pause_memory=KEEP if request.keep_memory is None else request.keep_memory,
            )  # fmt: skip
        return await asyncio.to_thread(self.context.queries.session_of, record)

    async def expire(self) -> list[str]:
        """End the lifetimes that are over: remove those sessions, or pause them; returns
        their ids. Every CLI call and the reaper of every long-lived door run it."""
        ended = await asyncio.to_thread(self.context.queries.upkeep)
        paused = []
        for session_id in await asyncio.to_thread(due_to_pause, self.context.queries):
            try:
                record = await asyncio.to_thread(self.context.store.get_session, session_id)
                await self.pause(session_id, keep_memory=record.pause_memory)
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

    async def pause(self, session: str, keep_memory: bool = True) -> Session:
        """Checkpoint a running session (a hidden ``pause`` checkpoint) and stop its VM;
        :meth:`resume` brings it back as it was — same id, host ports, processes at the
        same PIDs. A paused session does not expire.

        ``keep_memory=False`` keeps only its disk (E2B's filesystem-only pause): the guest
        syncs its files, its VM stops, and :meth:`resume` boots it anew from that disk
        (same id and ports; its processes start afresh, as after a reboot).

        :raises Conflict: it is not running.
        """
        record = await asyncio.to_thread(self.context.store.get_session, session)
        if not keep_memory:  # through the agent, which takes the session's lock itself
            await self._sync_disk(record.id)
        async with session_lock_async(self.context.home, record.id):
            if keep_memory:
                await self.checkpoints.checkpoint_held(record.id, None, CheckpointKind.PAUSE)
            else:
                await asyncio.to_thread(self.context.queries.require_running, record.id)
            await asyncio.to_thread(self.sessions.stop_held, record.id, expires_at=None)
            record = await asyncio.to_thread(
                self.context.store.update_session, record.id, paused_on_disk=not keep_memory
            )
        return await asyncio.to_thread(self.context.queries.session_of, record)

    async def resume(self, session: str) -> Session:
        """Bring a paused session back from its pause checkpoint (a rollback to it), or
        one paused without its memory by booting from its disk; a crashed one from its
        latest checkpoint, as :meth:`rollback` would.

        :raises Conflict: it is neither paused nor crashed.
        """
        record = await asyncio.to_thread(self.context.store.get_session, session)
        if record.state == SessionState.STOPPED and record.paused_on_disk:
            return await self._boot_from_disk(record)
        paused_at = await asyncio.to_thread(self.paused_at, record.id)
        if paused_at is None and record.state != SessionState.CRASHED:
            raise Conflict(f"session {record.id} is {record.state}, not paused")
        return await self.restore.rollback(record.id, paused_at)

    async def _sync_disk(self, session_id: str) -> None:
        """Have the guest write what it holds of its files to its disk."""
        async with self.sessions.link.agent(session_id) as agent:
            done = await agent.exec(["sync"], user="root", timeout=_SYNC_TIMEOUT_S)
        if done.exit_code != 0:
            raise Conflict(f"session {session_id}: the guest could not sync its disk")

    async def _boot_from_disk(self, record: SessionRecord) -> Session:
        """A session paused without its memory, running again: its image's kernel booted
        on its disk (with the image's service started), checkpointed, and the session
        rolled back to that — same id, ports, uid and jail as any rollback."""
        image, shape = await asyncio.to_thread(
            self.context.machine, record.image_hash, record.memory_mib, record.cpus
        )
        origin = CheckpointOrigin(
            session_id=record.id, name=None, kind=CheckpointKind.PAUSE, image=image,
            shape=shape, parent=record.parent_checkpoint, guest_ports=(),
            volumes=await asyncio.to_thread(self.checkpoints.volumes.mounts_of, record.id),
        )  # fmt: skip
        async with session_lock_async(self.context.home, record.id):
            current = await asyncio.to_thread(self.context.store.get_session, record.id)
            if current.state != SessionState.STOPPED or not current.paused_on_disk:
                raise Conflict(f"session {record.id} is {current.state}, not paused")
            async with global_lock_async(self.context.home, "gc", _GC_LOCK_TIMEOUT_S):
                booted = await self.context.templates.boot(
                    image, shape, origin, f"boot-{record.id}", disk=current.disk_layer
                )
        await self.restore.rollback(record.id, booted.id)
        record = await asyncio.to_thread(
            self.context.store.update_session, record.id, paused_on_disk=False
        )
        return await asyncio.to_thread(self.context.queries.session_of, record)

    def paused_at(self, session: str) -> str | None:
        """The checkpoint a stopped session was paused at (None: it is not paused)."""
        record = self.context.store.get_session(session)
        if record.state != SessionState.STOPPED or record.paused_on_disk:
            return None
        own = self.context.store.list_checkpoints(session_id=record.id)
        if not own or own[-1].kind != CheckpointKind.PAUSE:
            return None  # stopped by hand, not paused
        return own[-1].id
