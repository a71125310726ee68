"""Rollback standbys: a QEMU started ahead for a session's next rollback.

A rollback's largest step is starting QEMU (≈ 42 ms of CPU of ≈ 90; see "Rollback" in
the architecture notes). A standby is that QEMU started ahead, exactly as the rollback's
restore would start it (``-incoming defer``, mapping the target checkpoint's RAM file, on
a new layer over its disk, in the session's cgroup, as the session's uid, its egress
rules installed), under names of its own beside the session's (``VmFiles.standby``), so
killing the running VM leaves it alone. A rollback to that checkpoint on that machine
takes it: its sockets are renamed into the session's places, then passt is connected,
the state loaded and the VM run, as for any restore.

Not loaded ahead (unlike a warm VM, :mod:`.warm`): a load announces the guest on its
network, so passt must be connected first, and passt can bind the session's host ports
only once the running VM's passt is gone.

Started after a checkpoint or a rollback (then the next rollback's target is known), by
whoever made it: the server in the background, the CLI once it printed its result.
At most ``FORKPOINT_ROLLBACK_STANDBYS`` sessions keep one (default 0: none), the most
recently prepared ones; paused before any state, one costs ≈ 21 MiB and no CPU. It is
discarded when the session's next target differs, when the session stops or is removed,
and when its checkpoint is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

from forkpoint import faults
from forkpoint.config import Home
from forkpoint.errors import Conflict
from forkpoint.images import Image
from forkpoint.models import Network
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles
from forkpoint.runtime.sessions.cleanup import kill_vm_processes
from forkpoint.runtime.sessions.egress import install_filter, policy_of
from forkpoint.runtime.sessions.limits import prepare_cgroup
from forkpoint.runtime.sessions.machines import boot_files, jail_of, new_layer_name
from forkpoint.runtime.sessions.warm import vm_files
from forkpoint.store import CheckpointRecord, SessionRecord, Store, session_lock
from forkpoint.store.standby import StandbyRecord, StandbyStore
from forkpoint.vm import Machine, MachineShape, VmFiles, qemu_build
from forkpoint.vm.disk import overlay_from_blank
from forkpoint.vm.process import is_running

__all__ = ["Standbys", "standby_key"]


def standby_key(shape: MachineShape, network: Network) -> str:
    """The machine a standby is: a rollback on another shape or network cannot use it."""
    return f"{shape.key}:{network.value}"


class Standbys:
    """The rollback standbys of one home."""

    def __init__(self, home: Home, store: Store) -> None:
        self.home = home
        self.rows = StandbyStore(store)

    def files(self, record: StandbyRecord) -> VmFiles:
        return vm_files(self.home, record.session_id).standby(record.tag)

    async def prepare(
        self,
        session: SessionRecord,
        target: CheckpointRecord,
        image: Image,
        shape: MachineShape,
        limit: int,
    ) -> bool:
        """Make sure ``session`` has a live standby for a rollback to ``target`` on
        ``shape``, keeping at most ``limit`` standbys in the home (the oldest others are
        discarded); True if one was started. The caller holds the session's lock.
        A failed start leaves nothing behind and is raised."""
        key = standby_key(shape, session.network)
        current = await asyncio.to_thread(self.rows.get, session.id)
        if current is not None:
            if current.checkpoint_id == target.id and current.key == key and self._alive(current):
                return False
            await asyncio.to_thread(self.drop, session.id)
        if limit <= 0:
            return False
        await asyncio.to_thread(self._evict, limit - 1)
        tag = f"s{secrets.token_hex(2)}"
        layer = new_layer_name()
        await asyncio.to_thread(self.rows.reserve, session.id, target.id, key, tag, layer)
        faults.point("standby.reserved")
        files = vm_files(self.home, session.id).standby(tag)
        layers = self.home.layers
        try:
            await asyncio.to_thread(overlay_from_blank, layers / target.disk_layer, layers / layer)
            cgroup = await asyncio.to_thread(prepare_cgroup, self.home, session.id, shape)
            network = session.network == Network.USER
            if network:  # what the rollback's restore would install (the session's policy)
                await asyncio.to_thread(install_filter, jail_of(session), policy_of(session))
            machine = await Machine.launch(
                qemu_build(), shape, boot_files(image, shape), files, layers / layer,
                jail=jail_of(session), network=network, incoming=True, cgroup=cgroup,
                ram=CheckpointFiles.of(self.home, target.id).ram,
            )  # fmt: skip
            await machine.close()
            faults.point("standby.qemu-started")
            started = await asyncio.to_thread(self.rows.set_started, session.id, tag, machine.pid)
        except BaseException:
            await asyncio.to_thread(self.rows.remove, session.id, tag)
            await asyncio.to_thread(self._remove, session.id, tag, layer, None)
            raise
        if not started:  # evicted while it started
            await asyncio.to_thread(self._remove, session.id, tag, layer, machine.pid)
        return started

    def take(self, session_id: str, checkpoint_id: str, key: str) -> StandbyRecord | None:
        """The session's standby out of the store if it is live and for ``checkpoint_id``
        on the machine ``key`` (any other is discarded); None: a rollback starts QEMU."""
        record = self.rows.take(session_id)
        if record is None:
            return None
        if record.checkpoint_id == checkpoint_id and record.key == key and self._alive(record):
            return record
        self.discard(record)
        return None

    def drop(self, session_id: str) -> None:
        """Discard the session's standby, if it has one (its session stops or goes)."""
        record = self.rows.take(session_id)
        if record is not None:
            self.discard(record)

    def drain(self, checkpoint_ids: set[str]) -> None:
        """Discard the standbys mapping a checkpoint not in ``checkpoint_ids``."""
        for record in self.rows.all():
            if record.checkpoint_id not in checkpoint_ids:
                self.drop(record.session_id)

    def discard_dead(self) -> None:
        """Discard the standbys whose QEMU is gone or was never recorded (forkpoint was
        killed while it started one, which may live on, paused), but not one starting
        right now: its session's lock is held then."""
        for record in self.rows.all():
            if self._alive(record):
                continue
            with contextlib.suppress(Conflict):
                with session_lock(self.home, record.session_id, timeout_s=0):
                    current = self.rows.get(record.session_id)
                    if current is not None and current.tag == record.tag:
                        self.drop(record.session_id)

    def discard(self, record: StandbyRecord) -> None:
        """Kill a standby out of the store and delete its files and layer."""
        self._remove(record.session_id, record.tag, record.disk_layer, record.qemu_pid)

    def _alive(self, record: StandbyRecord) -> bool:
        return is_running(record.qemu_pid, self.files(record).name)

    def _evict(self, keep: int) -> None:
        """Discard the oldest standbys until at most ``keep`` are left."""
        records = self.rows.all()
        for record in records[: max(0, len(records) - keep)]:
            self.drop(record.session_id)

    def _remove(self, session_id: str, tag: str, layer: str, pid: int | None) -> None:
        files = vm_files(self.home, session_id).standby(tag)
        kill_vm_processes(files, pid)  # and one never recorded, found by its name
        files.remove_own()
        (self.home.layers / layer).unlink(missing_ok=True)
