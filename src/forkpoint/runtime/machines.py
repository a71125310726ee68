"""Starting a session's VM from a checkpoint, and the guest identity it wakes up with.

Shared by create (from the image template), fork and rollback: the only difference is
which session id and host ports the restored VM gets.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from forkpoint.agent_client import AgentClient
from forkpoint.config import Home
from forkpoint.vm import BootFiles, Machine, MachineShape, VmFiles, qemu_build
from forkpoint.vm.disk import create_overlay
from forkpoint.vm.net import start_passt, stop_passt

from .manifest import RAM, STATE

__all__ = [
    "AGENT_READY_TIMEOUT_S",
    "Started",
    "new_layer_name",
    "restore_identity",
    "start_restored",
]

AGENT_READY_TIMEOUT_S = 60.0  # a loaded 2-core TCG host can take this long


def new_layer_name() -> str:
    return f"{uuid.uuid4().hex[:16]}.qcow2"


@dataclass(frozen=True)
class Started:
    """A restored VM: its QEMU, its network helper pid and its fresh top disk layer."""

    machine: Machine
    passt_pid: int | None
    disk_layer: str


async def start_restored(
    home: Home,
    files: VmFiles,
    checkpoint_dir: Path,
    checkpoint_layer: str,
    shape: MachineShape,
    boot: BootFiles,
    forwards: list[tuple[int, int]],
    network: bool,
    hostname: str,
) -> Started:
    """Restore the checkpoint in ``checkpoint_dir`` as a running VM with these identities.

    The VM gets a new top layer on the checkpoint's frozen one and maps the checkpoint's
    RAM file copy-on-write (nothing is copied). On return the guest's clock, RNG and
    hostname are fresh.
    """
    files.ensure()
    layer = new_layer_name()
    await asyncio.to_thread(create_overlay, home.layers / checkpoint_layer, home.layers / layer)
    machine: Machine | None = None
    passt_pid = None
    try:
        machine = await Machine.start(
            qemu_build(), shape, boot, files, home.layers / layer, checkpoint_dir / RAM,
            state=checkpoint_dir / STATE,
        )  # fmt: skip
        if network:
            passt_pid = await asyncio.to_thread(start_passt, files, forwards)
            await machine.announce()  # so passt learns the guest's MAC before any traffic
        await restore_identity(files, hostname)
    except BaseException:
        # Nothing of a failed restore may linger: not the VM, its network, or its layer.
        if machine is not None:
            await machine.kill()
        stop_passt(files, passt_pid)
        (home.layers / layer).unlink(missing_ok=True)
        raise
    return Started(machine, passt_pid, layer)


async def restore_identity(files: VmFiles, hostname: str) -> None:
    """Give a just-restored guest the host's clock, fresh entropy and its own hostname."""
    async with await AgentClient.connect(
        files.agent_socket, timeout=AGENT_READY_TIMEOUT_S
    ) as agent:
        await agent.restore_identity(time.time_ns(), os.urandom(64), hostname)
