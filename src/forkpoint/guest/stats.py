"""The guest's memory and root filesystem use, for a session's metrics (``stats``)."""

from __future__ import annotations

import os

from ..protocol import Empty, GuestStats
from .context import Context

__all__ = ["guest_stats"]

_KIB = 1024


def guest_stats(ctx: Context, args: Empty) -> GuestStats:
    """``/proc/meminfo`` (total, available, page cache) and ``statvfs("/")``."""
    fields: dict[str, int] = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, rest = line.partition(":")
            value = rest.split()
            if value and value[0].isdigit():
                fields[name] = int(value[0]) * _KIB
    root = os.statvfs("/")
    return GuestStats(
        mem_total=fields.get("MemTotal", 0),
        mem_available=fields.get("MemAvailable", fields.get("MemFree", 0)),
        mem_cached=fields.get("Cached", 0),
        disk_total=root.f_blocks * root.f_frsize,
        disk_used=(root.f_blocks - root.f_bfree) * root.f_frsize,
    )
