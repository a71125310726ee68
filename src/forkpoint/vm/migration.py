"""Handing QEMU a file to stream a VM's state to or from, the way its version wants.

forkpoint opens the file itself and passes the descriptor over QMP: the seccomp sandbox
forbids QEMU to spawn (``exec:``), and the caller's open fails with its own error.

- QEMU ≥ 8.2: ``add-fd`` puts the descriptor in an fd set and the URI is
  ``file:/dev/fdset/N``. QEMU 9.1 deprecated ``fd:`` on anything but a socket (it warns
  on every use; QEMU 11 is to refuse it).
- Older QEMU (Debian 12 ships 7.2) knows no ``file:``: ``getfd`` + ``fd:NAME``.

A file in an fd set is matched by its access mode, so the descriptor is opened read-only
to load and write-only to save, exactly as QEMU asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from forkpoint.errors import QemuError
from forkpoint.vm.build import QemuBuild
from forkpoint.vm.qmp import Qmp

__all__ = ["incoming_arguments", "state_file_uri", "uses_file_uri"]

FILE_URI_SINCE = (8, 2)
#: ``migrate-incoming`` exits QEMU on a failed load by default since 9.1; forkpoint wants
#: the error text from ``query-migrate`` instead (and kills the VM itself).
EXIT_ON_ERROR_SINCE = (9, 1)


def uses_file_uri(build: QemuBuild) -> bool:
    return build.major_minor >= FILE_URI_SINCE


def incoming_arguments(build: QemuBuild, uri: str) -> dict[str, Any]:
    """Arguments of ``migrate-incoming`` for ``uri`` on this build."""
    arguments: dict[str, Any] = {"uri": uri}
    if build.major_minor >= EXIT_ON_ERROR_SINCE:
        arguments["exit-on-error"] = False
    return arguments


@contextlib.asynccontextmanager
async def state_file_uri(
    qmp: Qmp, build: QemuBuild, path: Path, *, write: bool, fd_name: str
) -> AsyncIterator[str]:
    """Open ``path`` (``write``: create it, mode 0444), hand it to QEMU and yield the
    migration URI naming it. Run the migration command inside the block: QEMU takes its
    own copy of the descriptor then; the fd set is removed on leaving.

    :raises OSError: ``path`` cannot be opened.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY
    fd = await asyncio.to_thread(os.open, path, flags, 0o444)
    fdset: int | None = None
    try:
        qmp.send_fd(fd)
        if uses_file_uri(build):
            # QEMU picks a free fd set: a set left from an earlier save never matches.
            added = await qmp.run("add-fd")
            fdset = int(added["fdset-id"])
            uri = f"file:/dev/fdset/{fdset}"
        else:
            await qmp.run("getfd", fdname=fd_name)
            uri = f"fd:{fd_name}"
    finally:
        os.close(fd)
    try:
        yield uri
    finally:
        if fdset is not None:  # QEMU keeps its copy open until the migration is done
            with contextlib.suppress(QemuError):
                await qmp.run("remove-fd", **{"fdset-id": fdset})
