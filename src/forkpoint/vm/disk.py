"""qcow2 disk layers through ``qemu-img``.

A session writes to its own top layer; a checkpoint freezes that layer and the session
continues on a new one stacked on it. Layers are files named by id in one directory, so
backing references stay valid whatever session or checkpoint uses them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

from forkpoint.errors import QemuError
from forkpoint.vm.build import qemu_img

__all__ = ["blank_overlay_of", "create_overlay", "overlay_from_blank"]


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
    blank = blank_overlay_of(backing)
    if not blank.exists():
        tmp = blank.with_name(f".{blank.name}.{uuid.uuid4().hex[:8]}.tmp")
        create_overlay(backing, tmp)
        os.replace(tmp, blank)  # racing restores each publish an identical file
    shutil.copyfile(blank, dest)
