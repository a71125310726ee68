"""What a checkpoint cost: a plain value, kept apart from the machine (which loads QMP and
asyncio) so that reading a checkpoint's manifest loads neither."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CheckpointStats"]


@dataclass(frozen=True)
class CheckpointStats:
    """Where a checkpoint's time went (milliseconds) and what it stored (bytes).

    ``base_copy_ms`` runs before the pause; ``pause_ms`` covers the disk snapshot,
    ``device_state_ms`` and ``written_ms`` (copying the ``written_bytes`` the guest
    changed since its RAM file was mapped).
    """

    pause_ms: float
    base_copy_ms: float
    device_state_ms: float
    written_ms: float
    written_bytes: int
    ram_bytes: int
    state_bytes: int
    #: ``(offset, length)`` of the runs of pages written (not in manifests): what the RAM
    #: file's integrity sum must be updated for.
    written_ranges: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)
    #: The VM's RAM was remapped onto the new checkpoint's file (see ``vm.rebase``): its
    #: next checkpoint copies only what the guest writes from now on.
    rebased: bool = False
    #: The file the RAM mapped before (not in manifests): the new file's sum is
    #: that file's, updated for the pages written.
    ram_base: Path | None = field(default=None, compare=False, repr=False)
    #: A descriptor of it to close once the sum is made (it was deleted: the path above is
    #: this descriptor's ``/proc/self/fd/N``).
    ram_base_fd: int | None = field(default=None, compare=False, repr=False)
