"""Files QEMU reaches through descriptors forkpoint opened, never by path.

A jailed QEMU (see :mod:`.jail`) sits in an empty chroot as an unprivileged uid, so every
file it must open after start-up is handed over as a descriptor in an *fd set* and named
``/dev/fdset/N``, which QEMU's own ``open`` resolves to a copy of a matching descriptor:
the disk layer it writes to (QEMU reopens it read-write when a restored VM starts to
run), a checkpoint's new layer and its device state. A set entry matches by access mode,
so a file QEMU may open both ways gets a read-only and a read-write descriptor.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from forkpoint.vm.qmp import Qmp

__all__ = ["FDSET_PREFIX", "add_to_fdset", "disk_fds"]

FDSET_PREFIX = "/dev/fdset/"


@contextlib.contextmanager
def disk_fds(path: Path) -> Iterator[tuple[int, int]]:
    """``path`` opened read-write and read-only, closed on leaving (QEMU keeps copies)."""
    rw = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        ro = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            yield rw, ro
        finally:
            os.close(ro)
    finally:
        os.close(rw)


async def add_to_fdset(qmp: Qmp, fds: tuple[int, ...], opaque: str) -> str:
    """Hand ``fds`` to QEMU as one new fd set labelled ``opaque`` (the real path, which
    :func:`query-fdsets` reports back); returns the set's ``/dev/fdset/N`` name."""
    fdset: int | None = None
    for fd in fds:
        qmp.send_fd(fd)
        arguments: dict[str, object] = {"opaque": opaque}
        if fdset is not None:
            arguments["fdset-id"] = fdset
        added = await qmp.run("add-fd", **arguments)
        fdset = int(added["fdset-id"])
    return f"{FDSET_PREFIX}{fdset}"
