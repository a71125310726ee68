"""Size caps of the logs a VM leaves on the host, and trimming a log in place.

Here, not in :mod:`.console`, so the queries every CLI call makes (``ls``) can trim logs
without loading QMP and asyncio.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOG_CAP_BYTES", "PASST_LOG_BYTES", "trim_log"]

LOG_CAP_BYTES = 1 << 20  # serial.log and qemu.log each, on the host's disk
PASST_LOG_BYTES = 1 << 20  # passt's --log-size (its default, made explicit)


def trim_log(path: Path, cap: int = LOG_CAP_BYTES) -> bool:
    """Keep ``path`` under ``cap``: past it, only its newest half stays (a marker line says
    so). Safe while a process appends with ``O_APPEND``: its next write lands after what is
    kept. Returns whether it trimmed."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size <= cap:
            return False
        keep = os.pread(fd, cap // 2, size - cap // 2)
        os.ftruncate(fd, 0)
        newline = keep.find(b"\n")  # start at a whole line where there is one
        if 0 <= newline < len(keep) - 1:
            keep = keep[newline + 1 :]
        dropped = size - len(keep)
        os.write(fd, f"[forkpoint: {dropped} older bytes dropped]\n".encode() + keep)
        return True
    finally:
        os.close(fd)
