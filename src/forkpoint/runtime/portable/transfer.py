"""Push a checkpoint (and whatever of its lineage the store lacks) to an object store, and
pull one into this home, fail-closed.

Push: the parent first (recursively; skipped when the store has it), then the blobs — a
RAM pack of the pages that differ from the parent's RAM, the device state, the disk layers
with relative backing names — and the manifest last, so a manifest in the store means its
checkpoint is complete. Then refs: the checkpoint's id and name point at its digest.

Pull: every manifest of the lineage the home lacks is fetched, verified against its digest
and checked against this host *before any blob is downloaded*; then every blob is fetched
into a private staging directory and verified; only then are layers, RAM files and
checkpoints made, each written aside and renamed into place as checkpoints always are.
A refused or corrupt pull leaves the home as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import zstandard

from forkpoint.config import Home
from forkpoint.errors import (
    Conflict,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    NotFound,
)
from forkpoint.images import get_image
from forkpoint.models import CheckpointKind
from forkpoint.runtime.manifest import CheckpointFiles, Manifest
from forkpoint.store import CheckpointRecord, Store
from forkpoint.vm.disk import rebase_unsafe
from forkpoint.vm.host import host_facts, host_tsc_khz
from forkpoint.vm.shape import MachineShape

from .bundle import Blob, LayerBlob, PortableManifest, RamPack, parse_ref
from .objects import ObjectStore, sha256_file
from .ramdiff import PAGE, apply_pack, write_pack

__all__ = ["EXPORT_REF", "Index", "Local", "Puller", "Pusher"]

#: The ref an export archive names its checkpoint with.
EXPORT_REF = "refs/.export"
_LEVEL = 3
_CHUNK = 1 << 20

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Local:
    """What push and pull need of this home. ``shape_here(image_hash, memory_mib, cpus)``:
    the machine shape this host would restore on (raises if it has no such image)."""

    home: Home
    store: Store
    shape_here: Callable[[str, int, int], MachineShape]

    @property
    def root(self) -> Path:
        return self.home.portable


class Index:
    """Which checkpoint of this home has which portable digest (pushed from it or pulled
    into it), and the blobs of its disk layers: ``$FORKPOINT_HOME/portable/``. Kept apart
    from the checkpoint manifest and the database on purpose (it is a cache: losing it
    costs a recomputation, never a wrong answer, since digests are of content)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    def _write(self, kind: str, key: str, text: str) -> None:
        path = self._path(kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(text)
        os.replace(tmp, path)

    def _read(self, kind: str, key: str) -> str | None:
        try:
            return self._path(kind, key).read_text().strip() or None
        except OSError:
            return None

    def digest_of(self, checkpoint_id: str) -> str | None:
        return self._read("checkpoints", checkpoint_id)

    def checkpoint_of(self, digest: str) -> str | None:
        return self._read("digests", digest)

    def record(self, checkpoint_id: str, digest: str) -> None:
        self._write("checkpoints", checkpoint_id, digest)
        self._write("digests", digest, checkpoint_id)

    def layer(self, name: str) -> LayerBlob | None:
        text = self._read("layers", name)
        return LayerBlob(**json.loads(text)) if text else None

    def record_layer(self, blob: LayerBlob) -> None:
        self._write("layers", blob.name, json.dumps(asdict(blob)))


@contextmanager
def _scratch(local: Local) -> Iterator[Path]:
    """A private directory on the home's filesystem (RAM packs are built and checked
    there), removed afterwards whatever happened; those of killed runs (named by the pid
    that made them) go when the next push or pull starts."""
    root = local.root / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        pid = old.name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    path = root / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _compress(src: Path, dest: Path) -> None:
    with src.open("rb") as fin, dest.open("wb") as fout:
        zstandard.ZstdCompressor(level=_LEVEL).copy_stream(fin, fout)


def _decompress(src: Path, dest: Path) -> None:
    with src.open("rb") as fin, dest.open("wb") as fout:
        zstandard.ZstdDecompressor().copy_stream(fin, fout)
        fout.flush()
        os.fsync(fout.fileno())


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
        with _scratch(self.local) as tmp:
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
        _compress(src, dest)
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
            raise CorruptCheckpoint(f"ref {ref!r} in {self.objects.describe()} is malformed")
        return found

    def pull(self, ref: str) -> tuple[str, str]:
        """Pull the checkpoint ``ref`` names and the part of its lineage this home lacks.
        Returns its local id and its digest.

        :raises IncompatibleCheckpoint: this host cannot restore it (nothing downloaded
            but manifests); :raises CorruptCheckpoint: an object does not match its digest
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
            with _scratch(self.local) as tmp:
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
            self.objects.get_file(blob.key, dest)
            actual = sha256_file(dest)
            if actual != blob.digest:
                raise CorruptCheckpoint(
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
            _decompress(tmp / portable.state.digest, staging.state)
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
                _decompress(tmp / layer.digest, part)
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
