"""Pull a checkpoint into this home, fail-closed.

Every manifest of the lineage the home lacks is fetched, verified against its digest and
checked against this host *before any blob is downloaded*; then every blob is fetched into
a private scratch directory and verified; only then are layers, RAM files and checkpoints
made, each written aside and renamed into place as checkpoints always are. A refused or
corrupt pull leaves the home as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

from forkpoint.errors import Conflict, DamagedCheckpoint, IncompatibleCheckpoint, NotFound
from forkpoint.images import get_image
from forkpoint.models import CheckpointKind
from forkpoint.runtime.capacity import checkpoint_bytes, require_space
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles, Manifest
from forkpoint.runtime.checkpoints.portable.bundle import Blob, PortableManifest, parse_ref
from forkpoint.runtime.checkpoints.portable.common import (
    Index,
    Local,
    Progress,
    decompress,
    scratch,
)
from forkpoint.runtime.checkpoints.portable.objects import ObjectStore, sha256_file
from forkpoint.runtime.checkpoints.portable.ramdiff import apply_pack
from forkpoint.store import CheckpointRecord
from forkpoint.vm.disk import rebase_unsafe
from forkpoint.vm.host import host_facts, host_tsc_khz

__all__ = ["Puller"]

_TSC_TOLERANCE = 0.001  # /proc/cpuinfo's reading of the rate, not the rate: allow its jitter


def _same_fact(key: str, theirs: object, mine: object) -> bool:
    """Equal; a TSC rate within 0.1% (the guest's clock would drift by as much, and each
    restore and agent connection sets it from the host's)."""
    if key == "tsc_khz" and isinstance(theirs, int) and isinstance(mine, int) and mine:
        return abs(theirs - mine) <= _TSC_TOLERANCE * mine
    return theirs == mine


class Puller:
    """Brings checkpoints from one object store into one home (one at a time: callers
    hold the home's ``pull`` lock, see :mod:`.service`)."""

    def __init__(self, local: Local, objects: ObjectStore, progress: Progress) -> None:
        self.local = local
        self.objects = objects
        self.index = Index(local.root)
        self.progress = progress

    def resolve(self, ref: str) -> str:
        """The digest ``ref`` names (a digest, or a ref in the store).

        :raises NotFound:
        """
        digest, name = parse_ref(ref)
        if digest is not None:
            return digest
        key = ref if ref.startswith("refs/") else f"refs/{name}"
        try:
            text = self.objects.get_bytes(key).decode().strip()
        except NotFound:
            raise NotFound(f"no checkpoint {ref!r} in {self.objects.describe()}") from None
        found, _ = parse_ref(text)
        if found is None:
            raise DamagedCheckpoint(f"ref {ref!r} in {self.objects.describe()} is malformed")
        return found

    def pull(self, ref: str) -> tuple[str, str]:
        """Pull the checkpoint ``ref`` names and the part of its lineage this home lacks.
        Returns its local id and its digest.

        :raises IncompatibleCheckpoint: this host cannot restore it (nothing downloaded
            but manifests); :raises DamagedCheckpoint: an object does not match its digest
            (nothing made visible); :raises NotFound: no such checkpoint in the store.
        """
        digest = self.resolve(ref)
        # Layers a killed pull was writing (only pulls make these; we hold the pull lock).
        for part in self.local.home.layers.glob(".*.part"):
            part.unlink(missing_ok=True)
        chain: list[tuple[str, PortableManifest]] = []
        at: str | None = digest
        while at is not None and self._local_id(at) is None:
            manifest = PortableManifest.decode(self.objects.get_bytes(f"manifests/{at}"), at)
            self._check(manifest)
            chain.append((at, manifest))
            at = manifest.parent
        if chain:
            # Blobs, then each checkpoint as written (at most its RAM and overhead).
            need = sum(
                sum(b.bytes for b in (m.ram, m.state, *m.layers))
                + checkpoint_bytes(m.ram.size >> 20)
                for _, m in chain
            )
            require_space(self.local.home, need, "a pull")
            with scratch(self.local) as tmp:
                for _, manifest in chain:
                    self._fetch(manifest, tmp)
                for at_digest, manifest in reversed(chain):  # parents first
                    self._materialise(at_digest, manifest, tmp)
        local_id = self._local_id(digest)
        assert local_id is not None
        return local_id, digest

    def _local_id(self, digest: str) -> str | None:
        checkpoint_id = self.index.checkpoint_of(digest)
        if checkpoint_id is None:
            return None
        try:
            self.local.store.get_checkpoint(checkpoint_id)
        except NotFound:
            return None
        return checkpoint_id

    # -- before any blob: compatibility ------------------------------------------------

    def _check(self, portable: PortableManifest) -> None:
        """Refuse what this host cannot restore, naming the difference (the QEMU build,
        accelerator, argv layout, machine shape via the manifest's own check; then the
        host facts; then the image its disk stacks on)."""
        manifest = Manifest.from_dict(portable.checkpoint)
        if portable.ram.size != manifest.shape.memory_mib << 20:
            raise DamagedCheckpoint(
                f"checkpoint {manifest.id}: a RAM of {portable.ram.size} bytes for a guest of "
                f"{manifest.shape.memory_mib} MiB"
            )
        try:
            here = self.local.shape_here(
                portable.image_hash, manifest.shape.memory_mib, manifest.shape.cpus
            )
        except NotFound as error:
            raise IncompatibleCheckpoint(
                f"checkpoint {manifest.id} stacks on image {portable.image_name} "
                f"({portable.image_hash[:12]}), which this host lacks ({error.message})"
            ) from None
        manifest.check_compatible(here)
        theirs = portable.checkpoint.get("host") or {}
        mine = host_facts(here.accel, host_tsc_khz())
        for key, value in sorted(mine.items()):
            if not _same_fact(key, theirs.get(key), value):
                raise IncompatibleCheckpoint(
                    f"checkpoint {manifest.id} was made on a host with {key}="
                    f"{theirs.get(key)!r}, this host has {key}={value!r}; it cannot be "
                    "restored here"
                )

    # -- blobs -------------------------------------------------------------------------

    def _fetch(self, manifest: PortableManifest, tmp: Path) -> None:
        needed: list[Blob] = [manifest.ram, manifest.state]
        needed += [layer for layer in manifest.layers if not self._have_layer(layer.name)]
        for blob in needed:
            dest = tmp / blob.digest
            if dest.exists():
                continue
            self.progress(f"fetching {blob.key} ({blob.bytes} bytes)")
            self.objects.get_file(blob.key, dest, max_bytes=blob.bytes)
            actual = sha256_file(dest)
            if actual != blob.digest:
                raise DamagedCheckpoint(
                    f"object {blob.key} in {self.objects.describe()} is corrupt: its bytes "
                    f"hash to {actual[:16]}…, not {blob.digest[:16]}…; nothing was imported"
                )

    def _have_layer(self, name: str) -> bool:
        try:
            self.local.store.get_layer(name)
        except NotFound:
            return False
        return True

    # -- making it visible -------------------------------------------------------------

    def _materialise(self, digest: str, portable: PortableManifest, tmp: Path) -> None:
        home, store = self.local.home, self.local.store
        checkpoint_id = portable.id
        try:
            store.get_checkpoint(checkpoint_id)
        except NotFound:
            pass
        else:
            raise Conflict(
                f"a different checkpoint {checkpoint_id} exists in this home; remove it to "
                "pull this one"
            )
        parent_id = self._local_id(portable.parent) if portable.parent else None
        if portable.parent is not None and parent_id is None:
            raise NotFound(f"parent {portable.parent[:16]} of {checkpoint_id} is missing")
        self.progress(f"importing {checkpoint_id}")
        new_layers = self._make_layers(portable, tmp)
        files = CheckpointFiles.of(home, checkpoint_id)
        staging = files.staging()
        shutil.rmtree(staging.dir, ignore_errors=True)  # left by a killed pull
        staging.dir.mkdir()
        try:
            base = CheckpointFiles.of(home, parent_id).ram if parent_id else None
            apply_pack(tmp / portable.ram.digest, base, portable.ram.size, staging.ram)
            decompress(tmp / portable.state.digest, staging.state)
            data = dict(portable.checkpoint, parent_checkpoint=parent_id)
            staging.manifest.write_text(json.dumps(data, indent=2, sort_keys=True))
            staging.manifest.chmod(0o444)
            os.rename(staging.dir, files.dir)
        except BaseException:
            shutil.rmtree(staging.dir, ignore_errors=True)
            for name in new_layers:
                (home.layers / name).unlink(missing_ok=True)
            raise
        try:
            self._record(portable, data, parent_id, new_layers)
        except BaseException:
            shutil.rmtree(files.dir, ignore_errors=True)
            for name in new_layers:
                (home.layers / name).unlink(missing_ok=True)
            raise
        self.index.record(checkpoint_id, digest)

    def _make_layers(self, portable: PortableManifest, tmp: Path) -> list[str]:
        """The layers this home lacks, bottom first, with this home's backing paths (the
        runtime names backing files by absolute path); returns their names."""
        made: list[str] = []
        try:
            for layer in reversed(portable.layers):
                if self._have_layer(layer.name) or layer.name in made:
                    continue
                if layer.backing is not None:
                    backing = self.local.home.layers / layer.backing
                else:
                    image = get_image(portable.image_hash, self.local.home.images)
                    backing = image.rootfs
                dest = self.local.home.layers / layer.name
                part = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
                decompress(tmp / layer.digest, part)
                rebase_unsafe(part, str(backing.resolve()))
                os.rename(part, dest)
                made.append(layer.name)
        except BaseException:
            for name in made:
                (self.local.home.layers / name).unlink(missing_ok=True)
            raise
        return made

    def _record(
        self,
        portable: PortableManifest,
        data: dict[str, object],
        parent_id: str | None,
        new_layers: list[str],
    ) -> None:
        store = self.local.store
        manifest = Manifest.from_dict(portable.checkpoint)
        by_name = {layer.name: layer for layer in portable.layers}
        name = manifest.name
        if name is not None:
            try:
                store.get_checkpoint(name)
                name = None  # taken here: the pulled one is known by its id
            except NotFound:
                pass
        record = CheckpointRecord.new(
            session_id=manifest.session_id, disk_layer=manifest.disk_layer,
            image=portable.image_name, image_hash=portable.image_hash, manifest=data,
            size_bytes=manifest.stats.ram_bytes + manifest.stats.state_bytes, name=name,
            kind=CheckpointKind(manifest.kind), parent_checkpoint=parent_id,
        )  # fmt: skip
        # One transaction: a GC between the layers and the checkpoint would take them.
        with store.transaction():
            for layer_name in new_layers:  # bottom first, as made
                store.insert_layer(layer_name, backing=by_name[layer_name].backing)
            store.insert_checkpoint(replace(record, id=manifest.id))
