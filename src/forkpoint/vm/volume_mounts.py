"""Starting a VM's volume server (``forkpoint/volume_server.py``) and waiting until the
guest has its mounts.

The server is one process per QEMU: it connects to the VM's ``volumes`` port, tells the
guest what to mount where, and ends when the VM does. Its command line names the VM
(``--vm``), so killing a VM's processes kills it too (``kill_vm_processes``).
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from forkpoint.errors import InternalError
from forkpoint.vm.files import VmFiles
from forkpoint.vm.process import is_running, spawn_detached

__all__ = ["start_volume_server"]

#: A guest that has not answered its mounts by then is reported (a loaded TCG host).
READY_TIMEOUT_S = 60.0


def start_volume_server(
    files: VmFiles, volumes_dir: Path, mounts: Sequence[tuple[str, str]]
) -> int:
    """Start the server of ``mounts`` (``(volume id, guest path)`` pairs) for ``files``'
    running VM and wait until the guest has mounted them (blocking); returns its pid.

    :raises InternalError: the server ended or the guest refused a mount (its reason).
    """
    read_end, write_end = os.pipe()
    argv = [
        sys.executable, "-m", "forkpoint.volume_server", "--vm", files.name,
        "--socket", str(files.volumes_socket), "--volumes", str(volumes_dir),
        "--ready-fd", str(write_end),
        *(arg for vol, at in mounts for arg in ("--mount", f"{vol}:{at}")),
    ]  # fmt: skip
    try:
        pid = spawn_detached(argv, files.qemu_log, (write_end,))
    finally:
        os.close(write_end)
    try:
        answer = _read_answer(read_end, pid, files.name)
    finally:
        os.close(read_end)
    failed = {at: outcome for at, outcome in answer.items() if outcome.startswith("error")}
    if failed:
        raise InternalError(f"the guest could not mount its volumes: {failed}")
    return pid


def _read_answer(fd: int, pid: int, name: str) -> dict[str, str]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise InternalError(f"the guest did not mount its volumes in {READY_TIMEOUT_S:.0f} s")
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            if not is_running(pid, name):
                raise InternalError("the volume server ended before the guest mounted")
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise InternalError("the volume server ended before the guest mounted")
        data += chunk
    answer: dict[str, str] = json.loads(data)
    return answer
