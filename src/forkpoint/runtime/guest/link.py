"""The way to a running session's guest agent: one shared connection per session (see
:mod:`.agents`), a VM left paused by a killed checkpoint resumed first, and a connection
lost mid-request explained by what happened to the session meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from forkpoint.agent_client import AgentClient, fresh_identity
from forkpoint.errors import AgentError, Conflict, ForkpointError, NotFound
from forkpoint.models import SessionState
from forkpoint.protocol import RestoreFacts
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.guest.agents import AgentPool
from forkpoint.runtime.sessions.machines import (
    AGENT_READY_TIMEOUT_S,
    guest_hostname,
    identity_token,
    restore_facts,
)
from forkpoint.store import SessionRecord, global_lock_async, session_lock_async
from forkpoint.vm import Machine
from forkpoint.vm.process import is_running

__all__ = ["GuestLink"]

_AGENT_LOCK_TIMEOUT_S = 600.0  # another process's connection may serve a long exec
# A lost agent connection waits this long for an operation on the session (rollback, rm)
# to finish, to tell the caller what happened.
_LOST_AGENT_WAIT_S = 30.0


class GuestLink:
    def __init__(self, context: RuntimeContext) -> None:
        self.context = context
        self._agents = AgentPool(
            lambda session_id: global_lock_async(
                context.home, f"agent-{session_id}", timeout_s=_AGENT_LOCK_TIMEOUT_S
            )
        )

    @contextlib.asynccontextmanager
    async def agent(self, session: str) -> AsyncIterator[AgentClient]:
        """The agent client of a running session. Concurrent users in this process share
        one connection (requests run side by side); another process waits until this
        one's users are done."""
        queries = self.context.queries
        record = await asyncio.to_thread(queries.require_running, session, locked=False)
        try:
            async with self._agents.use(
                record.id, record.generation, lambda: self._connect(record)
            ) as client:
                yield client
        except AgentError as error:
            raise await self._explain_lost(record, error) from error

    async def _explain_lost(self, record: SessionRecord, error: AgentError) -> ForkpointError:
        """Why a session's agent went away mid-request: a rollback, undo or rm that ran
        meanwhile is the caller's race (404/409), not forkpoint's fault (500). Such an
        operation holds the session lock until the store says what it did."""
        home = self.context.home
        with contextlib.suppress(Conflict):  # held too long: judge by the record as it is
            async with session_lock_async(home, record.id, timeout_s=_LOST_AGENT_WAIT_S):
                pass
        try:
            now = await asyncio.to_thread(self.context.store.get_session, record.id)
        except NotFound:
            return NotFound(f"session {record.id} was removed while the request ran")
        if now.generation != record.generation:
            return Conflict(f"session {record.id} was rolled back while the request ran")
        if now.state != SessionState.RUNNING:
            return Conflict(f"session {record.id} is {now.state} (it stopped during the request)")
        return error

    def _restore_facts(self, record: SessionRecord) -> RestoreFacts | None:
        """What the session's latest restore was, for its guest's processes."""
        if record.parent_checkpoint is None:
            return None
        try:
            checkpoint = self.context.store.get_checkpoint(record.parent_checkpoint)
        except NotFound:
            return None
        return restore_facts(record.id, record.generation, checkpoint)

    async def _connect(self, record: SessionRecord) -> AgentClient:
        files = self.context.files(record.id)
        async with session_lock_async(self.context.home, record.id):
            if not is_running(record.qemu_pid, files.name):
                # Its QEMU exited since it was looked up (the guest rebooted or panicked).
                raise Conflict(
                    f"session {record.id} has crashed; roll it back: forkpoint rollback {record.id}"
                )
            # A forkpoint process killed mid-checkpoint leaves the VM paused: resume it.
            machine = await Machine.adopt(files, record.qemu_pid or 0)
            try:
                await machine.resume_if_paused()
            finally:
                await machine.close()
        # Every connection re-sends the session's identity: the guest applies it unless it
        # already did (the copy posted right after the restore may not have arrived).
        identity = fresh_identity(
            identity_token(record.id, record.generation),
            guest_hostname(record.name, record.id),
            await asyncio.to_thread(self._restore_facts, record),
        )
        return await AgentClient.connect(
            files.agent_socket, timeout=AGENT_READY_TIMEOUT_S, identity=identity
        )
