"""Writing a checkpoint so that it is all there or not at all, and deleting one.

The files go into a temp directory (fsynced), which is renamed into place; only then is
the checkpoint recorded in the store. A process killed halfway leaves an invisible
``.tmp-<id>`` directory and no record.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

from forkpoint import faults
from forkpoint.config import Home
from forkpoint.errors import ForkpointError, InternalError
from forkpoint.images import Image
from forkpoint.models import CheckpointKind
from forkpoint.runtime.checkpoints.integrity import SUM_KEY, describe_files, remember_sum
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles, Manifest
from forkpoint.runtime.sessions.machines import new_layer_name
from forkpoint.store import CheckpointRecord, Store, new_checkpoint_id
from forkpoint.vm import Machine, MachineShape, qemu_build
from forkpoint.vm.disk import ensure_blank
from forkpoint.vm.host import host_facts, host_tsc_khz
from forkpoint.vm.ramfile import prepare_copy
from forkpoint.vm.shape import ARGV_LAYOUT_VERSION
from forkpoint.vm.stats import CheckpointStats

__all__ = ["Captured", "CheckpointOrigin", "Checkpointer"]


@dataclass(frozen=True)
class CheckpointOrigin:
    """Whose checkpoint it is: recorded in its manifest and in the store."""

    session_id: str
    name: str | None
    kind: CheckpointKind
    image: Image
    shape: MachineShape
    parent: str | None
    guest_ports: tuple[int, ...]
    volumes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Captured:
    """A checkpoint whose files hold the VM's state (the VM runs on), not yet listed."""

    writer: Checkpointer
    origin: CheckpointOrigin
    layer: str
    final: CheckpointFiles
    stats: CheckpointStats
    restore_listeners: bool
    started: float

    async def finish(self) -> CheckpointRecord:
        """Sums, manifest and fsync, then into place and into the store: listed, durable
        and verifiable from here. On failure nothing is listed and the files are gone.

        :raises InternalError: the files could not be written (e.g. the disk is full).
        """
        writer, origin, stats, final = self.writer, self.origin, self.stats, self.final
        staging = final.staging()
        async with _removed_on_failure(final):
            # Sizes and hashes, checked before every restore (see integrity).
            try:
                described = await asyncio.to_thread(
                    describe_files, staging, stats.ram_base, stats.written_ranges,
                    self.vm_dir,
                )  # fmt: skip
            finally:
                if stats.ram_base_fd is not None:
                    os.close(stats.ram_base_fd)
            faults.point("checkpoint.files-hashed")
            manifest = Manifest(
                id=final.dir.name, session_id=origin.session_id, name=origin.name,
                kind=origin.kind, shape=origin.shape, argv_layout=ARGV_LAYOUT_VERSION,
                qemu_version=qemu_build().version, image=origin.image.name,
                image_hash=origin.image.hash, disk_layer=self.layer,
                parent_checkpoint=origin.parent, ports=origin.guest_ports, stats=stats,
                duration_ms=(time.perf_counter() - self.started) * 1000,
                host=await asyncio.to_thread(writer._host_facts, origin), files=described,
                restore_listeners=self.restore_listeners, volumes=origin.volumes,
            )  # fmt: skip
            await asyncio.to_thread(writer._publish, manifest, staging, final)
        if stats.rebased:  # now, not later: the checkpoint may be deleted right after
            with contextlib.suppress(OSError):
                recorded = described["ram"][SUM_KEY]
                await asyncio.to_thread(remember_sum, self.vm_dir, final.ram, recorded)
        return await asyncio.to_thread(writer._insert, manifest, final)

    def prepare_next(self) -> None:
        """What the session's next checkpoint and this one's restores would otherwise do
        on their caller's path (blocking; run after this one is listed): the frozen
        layer's blank overlay, and a copy of the RAM file the VM now maps, in its
        directory. Best effort: without them, they are made when needed."""
        with contextlib.suppress(OSError, ForkpointError):
            ensure_blank(self.writer.home.layers / self.layer)
            if self.stats.rebased:
                prepare_copy(self.final.ram, self.vm_dir)

    @property
    def vm_dir(self) -> Path:
        """The directory of the VM checkpointed (see ``VmFiles``)."""
        return self.writer.home.sessions / self.origin.session_id


class Checkpointer:
    """Writes and deletes the checkpoints of one home."""

    def __init__(self, home: Home, store: Store) -> None:
        self.home = home
        self.store = store

    def files(self, checkpoint_id: str) -> CheckpointFiles:
        return CheckpointFiles.of(self.home, checkpoint_id)

    async def write(
        self, machine: Machine, layer: str, origin: CheckpointOrigin
    ) -> CheckpointRecord:
        """Checkpoint the running ``machine`` (which writes to the disk ``layer``): the
        layer is frozen and the VM continues on a new one, recorded as the session's (a
        user checkpoint) whatever else happens.

        :raises QemuError: QEMU failed; nothing is recorded and the VM runs on.
        """
        return await (await self.capture(machine, layer, origin)).finish()

    async def capture(self, machine: Machine, layer: str, origin: CheckpointOrigin) -> Captured:
        """:meth:`write`'s part with the VM: its state is in files when this returns and
        the VM runs on; :meth:`Captured.finish` makes them a checkpoint (sums, manifest,
        fsync, the store). Nothing is listed before that.

        :raises QemuError: QEMU failed; nothing is recorded and the VM runs on.
        """
        started = time.perf_counter()
        final = self.files(new_checkpoint_id())
        staging = final.staging()
        await asyncio.to_thread(staging.dir.mkdir)
        faults.point("checkpoint.staging-made")
        new_top = new_layer_name()
        async with _removed_on_failure(final):
            try:
                listeners = await machine.restore_listeners()  # a QMP query, ≈ 1 ms
                stats = await machine.checkpoint(
                    self.home.layers / new_top,
                    staging.state,
                    staging.ram,
                    origin.shape.memory_mib << 20,
                )
            finally:
                # Whatever happened, record the layer the VM now writes to.
                await asyncio.to_thread(self._record_new_top, origin, layer, new_top)
        return Captured(self, origin, layer, final, stats, listeners, started)

    def _host_facts(self, origin: CheckpointOrigin) -> dict[str, object]:
        # The guest kernel read its TSC rate once, at the cold boot that began its
        # lineage: a checkpoint of a restored VM keeps its parent's, wherever it runs now.
        tsc_khz = host_tsc_khz()
        if origin.parent is not None:
            try:
                inherited = Manifest.load(self.files(origin.parent)).host.get("tsc_khz")
            except ForkpointError:
                inherited = None
            if isinstance(inherited, int):
                tsc_khz = inherited
        return host_facts(origin.shape.accel, tsc_khz)

    def _record_new_top(self, origin: CheckpointOrigin, frozen: str, new_top: str) -> None:
        if not (self.home.layers / new_top).exists():
            return  # QEMU failed before switching layers
        with self.store.transaction():
            self.store.insert_layer(new_top, backing=frozen)
            if origin.kind != CheckpointKind.TEMPLATE:  # a session of the store's
                self.store.update_session(origin.session_id, disk_layer=new_top)
        faults.point("checkpoint.new-top-recorded")

    def _publish(
        self, manifest: Manifest, staging: CheckpointFiles, final: CheckpointFiles
    ) -> None:
        # On disk before it can be listed (a power cut must not leave a listed checkpoint
        # with pages lost): what is dirty is what this checkpoint wrote, the change.
        _fsync(staging.ram)
        _fsync(staging.state)
        manifest.save(staging)
        _fsync(staging.dir)
        faults.point("checkpoint.manifest-written")
        os.rename(staging.dir, final.dir)  # atomic: a checkpoint is all there or not at all
        _fsync(final.dir.parent)
        faults.point("checkpoint.published")

    def _insert(self, manifest: Manifest, files: CheckpointFiles) -> CheckpointRecord:
        record = CheckpointRecord.new(
            session_id=manifest.session_id, disk_layer=manifest.disk_layer,
            image=manifest.image, image_hash=manifest.image_hash, manifest=manifest.to_dict(),
            size_bytes=manifest.stats.ram_bytes + manifest.stats.state_bytes,
            name=manifest.name, kind=manifest.kind, parent_checkpoint=manifest.parent_checkpoint,
        )  # fmt: skip
        try:
            inserted = self.store.insert_checkpoint(replace(record, id=manifest.id))
            faults.point("checkpoint.recorded")
            return inserted
        except BaseException:
            shutil.rmtree(files.dir, ignore_errors=True)
            raise

    def delete(self, checkpoint_id: str) -> None:
        """Forget a checkpoint and delete its files (blocking).

        :raises InUse: sessions or checkpoints depend on it.
        """
        from forkpoint.runtime.sessions.warm import (
            WarmPool,  # here: warm VMs start restores, which need this module
        )

        record = self.store.get_checkpoint(checkpoint_id)
        self.store.delete_checkpoint(record.id)
        faults.point("checkpoint-rm.row-deleted")
        WarmPool(self.home, self.store).drain(record.id)  # they map its RAM file
        shutil.rmtree(self.files(record.id).dir, ignore_errors=True)
        faults.point("checkpoint-rm.files-deleted")


@contextlib.asynccontextmanager
async def _removed_on_failure(final: CheckpointFiles) -> AsyncIterator[None]:
    """The checkpoint's staging directory deleted if the block fails; a file system error
    said in one line."""
    try:
        yield
    except BaseException as error:
        await asyncio.to_thread(shutil.rmtree, final.staging().dir, ignore_errors=True)
        if isinstance(error, OSError):  # e.g. the disk filled up (found by the campaign)
            raise InternalError(
                f"writing checkpoint {final.dir.name} failed: {error.strerror or error}"
            ) from error
        raise


def _fsync(path: Path) -> None:
    """A file's or a directory's content on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
