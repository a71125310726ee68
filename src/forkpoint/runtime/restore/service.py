"""Restoring checkpoints: forks (new sessions, in parallel) and rollbacks (the same
session — id, uid, host ports — on the next generation), a crashed session's recovery,
and the short-lived forks that only look at a checkpoint."""

from __future__ import annotations

import asyncio

from forkpoint import faults
from forkpoint.egress import EgressPolicy
from forkpoint.errors import ForkpointError
from forkpoint.images import Image
from forkpoint.models import Network, Session, SessionState
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.guest.link import GuestLink
from forkpoint.runtime.restore.prepare import RollbackPreparer
from forkpoint.runtime.restore.standby import standby_key
from forkpoint.runtime.restore.targets import fork_source, fork_target, rollback_plan
from forkpoint.runtime.sessions.cleanup import collect_layers, kill_session_processes
from forkpoint.runtime.sessions.disksize import grow_block_device, grow_filesystem
from forkpoint.runtime.sessions.egress import policy_of
from forkpoint.runtime.sessions.machines import (
    RestoreSpec,
    ResumeTogether,
    Started,
    boot_files,
    guest_hostname,
    has_restore_listeners,
    identity_token,
    jail_of,
    restore_facts,
    start_restored,
)
from forkpoint.runtime.sessions.service import Sessions
from forkpoint.store import CheckpointRecord, SessionRecord, session_lock_async
from forkpoint.vm import MachineShape

__all__ = ["Restore"]


def volumes_of(checkpoint: CheckpointRecord) -> tuple[tuple[str, str], ...]:
    """The volume mounts the guest in ``checkpoint`` has (its manifest's)."""
    return tuple((str(v), str(at)) for v, at in checkpoint.manifest.get("volumes", ()))


class Restore:
    def __init__(
        self,
        context: RuntimeContext,
        sessions: Sessions,
        link: GuestLink,
        preparer: RollbackPreparer,
    ) -> None:
        self.context = context
        self.sessions = sessions
        self.link = link
        self.preparer = preparer

    async def fork(
        self, checkpoint: str, count: int = 1, *, spread: bool = False
    ) -> list[Session | ForkpointError]:
        """Start ``count`` new sessions from a checkpoint, in parallel.

        Each gets a new id and its own host ports for the checkpoint's forwarded guest
        ports. A fork that fails is reported in its slot; the others still run. ``spread``
        places forks on a cluster; on one host they all start here.
        """
        from forkpoint.requests import ForkRequest, parse

        parse(ForkRequest, count=count)
        record, source = await asyncio.to_thread(fork_source, self.context.store, checkpoint)
        await asyncio.to_thread(self.context.require_room, count)
        target = await fork_target(self.context, record, source)
        egress = policy_of(source).to_json() if source else {}
        together = ResumeTogether(count)

        async def one_fork() -> Session:
            warm = await asyncio.to_thread(self.context.warm.take, target)  # `warm --from` started
            async with together.member() as loaded:
                return await self.sessions.start(
                    record, target.image, target.shape, name=None,
                    guest_ports=target.guest_ports, network=target.network, egress=egress,
                    loaded=loaded, warm=warm,
                    disk_mib=source.disk_mib if source else None,  # its disk is that size
                    volumes=volumes_of(record),
                )  # fmt: skip

        results = await asyncio.gather(
            *(one_fork() for _ in range(count)),
            return_exceptions=True,
        )
        out: list[Session | ForkpointError] = []
        for result in results:
            if isinstance(result, ForkpointError | Session):
                out.append(result)
            elif isinstance(result, BaseException):
                raise result
        return out

    async def adopt(self, checkpoint: str, session_id: str, name: str | None) -> Session:
        """Start ``checkpoint`` as the session ``session_id``, which this home never had:
        a session of a cluster node that was lost, revived here from its latest checkpoint
        (same id, name and processes; its guest ports forwarded to this host's loopback)."""
        record, source = await asyncio.to_thread(fork_source, self.context.store, checkpoint)
        await asyncio.to_thread(self.context.require_room, 1)
        target = await fork_target(self.context, record, source)
        return await self.sessions.start(
            record, target.image, target.shape, name=name, guest_ports=target.guest_ports,
            network=target.network, egress=policy_of(source).to_json() if source else {},
            disk_mib=source.disk_mib if source else None, volumes=volumes_of(record),
            session_id=session_id,
        )  # fmt: skip

    async def scratch_fork(self, checkpoint: str) -> Session:
        """A session restored from ``checkpoint`` only to look at (a diff): no network,
        no ports, in ``context.scratch_sessions`` until the caller removes it."""
        record = await asyncio.to_thread(self.context.store.get_checkpoint, checkpoint)
        target = await fork_target(self.context, record, None)
        session = await self.sessions.start(
            record, target.image, target.shape, name=None, guest_ports=(),
            network=Network.NONE, egress=EgressPolicy.of((), ()).to_json(), scratch=True,
        )  # fmt: skip
        return session

    async def rollback(self, session: str, checkpoint: str | None = None) -> Session:
        """Reset a session — same id, same host ports — to a checkpoint of its lineage
        (default: its latest own checkpoint, else the one it started from). Works on a
        crashed session too.

        :raises Conflict: the checkpoint is not in the session's lineage.
        """
        record = await asyncio.to_thread(self.context.store.get_session, session)
        async with session_lock_async(self.context.home, record.id):
            record = await asyncio.to_thread(self.context.store.get_session, record.id)
            if record.state != SessionState.RUNNING:  # a stopped one starts running again
                await asyncio.to_thread(self.context.require_count, 1, f"reviving {record.id}")
            target, image, shape = await asyncio.to_thread(
                rollback_plan, self.context, record, checkpoint
            )
            record, started = await self._replace_vm(record, target, image, shape)
            faults.point("rollback.recorded")
            # A checkpoint from before the disk grew (the template) brings the old size.
            try:
                grew = record.disk_mib is not None and await grow_block_device(
                    started.machine, record.disk_mib, at_create=False
                )
            finally:
                await started.machine.close()
        if grew:
            await grow_filesystem(self.link, record.id)
        # The layers it ran on (no checkpoint or session went: nothing else to collect).
        await asyncio.to_thread(collect_layers, self.context.home, self.context.store)
        self.preparer.in_background(record.id)
        return await asyncio.to_thread(self.context.queries.session_of, record)

    async def _replace_vm(
        self, record: SessionRecord, target: CheckpointRecord, image: Image, shape: MachineShape
    ) -> tuple[SessionRecord, Started]:
        """A rollback's work under the session's lock: its VM replaced by one restored
        from ``target`` — same id, uid and host ports, the next generation — and recorded.
        On failure the session is left ``crashed`` (nothing of the new VM lingers)."""
        files = self.context.files(record.id)
        standby = await asyncio.to_thread(
            self.context.standbys.take, record.id, target.id, standby_key(shape, record.network)
        )  # started ahead: see .standby
        # The old QEMU's exit (freeing its memory) overlaps the new one's start or load.
        old_vm = await asyncio.to_thread(
            kill_session_processes, files, record, standby.tag if standby else None,
            wait_vm=False,
        )  # fmt: skip
        try:
            faults.point("rollback.old-vm-killed")
            # Its ports, unless another program took one while it was down (host restart).
            if await asyncio.to_thread(self.context.ports.keep_or_move, record.id):
                record = await asyncio.to_thread(self.context.store.get_session, record.id)
            generation = record.generation + 1
            spec = RestoreSpec(
                files=files, checkpoint=self.context.checkpoint_files(target.id),
                checkpoint_layer=target.disk_layer, shape=shape, boot=boot_files(image, shape),
                network=record.network,
                forwards=tuple((p.host_port, p.guest_port) for p in record.ports),
                hostname=guest_hostname(record.name, record.id),
                token=identity_token(record.id, generation),
                facts=restore_facts(record.id, generation, target),
                jail=jail_of(record), egress=policy_of(record),
                wait_for_guest=has_restore_listeners(target), volumes=volumes_of(target),
            )  # fmt: skip
            await asyncio.to_thread(self.sessions.volumes.set_mounts, record.id, spec.volumes)
            try:
                started = await start_restored(self.context.home, spec, standby=standby)
            except ForkpointError:
                await asyncio.to_thread(
                    self.context.store.update_session,
                    record.id,
                    state=SessionState.CRASHED,
                    qemu_pid=None,
                )
                raise
        finally:
            await asyncio.to_thread(old_vm.wait)  # gone: it has exited by now
        record = await asyncio.to_thread(
            self.sessions.record_running, record.id, started, target.disk_layer,
            generation=generation, parent_checkpoint=target.id,
        )  # fmt: skip
        return record, started

    async def recover(self) -> list[Session | ForkpointError]:
        """Bring back every ``crashed`` session from its latest checkpoint (a rollback:
        same id, same ports), e.g. after the host restarted; one slot per session."""
        crashed = [
            s.id
            for s in await asyncio.to_thread(self.context.queries.list_sessions)
            if s.state == SessionState.CRASHED
        ]
        out: list[Session | ForkpointError] = []
        for session_id in crashed:  # one at a time: each restore is CPU-bound
            try:
                out.append(await self.rollback(session_id))
            except ForkpointError as error:
                out.append(error)
        return out
