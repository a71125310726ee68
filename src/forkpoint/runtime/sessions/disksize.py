"""A session's virtual disk size (``create --disk``): the block device grows, then the
guest's filesystem.

An image's root filesystem fills its whole disk (``mkfs.ext4`` on ``/dev/vda``, no
partition table), so growing is QEMU's ``block_resize`` of the top layer — through the
descriptor it holds; the guest learns the new capacity at once from virtio's config
interrupt — then an online ``resize2fs`` in the guest through the agent (≈ 1–2 s under
TCG). Host disk is not taken up front: the qcow2 layers stay sparse, and the size bounds
how much a guest can write. A restore of a checkpoint taken before the grow (a rollback
to the image's template) grows again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forkpoint.errors import CommandNotFound, InternalError, InvalidInput
from forkpoint.vm import Machine

if TYPE_CHECKING:
    from forkpoint.runtime.guest.processes import AgentSource

__all__ = ["grow_block_device", "grow_filesystem"]

_RESIZE_TIMEOUT_S = 120.0


async def grow_block_device(machine: Machine, disk_mib: int, *, at_create: bool) -> bool:
    """Grow the VM's disk to ``disk_mib``; returns whether it grew (then the guest's
    filesystem must follow: :func:`grow_filesystem`).

    :raises InvalidInput: at create, a size below the image's (disks only grow).
    """
    wanted = disk_mib << 20
    previous = await machine.grow_disk(wanted)
    if at_create and wanted < previous:
        raise InvalidInput(
            f"--disk {disk_mib} MiB is smaller than the image's disk ({previous >> 20} MiB)"
        )
    return wanted > previous


async def grow_filesystem(guest: AgentSource, session_id: str) -> None:
    """Grow the guest's root filesystem to its disk (online); straight through the agent,
    not a step of the session's history.

    :raises InternalError: ``resize2fs`` failed (its last line says why) or the image has
        none (an OCI image without e2fsprogs).
    """
    try:
        async with guest.agent(session_id) as agent:
            result = await agent.exec(
                ["resize2fs", "/dev/vda"], timeout=_RESIZE_TIMEOUT_S, user="root"
            )
    except CommandNotFound as error:
        raise InternalError(
            "growing the guest's filesystem needs resize2fs in the image (install e2fsprogs "
            f"in it): {error.message}"
        ) from error
    if result.exit_code != 0:
        lines = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()
        reason = lines[-1] if lines else f"exit code {result.exit_code}"
        raise InternalError(f"growing the guest's filesystem failed: {reason}")
