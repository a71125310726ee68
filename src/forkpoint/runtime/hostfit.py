"""Whether a machine shape fits this host at all (not whether there is room right now)."""

from __future__ import annotations

import os
from pathlib import Path

from forkpoint.errors import Conflict

__all__ = ["check_host_fits", "host_memory_mib", "meminfo_mib"]

MEMINFO = Path("/proc/meminfo")


def meminfo_mib(meminfo: Path = MEMINFO) -> dict[str, int]:
    """``/proc/meminfo``'s sizes in MiB, by name (``MemTotal``, ``MemAvailable``, …)."""
    fields = {}
    for line in meminfo.read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) // 1024 if rest.split() else 0
    return fields


def host_memory_mib(meminfo: Path = MEMINFO) -> int:
    """RAM plus swap, in MiB: the most one VM's guest RAM can ever be backed by."""
    fields = meminfo_mib(meminfo)
    return fields.get("MemTotal", 0) + fields.get("SwapTotal", 0)


def check_host_fits(memory_mib: int, cpus: int) -> None:
    """:raises Conflict: a guest with ``memory_mib`` and ``cpus`` can never run here (QEMU
    cannot map more RAM than the host has; more vCPUs than host CPUs only thrash)."""
    available = host_memory_mib()
    if memory_mib > available:
        raise Conflict(
            f"memory_mib {memory_mib} is more than this host has ({available} MiB of RAM and swap)"
        )
    host_cpus = len(os.sched_getaffinity(0))
    if cpus > host_cpus:
        raise Conflict(f"cpus {cpus} is more than this host has ({host_cpus} CPUs)")
