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
import re
from dataclasses import asdict, dataclass
from typing import Any

from forkpoint.errors import DamagedCheckpoint, IncompatibleCheckpoint
from forkpoint.models import ID_PATTERN

__all__ = ["FORMAT", "Blob", "LayerBlob", "PortableManifest", "RamPack", "parse_ref"]

FORMAT = "forkpoint-portable/1"

_DIGEST = re.compile(r"[0-9a-f]{64}")
_CHECKPOINT_ID = re.compile(ID_PATTERN.removeprefix("^").removesuffix("$"))
_IMAGE_HASH = re.compile(r"[0-9a-f]{8,64}")
_FILE_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]{0,127}")


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

        :raises DamagedCheckpoint: its bytes do not hash to ``digest``, or are not a
            manifest; :raises IncompatibleCheckpoint: another format.
        """
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise DamagedCheckpoint(
                f"manifest {digest[:16]} is corrupt: its bytes hash to {actual[:16]}"
            )
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise IncompatibleCheckpoint(
                    f"manifest {digest[:16]} has format {raw.get('format')!r}; "
                    f"this forkpoint reads {FORMAT}"
                )
            manifest = cls(
                checkpoint=dict(raw["checkpoint"]),
                parent=raw["parent"],
                ram=RamPack(**raw["ram"]),
                state=Blob(**raw["state"]),
                layers=tuple(LayerBlob(**layer) for layer in raw["layers"]),
                image_name=str(raw["image"]["name"]),
                image_hash=str(raw["image"]["hash"]),
            )
            manifest._validate()
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise DamagedCheckpoint(f"manifest {digest[:16]} is malformed: {error}") from error
        return manifest

    def _validate(self) -> None:
        """Names from a store become file names here: only plain ones, consistent ones.

        :raises ValueError: naming what is wrong.
        """
        digests = [self.ram.digest, self.state.digest, *(layer.digest for layer in self.layers)]
        if self.parent is not None:
            digests.append(self.parent)
        for digest in digests:
            if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
                raise ValueError(f"not a sha256 digest: {digest!r}")
        if not isinstance(self.checkpoint.get("id"), str) or not _CHECKPOINT_ID.fullmatch(
            self.checkpoint["id"]
        ):
            raise ValueError(f"not a checkpoint id: {self.checkpoint.get('id')!r}")
        if not _IMAGE_HASH.fullmatch(self.image_hash):
            raise ValueError(f"not an image hash: {self.image_hash!r}")
        if not self.layers or self.checkpoint.get("disk_layer") != self.layers[0].name:
            raise ValueError("the layers do not start with the checkpoint's disk layer")
        for upper, lower in zip(self.layers, (*self.layers[1:], None), strict=True):
            if not _FILE_NAME.fullmatch(upper.name):
                raise ValueError(f"not a layer file name: {upper.name!r}")
            if upper.backing != (lower.name if lower is not None else None):
                raise ValueError(f"layer {upper.name} does not stack on the next one")
        if self.ram.page_size <= 0 or self.ram.size % self.ram.page_size:
            raise ValueError(f"RAM of {self.ram.size} bytes in pages of {self.ram.page_size}")


def parse_ref(ref: str) -> tuple[str | None, str]:
    """``sha256:<hex>`` or 64 hex digits → (digest, ""); anything else is a name → (None,
    name)."""
    text = ref.removeprefix("sha256:")
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text, ""
    return None, ref
