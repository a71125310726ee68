"""Facts about the host that the guest needs."""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["host_tsc_khz"]


@functools.cache
def host_tsc_khz() -> int | None:
    """The host TSC frequency in kHz (TCG guests run their TSC at this rate)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return int(float(line.split(":", 1)[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None
