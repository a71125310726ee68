"""What push and pull share: the home they work on, its digest index, scratch space and
the compression of blobs."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import zstandard

from forkpoint.config import Home
from forkpoint.images.tmpdirs import pid_alive
from forkpoint.runtime.checkpoints.portable.bundle import LayerBlob
from forkpoint.store import Store
from forkpoint.vm.shape import MachineShape

__all__ = ["EXPORT_REF", "Index", "Local", "Progress", "compress", "decompress", "scratch"]

#: The ref an export archive names its checkpoint with.
EXPORT_REF = "refs/.export"
_LEVEL = 3

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
def scratch(local: Local) -> Iterator[Path]:
    """A private directory on the home's filesystem (RAM packs are built and checked
    there), removed afterwards whatever happened; those of killed runs (named by the pid
    that made them) go when the next push or pull starts."""
    root = local.root / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        pid = old.name.split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    path = root / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def compress(src: Path, dest: Path) -> None:
    with src.open("rb") as fin, dest.open("wb") as fout:
        zstandard.ZstdCompressor(level=_LEVEL).copy_stream(fin, fout)


def decompress(src: Path, dest: Path) -> None:
    with src.open("rb") as fin, dest.open("wb") as fout:
        zstandard.ZstdDecompressor().copy_stream(fin, fout)
        fout.flush()
        os.fsync(fout.fileno())
