"""qcow2 disk layers through ``qemu-img``.

A session writes to its own top layer; a checkpoint freezes that layer and the session
continues on a new one stacked on it. Layers are files named by id in one directory, so
backing references stay valid whatever session or checkpoint uses them.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import uuid
from pathlib import Path

from forkpoint.errors import QemuError
from forkpoint.vm.build import qemu_img

__all__ = [
    "backing_name",
    "blank_overlay_of",
    "create_overlay",
    "overlay_from_blank",
    "overlay_on_top",
    "rebase_unsafe",
]

# The start of a qcow2 header: magic, version, backing file name offset and length,
# cluster bits, virtual size (all big-endian).
_HEADER = struct.Struct(">4sIQIIQ")
_MAGIC = b"QFI\xfb"


def create_overlay(backing: Path, dest: Path) -> None:
    """Create an empty qcow2 ``dest`` on top of ``backing`` (qcow2), absolute paths."""
    proc = subprocess.run(
        [
            str(qemu_img()),
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            str(backing.resolve()),
            "-F",
            "qcow2",
            str(dest),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise QemuError(f"qemu-img create {dest.name} failed: {proc.stderr.strip()}")


def blank_overlay_of(backing: Path) -> Path:
    """Where :func:`overlay_from_blank` keeps the blank overlay of ``backing``."""
    return backing.with_name(backing.name + ".blank")


def overlay_from_blank(backing: Path, dest: Path) -> None:
    """:func:`create_overlay`, by copying a blank overlay of ``backing`` made once.

    Every restore needs a new empty layer on the checkpoint's frozen one; ``qemu-img``
    costs ~25 ms of CPU each time, a copy of its ~200 KiB result well under one. Nothing
    in an empty overlay depends on its own name, so the copies are what ``qemu-img``
    would have written. The blank sits next to ``backing``: delete them together.
    """
    shutil.copyfile(ensure_blank(backing), dest)


def ensure_blank(backing: Path) -> Path:
    """The blank overlay of ``backing`` (see :func:`overlay_from_blank`), made if missing."""
    blank = blank_overlay_of(backing)
    if not blank.exists():
        tmp = blank.with_name(f".{blank.name}.{uuid.uuid4().hex[:8]}.tmp")
        create_overlay(backing, tmp)
        os.replace(tmp, blank)  # racing restores each publish an identical file
    return blank


def overlay_on_top(top: Path, dest: Path) -> None:
    """An empty qcow2 ``dest`` on ``top`` (a VM's top layer, about to be frozen), without
    running ``qemu-img`` on the checkpoint path.

    ``top`` was itself made by :func:`overlay_from_blank` from its backing layer's blank,
    an empty overlay of the same size whose only difference to the one wanted is the
    backing file's name; layer names all have one length, so that name is rewritten in
    place in a copy. Anything else (another size, another name length, no blank) goes
    through :func:`create_overlay`.
    """
    name, size, _ = _backing_of(top)
    if name is not None:
        blank = blank_overlay_of(Path(name))
        wanted = str(top).encode()
        try:
            blank_name, blank_size, offset = _backing_of(blank)
        except OSError:
            blank_name, blank_size, offset = None, -1, 0
        if blank_name == name and blank_size == size and len(wanted) == len(name.encode()):
            tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
            shutil.copyfile(blank, tmp)
            with tmp.open("r+b") as f:
                f.seek(offset)
                f.write(wanted)
            os.replace(tmp, dest)
            return
    create_overlay(top, dest)


def _backing_of(path: Path) -> tuple[str | None, int, int]:
    """A qcow2 file's backing file name (None: none), virtual size, and where the name
    is stored.

    :raises OSError: unreadable; :raises QemuError: not a qcow2 file.
    """
    with path.open("rb") as f:
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size or header[:4] != _MAGIC:
            raise QemuError(f"{path.name} is not a qcow2 file")
        _, _, offset, length, _, size = _HEADER.unpack(header)
        if not offset:
            return None, size, 0
        f.seek(offset)
        return f.read(length).decode(), size, offset


def backing_name(path: Path) -> str | None:
    """The backing file name written in a qcow2 file's header (None: it has none).

    :raises OSError: unreadable; :raises QemuError: not a qcow2 file.
    """
    return _backing_of(path)[0]


def rebase_unsafe(path: Path, backing: str) -> None:
    """Rewrite only the backing file *name* in ``path``'s header (``qemu-img rebase -u``):
    the data stays as it is, so ``backing`` must name the same content. Portable layers
    travel with relative names and get this home's path back on import."""
    proc = subprocess.run(
        [
            str(qemu_img()),
            "rebase",
            "-u",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            "-b",
            backing,
            str(path),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise QemuError(f"qemu-img rebase {path.name} failed: {proc.stderr.strip()}")
