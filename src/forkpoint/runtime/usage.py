"""How much host disk a session or a checkpoint uses: bytes actually allocated.

Every disk layer belongs to exactly one owner — a session's top layer to the session, a
frozen layer to the checkpoint that froze it — so the numbers add up without counting a
shared layer twice. Sparse files (RAM files, qcow2) count what is allocated, not their
apparent size.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from pathlib import Path

from forkpoint.config import Home
from forkpoint.store import CheckpointRecord, SessionRecord

__all__ = [
    "allocated_bytes",
    "checkpoint_disk_bytes",
    "checkpoint_shared_bytes",
    "session_disk_bytes",
    "shared_bytes",
]

_FS_IOC_FIEMAP = 0xC020660B  # ioctl: a file's extents, flagged
_FIEMAP_HEAD = struct.Struct("=QQIIII")  # start, length, flags, mapped, count, reserved
_FIEMAP_EXTENT = struct.Struct("=QQQ16xI12x")  # logical, physical, length, flags
_EXTENTS = 512  # per call
_ALL = (1 << 64) - 1
_EXTENT_LAST, _EXTENT_SHARED = 0x1, 0x2000


def allocated_bytes(path: Path) -> int:
    """Bytes allocated to a file, or to every file under a directory; 0 if it is gone.
    (``scandir``: ``ls`` pays for this on every session, keep it to one call a file.)"""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    total = _within_size(info)
    if stat.S_ISDIR(info.st_mode):
        total += _tree_bytes(path)
    return total


def _within_size(info: os.stat_result) -> int:
    """A file's allocated bytes up to its end: XFS preallocates beyond the end of a file
    being appended to (a qcow2 layer QEMU writes; up to gigabytes, given back when it is
    closed), which ``st_blocks`` counts: a 2 GiB disk then showed 3 GiB on the host."""
    blocks = info.st_blocks * 512
    return blocks if stat.S_ISDIR(info.st_mode) else min(blocks, info.st_size)


def _tree_bytes(directory: Path | str) -> int:
    total = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0  # removed while we looked
    for entry in entries:
        try:
            total += _within_size(entry.stat(follow_symlinks=False))
            if entry.is_dir(follow_symlinks=False):
                total += _tree_bytes(entry.path)
        except OSError:
            continue
    return total


def session_disk_bytes(home: Home, session_dir: Path, record: SessionRecord) -> int:
    """The session's top disk layer and its own directory (logs, boot RAM file), less
    what the copy of its checkpoint's RAM made ahead there shares with that checkpoint
    (all of it, until the copy is written to)."""
    shared = sum(shared_bytes(copy) for copy in session_dir.glob("ram-copy-*"))
    return allocated_bytes(home.layers / record.disk_layer) + allocated_bytes(session_dir) - shared


def checkpoint_shared_bytes(home: Home, record: CheckpointRecord) -> int:
    """Of its RAM file, the bytes other files hold too (reflinks; see ``shared_bytes``)."""
    return shared_bytes(home.checkpoints / record.id / "ram")


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


def shared_bytes(path: Path) -> int:
    """Bytes of ``path`` whose blocks other files hold too (reflinks: a checkpoint's RAM
    file shares what did not change with the checkpoint before and after it). 0 where the
    file system cannot tell (FIEMAP) or has no reflinks."""
    shared = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        start = 0
        while True:
            request = _FIEMAP_HEAD.pack(start, _ALL, 0, 0, _EXTENTS, 0)
            buffer = bytearray(request + bytes(_FIEMAP_EXTENT.size * _EXTENTS))
            try:
                fcntl.ioctl(fd, _FS_IOC_FIEMAP, buffer)
            except OSError:
                return 0
            mapped = _FIEMAP_HEAD.unpack_from(buffer)[3]
            last = False
            for i in range(mapped):
                logical, _, length, flags = _FIEMAP_EXTENT.unpack_from(
                    buffer, _FIEMAP_HEAD.size + i * _FIEMAP_EXTENT.size
                )
                if flags & _EXTENT_SHARED:
                    shared += length
                start = logical + length
                last = bool(flags & _EXTENT_LAST)
            if mapped == 0 or last:
                return shared
    finally:
        os.close(fd)
