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

from forkpoint.config import Home, HostLimits
from forkpoint.errors import InvalidInput, LimitExceeded

__all__ = [
    "CHECKPOINT_OVERHEAD_BYTES",
    "SESSION_BYTES",
    "checkpoint_bytes",
    "host_limits",
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


def require_space(home: Home, need_bytes: int, what: str) -> None:
    """Refuse ``what`` if writing ``need_bytes`` would leave less than the reserve free.

    :raises LimitExceeded: one line naming the free space, the need and the reserve.
    """
    fs = os.statvfs(home.root)
    free = fs.f_bavail * fs.f_frsize
    reserve = host_limits().reserve_bytes(fs.f_blocks * fs.f_frsize)
    if free - need_bytes < reserve:
        raise LimitExceeded(
            f"not enough disk space for {what}: {_size(free)} free on {home.root}'s "
            f"filesystem, it needs up to {_size(need_bytes)} and {_size(reserve)} must stay "
            "free (FORKPOINT_DISK_RESERVE)"
        )


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
