"""Starting a rollback standby (see :mod:`.standby`) for a session's next rollback: on
request, or in the background after a checkpoint or rollback under a long-lived door."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from forkpoint.errors import ForkpointError
from forkpoint.models import SessionState
from forkpoint.runtime.capacity import host_limits
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.restore.targets import rollback_plan
from forkpoint.store import session_lock_async

__all__ = ["RollbackPreparer"]

_log = logging.getLogger(__name__)


async def _quietly(work: Awaitable[object]) -> None:
    """Background work whose failure is logged: the operation it follows stands."""
    try:
        await work
    except ForkpointError as error:
        _log.warning("forkpoint: %s", error.message)


class RollbackPreparer:
    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    async def prepare_rollback(
        self, session: str, checkpoint: str | None = None, *, limit: int | None = None
    ) -> bool:
        """Start a standby QEMU for the session's next rollback (to ``checkpoint``, default
        its default target), so that rollback starts no QEMU, if at most ``limit`` sessions
        (default ``FORKPOINT_ROLLBACK_STANDBYS``) then keep one; True if one started. See
        :mod:`.standby`. :raises NotFound: :raises Conflict: as ``rollback``."""
        ctx = self.context
        limit = host_limits().rollback_standbys if limit is None else limit
        record = await asyncio.to_thread(ctx.store.get_session, session)
        if limit == 0 and await asyncio.to_thread(ctx.standbys.rows.get, record.id) is None:
            return False
        async with session_lock_async(ctx.home, record.id):
            record = await asyncio.to_thread(ctx.store.get_session, record.id)
            if record.state != SessionState.RUNNING:
                return False
            target, image, shape = await asyncio.to_thread(rollback_plan, ctx, record, checkpoint)
            return await ctx.standbys.prepare(record, target, image, shape, limit)

    def in_background(self, session_id: str) -> None:
        """A long-lived door prepares the next rollback once a checkpoint or rollback is done."""
        if self.context.refill_in_background and host_limits().rollback_standbys:
            self.context.in_background(_quietly(self.prepare_rollback(session_id)))
