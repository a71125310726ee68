"""Sessions: creating one (from its image's template, or a warm VM started ahead),
starting one from a checkpoint (a create or a fork), stopping and removing it, its
console, its port forwards and its disk.

Every change holds the session's inter-process lock; QEMU processes outlive the process
that started them and are re-adopted through the pid kept in the store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from forkpoint import faults
from forkpoint.egress import EgressPolicy
from forkpoint.errors import Conflict, Unsatisfiable
from forkpoint.images import Image
from forkpoint.models import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    Expiry,
    Network,
    Port,
    Session,
    SessionState,
)
from forkpoint.runtime.capacity import host_limits
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.events import record_hook_failures
from forkpoint.runtime.guest.link import GuestLink
from forkpoint.runtime.housekeeping.collector import Collector
from forkpoint.runtime.housekeeping.upkeep import expires_after
from forkpoint.runtime.restore.targets import fork_source, fork_target
from forkpoint.runtime.sessions.cleanup import destroy_session
from forkpoint.runtime.sessions.disksize import grow_block_device, grow_filesystem
from forkpoint.runtime.sessions.egress import policy_of
from forkpoint.runtime.sessions.machines import (
    RestoreSpec,
    Started,
    boot_files,
    guest_hostname,
    has_restore_listeners,
    identity_token,
    jail_of,
    restore_facts,
    start_restored,
)
from forkpoint.runtime.sessions.warm import WarmTarget
from forkpoint.store import KEEP, CheckpointRecord, Keep, SessionRecord, session_lock_async
from forkpoint.store.volumes import VolumesStore
from forkpoint.store.warm import WarmRecord
from forkpoint.vm import Machine, MachineShape

__all__ = ["Sessions"]


#: Where the guest's own filesystems are (and its agent): never a volume mount.
_SYSTEM_DIRS = frozenset({"proc", "sys", "dev", "run", "opt"})


class Sessions:
    def __init__(self, context: RuntimeContext, link: GuestLink, collector: Collector) -> None:
        self.context = context
        self.link = link
        self.collector = collector
        self.volumes = VolumesStore(context.store)

    async def create(
        self,
        *,
        image: str = "default",
        memory_mib: int = DEFAULT_MEMORY_MIB,
        cpus: int = DEFAULT_CPUS,
        name: str | None = None,
        ports: Sequence[int] = (),
        network: Network | str = Network.USER,
        allow_net: Sequence[str] = (),
        deny_net: Sequence[str] = (),
        inject_headers: Mapping[str, Mapping[str, str]] | None = None,
        timeout_s: float | None = None,
        disk_mib: int | None = None,
        history: bool = False,
        history_keep: int = 20,
        on_expiry: Expiry | str = Expiry.REMOVE,
        volumes: Mapping[str, str] | None = None,
    ) -> Session:
        """Create a session by forking the image's template (booted once, then cached).
        ``allow_net``/``deny_net``: CIDRs and host names adjusting the default egress
        policy (see :mod:`forkpoint.egress`); ``inject_headers``: ``{host: {name:
        value}}`` set on the guest's plain-HTTP requests to that host, on the host's side.
        ``timeout_s``: its lifetime, from now, and ``on_expiry`` what happens at its end
        (see :meth:`set_timeout`). ``disk_mib``: its virtual disk's size, at least the
        image's (see ``disksize``). ``volumes``: ``{guest path: volume id or name}`` to
        mount (outside every checkpoint: forks share them, a rollback does not undo them).

        ``history``: checkpoint it before every exec and file write made through forkpoint
        (``history``, ``undo``), keeping the last ``history_keep`` automatic checkpoints.
        :raises InvalidInput: bad sizes, ports, network or CIDRs; :raises NotFound: no
            such image; :raises LimitExceeded: the disk reserve or the session count would
            be crossed.
        """
        from forkpoint.requests import CreateSessionRequest, parse  # pydantic: only when used

        request = parse(
            CreateSessionRequest, image=image, memory_mib=memory_mib, cpus=cpus, name=name,
            ports=tuple(ports), network=network, allow_net=tuple(allow_net),
            deny_net=tuple(deny_net), inject_headers=dict(inject_headers or {}),
            timeout_s=timeout_s, disk_mib=disk_mib, history=history,
            history_keep=history_keep, on_expiry=on_expiry, volumes=dict(volumes or {}),
        )  # fmt: skip
        mounts = await asyncio.to_thread(self._resolve_mounts, request.volumes)
        egress = EgressPolicy.of(
            request.allow_net, request.deny_net, request.inject_headers
        ).to_json()
        await asyncio.to_thread(self.context.require_room, 1)
        img, shape = await asyncio.to_thread(
            self.context.machine, request.image, request.memory_mib, request.cpus
        )
        if request.disk_mib is not None and request.disk_mib << 20 < img.recipe.disk_size:
            raise Unsatisfiable(
                f"--disk {request.disk_mib} MiB is smaller than image {img.name}'s disk "
                f"({img.recipe.disk_size >> 20} MiB): disks only grow"
            )
        template = await self.context.templates.get(img, shape)
        await asyncio.to_thread(self.context.manifest, template.id, shape)
        target = WarmTarget(template, img, shape, request.network, request.ports)
        warm = await asyncio.to_thread(self.context.warm.take, target)  # any started ahead
        warm_size = host_limits().warm_vms
        session = await self.start(
            template, img, shape, name=request.name, guest_ports=request.ports,
            network=request.network, egress=egress,
            expires_at=expires_after(request.timeout_s), on_expiry=request.on_expiry,
            disk_mib=request.disk_mib, warm=warm, volumes=mounts,
        )  # fmt: skip
        if warm_size and self.context.refill_in_background:
            self.context.in_background(self.context.warm.fill(target, warm_size))
        if request.history:
            from forkpoint.store.history import HistoryStore

            await asyncio.to_thread(
                HistoryStore(self.context.store).enable, session.id, request.history_keep
            )
        return session

    def _resolve_mounts(self, volumes: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """``{guest path: volume ref}`` as ``(volume id, path)`` pairs.
        :raises NotFound: no such volume; :raises Unsatisfiable: a path the guest's own
            filesystems need, or one mount inside another."""
        paths = sorted(volumes)
        for at in paths:
            if at.split("/")[1] in _SYSTEM_DIRS:
                raise Unsatisfiable(f"a volume cannot be mounted at {at}: the guest needs it")
        for outer, inner in zip(paths, paths[1:], strict=False):
            if inner.startswith(outer + "/"):
                raise Unsatisfiable(f"volume mounts {outer} and {inner} nest")
        return tuple((self.volumes.get(volumes[at]).id, at) for at in paths)

    async def fill_warm(
        self,
        *,
        image: str = "default",
        memory_mib: int = DEFAULT_MEMORY_MIB,
        cpus: int = DEFAULT_CPUS,
        network: Network | str = Network.USER,
        ports: Sequence[int] = (),
        checkpoint: str | None = None,
        count: int | None = None,
    ) -> int:
        """Start warm VMs until there are ``count`` (``FORKPOINT_WARM_VMS`` by default)
        for creates of this kind (forwarding ``ports``), or with ``checkpoint`` for forks
        of it; returns how many started. See :mod:`.warm`.
        :raises NotFound: no such image or checkpoint; :raises InvalidInput: bad ports."""
        size = host_limits().warm_vms if count is None else count
        if checkpoint is not None:
            record, source = await asyncio.to_thread(fork_source, self.context.store, checkpoint)
            target = await fork_target(self.context, record, source)
        else:
            from forkpoint.requests import CreateSessionRequest, parse

            request = parse(
                CreateSessionRequest, image=image, memory_mib=memory_mib, cpus=cpus,
                ports=tuple(ports), network=network,
            )  # fmt: skip
            img, shape = await asyncio.to_thread(
                self.context.machine, request.image, request.memory_mib, request.cpus
            )
            template = await self.context.templates.get(img, shape)
            target = WarmTarget(template, img, shape, request.network, request.ports)
        return await self.context.warm.fill(target, size) if size > 0 else 0

    async def prepare(
        self, image: str = "default", memory_mib: int = DEFAULT_MEMORY_MIB, cpus: int = DEFAULT_CPUS
    ) -> float:
        """Make sure the image's template exists (booting it once if needed); returns ms.

        ``create`` does this itself; call it first to keep that one-time boot out of a
        measurement.
        """
        started = time.perf_counter()
        img, shape = await asyncio.to_thread(self.context.machine, image, memory_mib, cpus)
        await self.context.templates.get(img, shape)
        return (time.perf_counter() - started) * 1000

    async def start(
        self,
        checkpoint: CheckpointRecord,
        image: Image,
        shape: MachineShape,
        *,
        name: str | None,
        guest_ports: Sequence[int],
        network: Network,
        egress: dict[str, list[str]],
        loaded: Callable[[], Awaitable[None]] | None = None,
        expires_at: str | None = None,
        on_expiry: Expiry = Expiry.REMOVE,
        disk_mib: int | None = None,
        warm: WarmRecord | None = None,
        scratch: bool = False,
        volumes: tuple[tuple[str, str], ...] = (),
        session_id: str | None = None,
    ) -> Session:
        """Restore ``checkpoint`` as a new session; the caller has checked its manifest
        for ``shape`` (``RuntimeContext.manifest``). ``warm``: a warm VM taken for this create; it
        becomes the session (its id, uid and QEMU), or is discarded if the session cannot
        be made. ``scratch``: in ``context.scratch_sessions`` before its row can be listed
        (the page's grid once showed a diff's fork as one more fork). ``volumes``: the
        ``(volume id, guest path)`` mounts its guest gets (a fork's: its checkpoint's).
        ``session_id``: the id it takes (a session of another host, revived here)."""
        # The session row needs a layer row to point at; the checkpoint's own frozen
        # layer is a valid placeholder until the VM runs on its own top layer.
        fresh = SessionRecord.new(
            image=image.name, image_hash=image.hash, disk_layer=checkpoint.disk_layer,
            memory_mib=shape.memory_mib, cpus=shape.cpus, network=network, name=name,
            parent_checkpoint=checkpoint.id, egress=egress, expires_at=expires_at,
            on_expiry=on_expiry, disk_mib=disk_mib,
        )  # fmt: skip
        if warm is not None:
            fresh = dataclasses.replace(fresh, id=warm.id, uid=warm.uid)
        elif session_id is not None:
            fresh = dataclasses.replace(fresh, id=session_id)
        if scratch:
            self.context.scratch_sessions.add(fresh.id)
        # Locked before the row exists: a `creating` session whose lock is free has lost
        # its creator (killed), and queries may call it crashed (Queries.refresh).
        async with session_lock_async(self.context.home, fresh.id):
            try:
                record = await asyncio.to_thread(
                    self.context.store.insert_session, fresh, max_active=host_limits().max_sessions
                )
            except BaseException:
                if warm is not None:
                    await asyncio.to_thread(self.context.warm.discard, warm)
                raise
            faults.point("restore.session-inserted")
            try:
                if warm is None:
                    forwards = [
                        (await self.context.ports.allocate(record.id, g), g) for g in guest_ports
                    ]
                else:  # its passt forwards host ports reserved for it
                    forwards = list(warm.forwards)
                    await asyncio.to_thread(self.context.ports.adopt, record.id, forwards)
                spec = RestoreSpec(
                    files=self.context.files(record.id),
                    checkpoint=self.context.checkpoint_files(checkpoint.id),
                    checkpoint_layer=checkpoint.disk_layer, shape=shape,
                    boot=boot_files(image, shape), network=network, forwards=tuple(forwards),
                    hostname=guest_hostname(name, record.id), token=identity_token(record.id, 0),
                    facts=restore_facts(record.id, 0, checkpoint), jail=jail_of(record),
                    egress=policy_of(record), wait_for_guest=has_restore_listeners(checkpoint),
                    volumes=volumes,
                )  # fmt: skip
                if volumes:
                    await asyncio.to_thread(self.volumes.set_mounts, record.id, volumes)
                started = await start_restored(self.context.home, spec, loaded, warm=warm)
                record = await asyncio.to_thread(
                    self.record_running, record.id, started, checkpoint.disk_layer
                )
                faults.point("restore.recorded")
                try:
                    grew = disk_mib is not None and await grow_block_device(
                        started.machine, disk_mib, at_create=True
                    )
                finally:
                    await started.machine.close()
            except BaseException:
                await self.destroy(record)
                raise
        if grew:  # through the agent, which takes the session's lock itself
            try:
                await grow_filesystem(self.link, record.id)
            except BaseException:
                await self.destroy(record)
                raise
        return await asyncio.to_thread(self.context.queries.session_of, record)

    def record_running(
        self,
        session_id: str,
        started: Started,
        backing: str,
        *,
        generation: int | Keep = KEEP,
        parent_checkpoint: str | Keep = KEEP,
    ) -> SessionRecord:
        """Record the session's restored VM: its new top layer and pids (and, after a
        rollback, its generation and checkpoint), and the guest's restore hooks that
        failed."""
        with self.context.store.transaction():
            self.context.store.insert_layer(started.disk_layer, backing=backing)
            record = self.context.store.update_session(
                session_id, state=SessionState.RUNNING, disk_layer=started.disk_layer,
                qemu_pid=started.machine.pid, aux_pids=started.aux_pids, generation=generation,
                parent_checkpoint=parent_checkpoint,
            )  # fmt: skip
        record_hook_failures(self.context, session_id, started.guest)
        return record

    async def console(self, session: str, max_bytes: int = 64 << 10) -> str:
        """The serial console's latest output (at most ``max_bytes``). A running VM's
        console is a ring inside QEMU: it is drained into ``serial.log`` (capped) first.
        :raises NotFound:"""
        from forkpoint.vm.console import read_tail

        record = await asyncio.to_thread(self.context.store.get_session, session)
        files = self.context.files(record.id)
        async with session_lock_async(self.context.home, record.id):
            record = await asyncio.to_thread(self.context.store.get_session, record.id)
            record = await asyncio.to_thread(self.context.queries.refresh, record, locked=True)
            if record.state == SessionState.RUNNING:
                machine = await Machine.adopt(files, record.qemu_pid or 0)
                try:
                    await machine.drain_console()
                finally:
                    await machine.close()
        return await asyncio.to_thread(read_tail, files, max_bytes)

    async def remove(self, session: str) -> str:
        """Kill the session's VM and delete its files; returns its id. :raises NotFound:"""
        record = await asyncio.to_thread(self.context.store.get_session, session)
        await self.context.settled(record.id)  # its last history step is listed first
        async with session_lock_async(self.context.home, record.id):
            await self.destroy(await asyncio.to_thread(self.context.store.get_session, record.id))
        await asyncio.to_thread(self.collector.collect_hidden_checkpoints)
        return record.id

    async def destroy(self, record: SessionRecord) -> None:
        await asyncio.to_thread(self._destroy_now, record)

    def _destroy_now(self, record: SessionRecord) -> None:
        self.context.standbys.drop(record.id)
        destroy_session(
            self.context.home, self.context.store, self.context.files(record.id), record
        )

    async def stop(self, session: str) -> Session:
        """Kill the session's VM, keeping the session (``stopped``) to roll back later
        (idempotent). :raises NotFound:"""
        record = await asyncio.to_thread(self.context.store.get_session, session)
        async with session_lock_async(self.context.home, record.id):
            await asyncio.to_thread(self.stop_held, record.id)
            record = await asyncio.to_thread(self.context.store.get_session, record.id)
        return await asyncio.to_thread(self.context.queries.session_of, record)

    def stop_held(self, session_id: str, *, expires_at: str | None | Keep = KEEP) -> None:
        from forkpoint.runtime.sessions.stop import stop_vm

        self.context.standbys.drop(session_id)  # a stopped VM holds nothing
        stop_vm(
            self.context.store, self.context.files(session_id), session_id, expires_at=expires_at
        )

    async def forward_port(self, session: str, guest_port: int) -> Port:
        """Forward ``guest_port`` to a free port on the host's 127.0.0.1 (idempotent)."""
        from forkpoint.requests import PortRequest, parse

        parse(PortRequest, guest_port=guest_port)
        record = await asyncio.to_thread(self.context.store.get_session, session)
        existing = record.port_for(guest_port)
        if existing:
            return Port(guest_port=existing.guest_port, host_port=existing.host_port)
        async with session_lock_async(self.context.home, record.id):
            record = await asyncio.to_thread(self.context.queries.require_running, record.id)
            if record.network != Network.USER:
                raise Conflict(f"session {record.id} has no network (--network none)")
            host_port = await self.context.ports.allocate(record.id, guest_port)
            await asyncio.to_thread(
                self.context.ports.restart_network, self.context.files(record.id), record.id
            )
            return Port(guest_port=guest_port, host_port=host_port)
