"""Checkpoint manifests: written once, atomically, and checked before every restore.

QEMU does not verify that a device-state file matches its own build, the RAM file or the
machine shape; loading a mismatched one corrupts the guest silently. The manifest does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from forkpoint.errors import IncompatibleCheckpoint, NotFound
from forkpoint.vm import MachineShape

__all__ = ["MANIFEST", "RAM", "STATE", "check_compatible", "read_manifest", "write_manifest"]

MANIFEST = "manifest.json"
RAM = "ram"
STATE = "state"
FORMAT = 1


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` into ``directory`` and fsync it."""
    data = json.dumps({"format": FORMAT, **manifest}, indent=2, sort_keys=True).encode()
    path = directory / MANIFEST
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(directory: Path) -> dict[str, Any]:
    try:
        value = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        raise NotFound(f"checkpoint files missing or unreadable: {directory}") from None
    if not isinstance(value, dict):
        raise NotFound(f"checkpoint manifest is not an object: {directory}")
    return value


def check_compatible(checkpoint_id: str, manifest: dict[str, Any], here: MachineShape) -> None:
    """Refuse a checkpoint made by another QEMU build, accel or machine shape.

    :raises IncompatibleCheckpoint: naming what differs.
    """
    theirs = manifest.get("machine", {})
    mine = here.to_dict()
    if manifest.get("format") != FORMAT:
        raise IncompatibleCheckpoint(
            f"checkpoint {checkpoint_id} has manifest format {manifest.get('format')!r}; "
            f"this forkpoint reads format {FORMAT}"
        )
    for key in ("qemu", "accel", "memory_mib", "cpus", "argv_layout"):
        if theirs.get(key) != mine[key]:
            raise IncompatibleCheckpoint(
                f"checkpoint {checkpoint_id} was made with {key}={theirs.get(key)!r}, "
                f"this host has {key}={mine[key]!r}; it can only be restored on the same "
                "QEMU build, accelerator and machine shape"
            )
