"""The portable manifest: one checkpoint as content-addressed objects, and what a host must
match to restore it.

Its sha256 (of the canonical JSON) is the checkpoint's portable identity; names are refs
to it. It embeds the checkpoint's own ``manifest.json`` unchanged (the local manifest stays
the one source of what a checkpoint is), and adds where its bytes are:

- ``parent``: the parent checkpoint's digest (None: the RAM diff is against zeros);
- ``ram``: the pack of pages that differ from the parent's RAM (see :mod:`.ramdiff`);
- ``state``: the device state blob;
- ``layers``: the disk layers, top first down to the one on the image, each a blob;
- ``image``: the image (by hash) the bottom layer stacks on; the target must have it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from forkpoint.errors import CorruptCheckpoint, IncompatibleCheckpoint

__all__ = ["FORMAT", "Blob", "LayerBlob", "PortableManifest", "RamPack", "parse_ref"]

FORMAT = "forkpoint-portable/1"


@dataclass(frozen=True)
class Blob:
    digest: str  # sha256 hex of the stored (compressed) bytes
    bytes: int

    @property
    def key(self) -> str:
        return f"blobs/{self.digest}"


@dataclass(frozen=True)
class RamPack(Blob):
    size: int  # the RAM file's size
    page_size: int
    pages: int  # pages in the pack


@dataclass(frozen=True)
class LayerBlob(Blob):
    name: str  # the layer's file name (unique per home, kept on import)
    backing: str | None  # the layer below (None: the image's root disk)


@dataclass(frozen=True)
class PortableManifest:
    checkpoint: dict[str, Any]
    parent: str | None
    ram: RamPack
    state: Blob
    layers: tuple[LayerBlob, ...]
    image_name: str
    image_hash: str

    @property
    def id(self) -> str:
        return str(self.checkpoint["id"])

    def encode(self) -> bytes:
        """Canonical JSON: the same checkpoint always gives the same bytes."""
        data = {
            "format": FORMAT,
            "checkpoint": self.checkpoint,
            "parent": self.parent,
            "ram": asdict(self.ram),
            "state": asdict(self.state),
            "layers": [asdict(layer) for layer in self.layers],
            "image": {"name": self.image_name, "hash": self.image_hash},
        }
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    @classmethod
    def decode(cls, data: bytes, digest: str) -> PortableManifest:
        """The manifest stored under ``digest``, verified first.

        :raises CorruptCheckpoint: its bytes do not hash to ``digest``, or are not a
            manifest; :raises IncompatibleCheckpoint: another format.
        """
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise CorruptCheckpoint(
                f"manifest {digest[:16]} is corrupt: its bytes hash to {actual[:16]}"
            )
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise IncompatibleCheckpoint(
                    f"manifest {digest[:16]} has format {raw.get('format')!r}; "
                    f"this forkpoint reads {FORMAT}"
                )
            return cls(
                checkpoint=dict(raw["checkpoint"]),
                parent=raw["parent"],
                ram=RamPack(**raw["ram"]),
                state=Blob(**raw["state"]),
                layers=tuple(LayerBlob(**layer) for layer in raw["layers"]),
                image_name=str(raw["image"]["name"]),
                image_hash=str(raw["image"]["hash"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CorruptCheckpoint(f"manifest {digest[:16]} is malformed: {error}") from error


def parse_ref(ref: str) -> tuple[str | None, str]:
    """``sha256:<hex>`` or 64 hex digits → (digest, ""); anything else is a name → (None,
    name)."""
    text = ref.removeprefix("sha256:")
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text, ""
    return None, ref
