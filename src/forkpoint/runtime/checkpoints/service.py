"""Checkpoints: taking one of a running session (memory, devices, disk), verifying,
moving (S3, archives) and deleting them, and deleting images with their templates."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from forkpoint.errors import Conflict, NotFound
from forkpoint.models import Checkpoint, CheckpointKind, FileCheck
from forkpoint.runtime.capacity import checkpoint_bytes, require_space
from forkpoint.runtime.checkpoints.writer import Captured, CheckpointOrigin
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.housekeeping.collector import Collector
from forkpoint.runtime.restore.prepare import RollbackPreparer
from forkpoint.store import CheckpointRecord, SessionRecord, session_lock_async, validate_name
from forkpoint.store.volumes import VolumesStore
from forkpoint.vm import Machine, MachineShape

if TYPE_CHECKING:
    from forkpoint.models import CheckpointTransfer
    from forkpoint.runtime.checkpoints.portable.common import Local, Progress
    from forkpoint.runtime.checkpoints.portable.objects import ObjectStore

__all__ = ["Checkpoints", "portable_home"]


def portable_home(context: RuntimeContext) -> Local:
    """This home as the portable checkpoint code sees it (push, pull, export, import)."""
    from forkpoint.runtime.checkpoints.portable.common import Local

    def shape_here(image_hash: str, memory_mib: int, cpus: int) -> MachineShape:
        return context.machine(image_hash, memory_mib, cpus)[1]

    return Local(context.home, context.store, shape_here)


def _quiet(_: str) -> None:
    """Progress nobody watches."""


class Checkpoints:
    def __init__(
        self, context: RuntimeContext, collector: Collector, preparer: RollbackPreparer
    ) -> None:
        self.context = context
        self.collector = collector
        self.preparer = preparer
        self.volumes = VolumesStore(context.store)

    async def checkpoint(
        self, session: str, name: str | None = None, *, kind: CheckpointKind = CheckpointKind.USER
    ) -> Checkpoint:
        """Checkpoint a running session (memory, devices, disk). The VM pauses briefly.
        ``kind``: why (``user``, or one of forkpoint's own purposes, hidden from lists).

        :raises Conflict: the session is not running; :raises QemuError: QEMU failed (the
            session keeps running and no checkpoint is recorded).
        """
        record = await asyncio.to_thread(self.context.store.get_session, session)
        validate_name(name, "checkpoint")
        if name is not None and await asyncio.to_thread(self._checkpoint_named, name):
            raise Conflict(f"checkpoint name {name!r} is already taken")
        async with session_lock_async(self.context.home, record.id):
            captured = await self.capture_held(record.id, name, kind)
            created = await captured.finish()
        self.context.finish_later(record.id, asyncio.to_thread(captured.prepare_next))
        self.preparer.in_background(record.id)
        return await asyncio.to_thread(self.context.queries.checkpoint_of, created)

    async def checkpoint_held(
        self, session_id: str, name: str | None, kind: CheckpointKind
    ) -> CheckpointRecord:
        """:meth:`checkpoint`'s work, under the session's lock."""
        return await (await self.capture_held(session_id, name, kind)).finish()

    async def capture_held(
        self, session_id: str, name: str | None, kind: CheckpointKind
    ) -> Captured:
        """The part of :meth:`checkpoint_held` that needs the VM (see
        ``Checkpointer.capture``), under the session's lock; a checkpoint of this session
        still finishing in this process is finished first (its file is this one's base)."""
        await self.context.settled(session_id)
        record = await asyncio.to_thread(self.context.queries.require_running, session_id)
        await asyncio.to_thread(
            require_space, self.context.home, checkpoint_bytes(record.memory_mib), "a checkpoint"
        )
        image, shape = await asyncio.to_thread(
            self.context.machine, record.image_hash, record.memory_mib, record.cpus
        )
        machine = await Machine.adopt(self.context.files(record.id), record.qemu_pid or 0)
        try:
            await machine.resume_if_paused()
            layer = await self._sync_disk_layer(machine, record)
            origin = CheckpointOrigin(
                session_id=record.id, name=name, kind=kind, image=image,
                shape=shape, parent=record.parent_checkpoint,
                guest_ports=tuple(p.guest_port for p in record.ports),
                volumes=await asyncio.to_thread(self.volumes.mounts_of, record.id),
            )  # fmt: skip
            return await self.context.checkpointer.capture(machine, layer, origin)
        finally:
            await machine.close()

    async def _sync_disk_layer(self, machine: Machine, record: SessionRecord) -> str:
        """The layer the VM really writes to. A forkpoint process killed between QEMU's
        disk snapshot and its store update leaves the VM on a layer the store has not
        recorded yet (stacked on the recorded one): adopt it."""
        active = (await machine.active_disk()).name
        if active != record.disk_layer:
            await asyncio.to_thread(self._adopt_layer, record, active)
        return active

    def _adopt_layer(self, record: SessionRecord, active: str) -> None:
        with self.context.store.transaction():
            self.context.store.insert_layer(active, backing=record.disk_layer)
            self.context.store.update_session(record.id, disk_layer=active)

    def _checkpoint_named(self, name: str) -> bool:
        try:
            self.context.store.get_checkpoint(name)
        except NotFound:
            return False
        return True

    def verify_checkpoint(self, checkpoint: str) -> list[FileCheck]:
        """Hash every file of a checkpoint against its manifest (blocking; reads the whole
        RAM file's data: ≈ 0.1 s per 100 MiB written). A file that differs is reported,
        not raised. :raises NotFound: :raises DamagedCheckpoint: its manifest is."""
        from forkpoint.runtime.checkpoints.integrity import verify_files

        record = self.context.store.get_checkpoint(checkpoint)
        return verify_files(self.context.checkpoint_files(record.id), record.manifest)

    async def push_checkpoint(
        self, checkpoint: str, to: str, *, endpoint: str | None = None,
        progress: Progress | None = None,
    ) -> CheckpointTransfer:  # fmt: skip
        """Upload a checkpoint to ``s3://BUCKET/PREFIX`` with the part of its lineage the
        bucket lacks (a child: the RAM pages that differ from its parent's). Its id and
        name become refs to its digest. Credentials: the usual AWS variables.

        :raises NotFound: no such checkpoint; :raises InvalidInput: not an S3 URL.
        """
        from forkpoint.runtime.checkpoints.portable.service import push_checkpoint

        return await asyncio.to_thread(
            push_checkpoint,
            portable_home(self.context),
            self.context.queries.checkpoint_of,
            checkpoint,
            to,
            endpoint,
            progress or _quiet,
        )

    async def pull_checkpoint(
        self, ref: str, source: str | ObjectStore, *, endpoint: str | None = None,
        progress: Progress | None = None,
    ) -> CheckpointTransfer:  # fmt: skip
        """Download the checkpoint ``ref`` (a digest, or a ref: an id or name it was
        pushed under) from ``s3://BUCKET/PREFIX`` (or another object store: a cluster
        node's export), with what this home lacks of its lineage. Fail-closed: every
        object is verified before anything becomes visible.

        :raises IncompatibleCheckpoint: this host cannot restore it (checked before any
            RAM is downloaded); :raises DamagedCheckpoint: an object does not match its
            digest; :raises NotFound: no such checkpoint there.
        """
        from forkpoint.runtime.checkpoints.portable.service import pull_checkpoint

        return await asyncio.to_thread(
            pull_checkpoint,
            portable_home(self.context),
            self.context.queries.checkpoint_of,
            ref,
            source,
            endpoint,
            progress or _quiet,
        )

    async def export_checkpoint(
        self, checkpoint: str, path: Path, *, progress: Progress | None = None
    ) -> CheckpointTransfer:
        """Write a checkpoint and its whole lineage into one archive (``import`` reads it)."""
        from forkpoint.runtime.checkpoints.portable.service import export_checkpoint

        return await asyncio.to_thread(
            export_checkpoint,
            portable_home(self.context),
            self.context.queries.checkpoint_of,
            checkpoint,
            path,
            progress or _quiet,
        )

    async def import_checkpoint(
        self, path: Path, *, progress: Progress | None = None
    ) -> CheckpointTransfer:
        """Read an archive written by :meth:`export_checkpoint` (checked as a pull is)."""
        from forkpoint.runtime.checkpoints.portable.service import import_checkpoint

        return await asyncio.to_thread(
            import_checkpoint,
            portable_home(self.context),
            self.context.queries.checkpoint_of,
            path,
            progress or _quiet,
        )

    async def remove_image(self, name: str) -> list[str]:
        """Delete every build of image ``name`` and its templates; returns their hashes.

        :raises NotFound: no such image. :raises InUse: a session or checkpoint needs it.
        """
        from forkpoint.runtime.housekeeping.image_removal import remove_image

        removed = await asyncio.to_thread(
            remove_image, self.context.home, self.context.store, self.context.checkpointer, name
        )
        await asyncio.to_thread(self.collector.gc)
        return removed
