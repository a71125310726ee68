"""The image cache on disk: finished images, the name → hash map, and lookups.

Layout under ``$FORKPOINT_HOME/images/``::

    <hash>/image.json       manifest (name, hash, recipe, kernel_version, files, ...)
    <hash>/vmlinuz          kernel
    <hash>/initrd.img       initramfs (gzip'd newc cpio)
    <hash>/rootfs.qcow2     root disk (never written to: sessions use overlays)
    names/<name>            one line: the hash <name> last built to
    .tmp-<hash>-<pid>/      a build in progress (or killed): never read

A directory counts as an image only once it has been renamed into place with its
``image.json``; half-built directories are invisible here.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from forkpoint.config import home
from forkpoint.errors import NotFound
from forkpoint.images.recipe import DEFAULT_PACKAGES, Recipe

__all__ = [
    "INITRD_FILE",
    "KERNEL_FILE",
    "MANIFEST_FILE",
    "ROOTFS_FILE",
    "Image",
    "current_hashes",
    "get_image",
    "images_named",
    "list_images",
    "load_image",
    "remove_images",
    "set_name",
]

MANIFEST_FILE = "image.json"
KERNEL_FILE = "vmlinuz"
INITRD_FILE = "initrd.img"
ROOTFS_FILE = "rootfs.qcow2"
_NAMES_DIR = "names"


@dataclass(frozen=True)
class Image:
    """A finished, immutable guest image. Sizes in bytes; ``created_at`` is UTC."""

    name: str
    hash: str
    dir: Path
    kernel: Path
    initrd: Path
    rootfs: Path
    kernel_version: str
    recipe: Recipe
    size_bytes: int
    created_at: datetime
    #: Where the root filesystem came from: ``{"kind", "ref"}`` (+ ``"digest"`` for OCI
    #: images); ``kind`` is ``debian`` for mmdebstrap's.
    source: dict[str, str] = field(default_factory=dict)
    #: An OCI image's defaults of commands (``env``, ``cwd``, ``user``) and ``start``.
    config: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the ``--json`` contract of ``image build``/``image ls``)."""
        return {
            "name": self.name,
            "hash": self.hash,
            "dir": str(self.dir),
            "kernel": str(self.kernel),
            "initrd": str(self.initrd),
            "rootfs": str(self.rootfs),
            "kernel_version": self.kernel_version,
            "suite": self.recipe.suite,
            "packages": list(self.recipe.packages),
            "size_bytes": self.size_bytes,
            "created_at": self.created_at.isoformat(),
            "recipe": self.recipe.to_dict(),
            "source": self.source,
            "config": self.config,
        }


def load_image(directory: Path) -> Image | None:
    """The image in ``directory``, or None if it is not a complete image."""
    if directory.name.startswith("."):
        return None
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text())
        recipe = Recipe.from_dict(manifest["recipe"])
        image = Image(
            name=str(manifest["name"]),
            hash=str(manifest["hash"]),
            dir=directory,
            kernel=directory / KERNEL_FILE,
            initrd=directory / INITRD_FILE,
            rootfs=directory / ROOTFS_FILE,
            kernel_version=str(manifest["kernel_version"]),
            recipe=recipe,
            size_bytes=sum(int(v) for v in manifest["files"].values()),
            created_at=datetime.fromisoformat(manifest["created_at"]),
            source=_source(manifest, recipe),
            config=manifest.get("config"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if image.hash != directory.name:
        return None
    if not all(p.is_file() for p in (image.kernel, image.initrd, image.rootfs)):
        return None
    return image


def _source(manifest: dict[str, Any], recipe: Recipe) -> dict[str, str]:
    source = manifest.get("source")
    if isinstance(source, dict):
        return {str(k): str(v) for k, v in source.items()}
    extra = [p for p in recipe.packages if p not in DEFAULT_PACKAGES]
    return {"kind": "debian", "ref": " ".join([recipe.suite, *(f"+{p}" for p in extra)])}


def _images_dir(images: Path | None) -> Path:
    return images if images is not None else home().images


def _named_hash(images: Path, name: str) -> str | None:
    try:
        value = (images / _NAMES_DIR / name).read_text().strip()
    except (OSError, ValueError):
        return None
    return value or None


def current_hashes(images: Path | None = None) -> dict[str, str]:
    """Name → hash of its latest build (older builds of a name stay until deleted)."""
    names = _images_dir(images) / _NAMES_DIR
    if not names.is_dir():
        return {}
    found: dict[str, str] = {}
    for entry in names.iterdir():
        if not entry.name.startswith("."):
            value = _named_hash(names.parent, entry.name)
            if value is not None:
                found[entry.name] = value
    return found


def set_name(images: Path, name: str, image_hash: str) -> None:
    """Point ``name`` at ``image_hash`` (write to a temp file, then rename: atomic)."""
    names = images / _NAMES_DIR
    names.mkdir(parents=True, exist_ok=True)
    tmp = names / f".{name}.{os.getpid()}"
    tmp.write_text(image_hash + "\n")
    os.replace(tmp, names / name)


def list_images(images: Path | None = None) -> list[Image]:
    """Every complete image in the cache, oldest first.

    ``images`` defaults to ``$FORKPOINT_HOME/images``. In-progress and killed builds
    (``.tmp-*``) are never listed.
    """
    root = _images_dir(images)
    if not root.is_dir():
        return []
    found = [load_image(entry) for entry in root.iterdir() if entry.is_dir()]
    return sorted((i for i in found if i is not None), key=lambda i: (i.created_at, i.name))


def get_image(name_or_hash: str = "default", images: Path | None = None) -> Image:
    """The image called ``name_or_hash`` (its latest build), or with that hash (prefix).

    Raises :class:`NotFound` (with a hint to build it) if there is none.
    """
    root = _images_dir(images)
    named = _named_hash(root, name_or_hash)
    if named is not None:
        image = load_image(root / named)
        if image is not None:
            return image
    if name_or_hash and not name_or_hash.startswith("."):
        exact = load_image(root / name_or_hash) if root.is_dir() else None
        if exact is not None:
            return exact
        prefixed = [i for i in list_images(root) if i.hash.startswith(name_or_hash)]
        if len(name_or_hash) >= 4 and len(prefixed) == 1:
            return prefixed[0]
    hint = "forkpoint image build" + ("" if name_or_hash == "default" else f" {name_or_hash}")
    raise NotFound(f"no image {name_or_hash!r}: run `{hint}` first")


def images_named(name: str, images: Path | None = None) -> list[Image]:
    """Every build of ``name`` (not only its latest). :raises NotFound: there is none."""
    root = _images_dir(images)
    found = [i for i in list_images(root) if i.name == name]
    if not found:
        raise NotFound(f"no image {name!r} (see `forkpoint image ls`)")
    return found


def remove_images(name: str, builds: list[Image], images: Path | None = None) -> None:
    """Delete ``builds`` (each renamed aside first, so a half-deleted image is never
    listed) and ``name`` once it points at none of what is left."""
    root = _images_dir(images)
    for image in builds:
        aside = root / f".rm-{image.hash}-{os.getpid()}"
        try:
            os.rename(image.dir, aside)
        except FileNotFoundError:
            continue
        shutil.rmtree(aside, ignore_errors=True)
    current = _named_hash(root, name)
    if current is None or load_image(root / current) is None:
        (root / _NAMES_DIR / name).unlink(missing_ok=True)
