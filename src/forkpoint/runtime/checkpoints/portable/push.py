"""Push a checkpoint, and whatever of its lineage the store lacks, to an object store.

The parent first (recursively; skipped when the store has it), then the blobs — a RAM pack
of the pages that differ from the parent's RAM, the device state, the disk layers with
relative backing names — and the manifest last, so a manifest in the store means its
checkpoint is complete. Then refs: the checkpoint's id and name point at its digest.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from forkpoint.runtime.checkpoints.manifest import CheckpointFiles
from forkpoint.runtime.checkpoints.portable.bundle import Blob, LayerBlob, PortableManifest, RamPack
from forkpoint.runtime.checkpoints.portable.common import Index, Local, Progress, compress, scratch
from forkpoint.runtime.checkpoints.portable.objects import ObjectStore, sha256_file
from forkpoint.runtime.checkpoints.portable.ramdiff import PAGE, write_pack
from forkpoint.store import CheckpointRecord
from forkpoint.vm.disk import rebase_unsafe
from forkpoint.vm.host import host_facts, host_tsc_khz

__all__ = ["Pusher"]


def _portable_backing(backing: str | None, image_hash: str) -> str:
    """A layer's backing name as it travels: the layer file next to it, or the image's
    root disk — relative, so the same layer has the same bytes from any home."""
    return backing if backing is not None else f"../images/{image_hash}/rootfs.qcow2"


class Pusher:
    """Writes checkpoints of one home into one object store."""

    def __init__(self, local: Local, objects: ObjectStore, progress: Progress) -> None:
        self.local = local
        self.objects = objects
        self.index = Index(local.root)
        self.progress = progress

    def push(self, checkpoint: str, refs: tuple[str, ...] = ()) -> tuple[CheckpointRecord, str]:
        """Push ``checkpoint`` and the part of its lineage the store lacks; point its id,
        its name and ``refs`` at it. Returns the checkpoint and its digest."""
        record = self.local.store.get_checkpoint(checkpoint)
        digest = self._push(record)
        for ref in (record.id, *((record.name,) if record.name else ()), *refs):
            self.objects.put_bytes(f"refs/{ref}", f"sha256:{digest}\n".encode(), overwrite=True)
        return record, digest

    def _push(self, record: CheckpointRecord) -> str:
        known = self.index.digest_of(record.id)
        if known is not None and self.objects.has(f"manifests/{known}"):
            self.objects.counter.skipped_objects += 1
            return known  # already there, with everything it refers to
        parent = None
        if record.parent_checkpoint is not None:
            parent = self._push(self.local.store.get_checkpoint(record.parent_checkpoint))
        self.progress(f"pushing {record.id}")
        files = CheckpointFiles.of(self.local.home, record.id)
        checkpoint = json.loads(files.manifest.read_text())
        if not checkpoint.get("host"):
            # Made here by a forkpoint that did not record host facts yet: they are ours.
            accel = str(checkpoint["machine"]["accel"])
            checkpoint["host"] = host_facts(accel, host_tsc_khz())
        with scratch(self.local) as tmp:
            base = (
                CheckpointFiles.of(self.local.home, record.parent_checkpoint).ram
                if record.parent_checkpoint is not None
                else None
            )
            pack = tmp / "ram.pack"
            stats = write_pack(files.ram, base, pack)
            ram = RamPack(
                digest=sha256_file(pack), bytes=stats.stored_bytes,
                size=files.ram.stat().st_size, page_size=PAGE, pages=stats.pages,
            )  # fmt: skip
            self.objects.put_file(ram.key, pack)
            state = self._put_compressed(files.state, tmp / "state.zst")
            layers = tuple(self._put_layer(name, record.image_hash, tmp) for name in
                           self.local.store.layer_chain(record.disk_layer))  # fmt: skip
        manifest = PortableManifest(
            checkpoint=checkpoint, parent=parent, ram=ram, state=state, layers=layers,
            image_name=record.image, image_hash=record.image_hash,
        )  # fmt: skip
        # Last: a manifest in the store means everything it names is there.
        self.objects.put_bytes(f"manifests/{manifest.digest}", manifest.encode())
        self.index.record(record.id, manifest.digest)
        return manifest.digest

    def _put_compressed(self, src: Path, dest: Path) -> Blob:
        compress(src, dest)
        blob = Blob(digest=sha256_file(dest), bytes=dest.stat().st_size)
        self.objects.put_file(blob.key, dest)
        return blob

    def _put_layer(self, name: str, image_hash: str, tmp: Path) -> LayerBlob:
        """A frozen layer never changes: its blob is computed once per home."""
        cached = self.index.layer(name)
        if cached is not None and self.objects.has(cached.key):
            return cached
        layer = self.local.store.get_layer(name)
        copy = tmp / name
        shutil.copyfile(self.local.home.layers / name, copy)
        rebase_unsafe(copy, _portable_backing(layer.backing, image_hash))
        blob = self._put_compressed(copy, tmp / f"{name}.zst")
        copy.unlink()
        result = LayerBlob(digest=blob.digest, bytes=blob.bytes, name=name, backing=layer.backing)
        self.index.record_layer(result)
        return result
