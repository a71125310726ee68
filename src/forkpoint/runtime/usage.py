"""How much host disk a session or a checkpoint uses: bytes actually allocated.

Every disk layer belongs to exactly one owner — a session's top layer to the session, a
frozen layer to the checkpoint that froze it — so the numbers add up without counting a
shared layer twice. Sparse files (RAM files, qcow2) count what is allocated, not their
apparent size.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from forkpoint.config import Home
from forkpoint.store import CheckpointRecord, SessionRecord

__all__ = ["allocated_bytes", "checkpoint_disk_bytes", "session_disk_bytes"]


def allocated_bytes(path: Path) -> int:
    """Bytes allocated to a file, or to every file under a directory; 0 if it is gone.
    (``scandir``: ``ls`` pays for this on every session, keep it to one call a file.)"""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    total = info.st_blocks * 512
    if stat.S_ISDIR(info.st_mode):
        total += _tree_bytes(path)
    return total


def _tree_bytes(directory: Path | str) -> int:
    total = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0  # removed while we looked
    for entry in entries:
        try:
            total += entry.stat(follow_symlinks=False).st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                total += _tree_bytes(entry.path)
        except OSError:
            continue
    return total


def session_disk_bytes(home: Home, session_dir: Path, record: SessionRecord) -> int:
    """The session's top disk layer and its own directory (logs, boot RAM file)."""
    return allocated_bytes(home.layers / record.disk_layer) + allocated_bytes(session_dir)


def checkpoint_disk_bytes(home: Home, record: CheckpointRecord) -> int:
    """The checkpoint's files (RAM, device state, manifest) and the layer it froze, with
    that layer's cached blank overlay (named as ``vm.disk.blank_overlay_of`` does; not
    imported: ``ls`` must not load the disk tools)."""
    layer = home.layers / record.disk_layer
    return (
        allocated_bytes(home.checkpoints / record.id)
        + allocated_bytes(layer)
        + allocated_bytes(layer.with_name(layer.name + ".blank"))
    )
