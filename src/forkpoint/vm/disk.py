"""qcow2 disk layers through ``qemu-img``.

A session writes to its own top layer; a checkpoint freezes that layer and the session
continues on a new one stacked on it. Layers are files named by id in one directory, so
backing references stay valid whatever session or checkpoint uses them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from forkpoint.errors import QemuError
from forkpoint.vm.build import qemu_img

__all__ = ["create_overlay"]


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
