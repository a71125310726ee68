"""Starting a VM's volume server (``forkpoint/volume_server.py``) and waiting until the
guest has its mounts.

The server is one process per QEMU: it connects to the VM's ``volumes`` port, tells the
guest what to mount where, and ends when the VM does. Its command line names the VM
(``--vm``), so killing a VM's processes kills it too (``kill_vm_processes``). It is
spawned while the VM's state loads (its Python start-up, ≈ 0.2 s here, overlaps the
restore) and told to connect once the VM runs: a host that connects to the port of a VM
still loading its device state could be lost in that state.
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
from forkpoint.vm.process import is_running, kill_and_wait, spawn_detached

__all__ = ["VolumeServer"]

#: A guest that has not answered its mounts by then is reported (a loaded TCG host).
READY_TIMEOUT_S = 60.0


class VolumeServer:
    """A volume server spawned for a VM, waiting to be told the VM runs."""

    def __init__(self, pid: int, go: int, answer: int, vm: str) -> None:
        self.pid = pid
        self._go = go
        self._answer = answer
        self._vm = vm

    @classmethod
    def spawn(
        cls, files: VmFiles, volumes_dir: Path, mounts: Sequence[tuple[str, str]]
    ) -> VolumeServer:
        """Start the server of ``mounts`` (``(volume id, guest path)`` pairs) for
        ``files``' VM; it waits for :meth:`serve` (blocking)."""
        go_read, go_write = os.pipe()
        answer_read, answer_write = os.pipe()
        argv = [
            sys.executable, "-m", "forkpoint.volume_server", "--vm", files.name,
            "--socket", str(files.volumes_socket), "--volumes", str(volumes_dir),
            "--go-fd", str(go_read), "--ready-fd", str(answer_write),
            *(arg for vol, at in mounts for arg in ("--mount", f"{vol}:{at}")),
        ]  # fmt: skip
        try:
            pid = spawn_detached(argv, files.qemu_log, (go_read, answer_write))
        except BaseException:
            for fd in (go_write, answer_read):
                os.close(fd)
            raise
        finally:
            os.close(go_read)
            os.close(answer_write)
        return cls(pid, go_write, answer_read, files.name)

    def serve(self) -> None:
        """Let it connect (the VM runs) and wait until the guest has mounted (blocking).

        :raises InternalError: the server ended or the guest refused a mount (its reason).
        """
        try:
            os.write(self._go, b"go")
        except OSError:
            raise InternalError("the volume server ended before the VM ran") from None
        finally:
            self._close()
        try:
            answer = _read_answer(self._answer, self.pid, self._vm)
        finally:
            self._close(answer=True)
        failed = {at: outcome for at, outcome in answer.items() if outcome.startswith("error")}
        if failed:
            raise InternalError(f"the guest could not mount its volumes: {failed}")

    def abandon(self) -> None:
        """Stop it (its VM will not run); blocking."""
        self._close(answer=True)
        kill_and_wait(self.pid, self._vm)

    def _close(self, *, answer: bool = False) -> None:
        """Close the go pipe (and the answer pipe) once; -1 marks closed."""
        if self._go >= 0:
            os.close(self._go)
            self._go = -1
        if answer and self._answer >= 0:
            os.close(self._answer)
            self._answer = -1


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
