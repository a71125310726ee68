"""The host limits create, fork and checkpoint check before they make anything.

Free space: an operation that would leave ``$FORKPOINT_HOME``'s filesystem with less than
the reserve (``FORKPOINT_DISK_RESERVE``) free is refused with :class:`LimitExceeded` before
a file is written, so nothing half-made is left. What an operation needs is estimated
from above: a checkpoint can write as much RAM as the guest has, a new session writes
little at first (its top layer's first clusters, capped logs). The count of running
sessions (``FORKPOINT_MAX_SESSIONS``) is checked by the store, in the transaction that
inserts the session (:meth:`~forkpoint.store.Store.insert_session`).
"""

from __future__ import annotations

import os
from pathlib import Path

from forkpoint.config import Home, HostLimits
from forkpoint.errors import InvalidInput, LimitExceeded
from forkpoint.models import HostStatus, SessionState
from forkpoint.storage import filesystems_of
from forkpoint.store import Store
from forkpoint.store.standby import StandbyStore
from forkpoint.store.warm import WarmStore

from .hostfit import MEMINFO, meminfo_mib

__all__ = [
    "CHECKPOINT_OVERHEAD_BYTES",
    "SESSION_BYTES",
    "checkpoint_bytes",
    "host_limits",
    "host_status",
    "require_space",
]

# A new session at first: its top layer's first clusters and the guest's first writes,
# its capped logs, sockets.
SESSION_BYTES = 64 << 20
# A checkpoint beyond its RAM file: device state, manifest, the VM's new top layer.
CHECKPOINT_OVERHEAD_BYTES = 16 << 20


def host_limits() -> HostLimits:
    """The limits set in the environment. :raises InvalidInput: a malformed variable."""
    try:
        return HostLimits.from_env()
    except ValueError as error:
        raise InvalidInput(str(error)) from None


def checkpoint_bytes(memory_mib: int) -> int:
    """At most what a checkpoint of a guest with ``memory_mib`` of RAM writes."""
    return (memory_mib << 20) + CHECKPOINT_OVERHEAD_BYTES


def host_status(home: Home, store: Store, meminfo: Path = MEMINFO) -> HostStatus:
    """The host's room now, against the limits (one store read of the sessions)."""
    limits = host_limits()
    running = [s for s in store.list_sessions() if s.state == SessionState.RUNNING]
    fs = os.statvfs(home.root)
    memory = meminfo_mib(meminfo)
    return HostStatus(
        sessions_running=len(running), sessions_max=limits.max_sessions,
        cpus=len(os.sched_getaffinity(0)), load_1m=round(os.getloadavg()[0], 2),
        memory_total_mib=memory.get("MemTotal", 0),
        memory_available_mib=memory.get("MemAvailable", 0),
        memory_sessions_mib=sum(s.memory_mib for s in running),
        disk_free_bytes=fs.f_bavail * fs.f_frsize,
        disk_reserve_bytes=limits.reserve_bytes(fs.f_blocks * fs.f_frsize),
        warm_vms=len(WarmStore(store).all()), standbys=len(StandbyStore(store).all()),
    )  # fmt: skip


def require_space(home: Home, need_bytes: int, what: str) -> None:
    """Refuse ``what`` if writing ``need_bytes`` would leave less than the reserve free.

    :raises LimitExceeded: one line naming the free space, the need and the reserve.
    """
    for where in filesystems_of(home.root):
        fs = os.statvfs(where)
        free = fs.f_bavail * fs.f_frsize
        reserve = host_limits().reserve_bytes(fs.f_blocks * fs.f_frsize)
        if free - need_bytes < reserve:
            raise LimitExceeded(
                f"not enough disk space for {what}: {_size(free)} free on {where}'s "
                f"filesystem, it needs up to {_size(need_bytes)} and {_size(reserve)} must "
                "stay free (FORKPOINT_DISK_RESERVE)"
            )


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
