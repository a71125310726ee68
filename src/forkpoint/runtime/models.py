"""Store records as users see them: :mod:`forkpoint.models` values made from records."""

from __future__ import annotations

from forkpoint.egress import EgressPolicy
from forkpoint.models import Checkpoint, Limits, Port, Session, SessionState
from forkpoint.store import CheckpointRecord, SessionRecord
from forkpoint.vm.cgroups import CONTROLLERS, limits_in_force

__all__ = ["checkpoint_of", "limits_of", "session_of"]


def session_of(record: SessionRecord, disk_bytes: int = 0) -> Session:
    return Session(
        id=record.id,
        name=record.name,
        image=record.image,
        state=record.state,
        created_at=record.created_at,
        parent_checkpoint=record.parent_checkpoint,
        ports=tuple(Port(guest_port=p.guest_port, host_port=p.host_port) for p in record.ports),
        memory_mib=record.memory_mib,
        cpus=record.cpus,
        network=record.network,
        expires_at=record.expires_at,
        on_expiry=record.on_expiry,
        keep_memory=record.pause_memory,
        paused_on_disk=record.paused_on_disk,
        disk_mib=record.disk_mib,
        disk_bytes=disk_bytes,
        limits=limits_of(record.qemu_pid) if record.state == SessionState.RUNNING else None,
        egress=EgressPolicy.from_json(record.egress).shown(),  # header values stay here
    )


def limits_of(qemu_pid: int | None) -> Limits | None:
    """A running VM's limits as its cgroup files say (None: no VM). A VM in none of our
    cgroups (none could be made) has every limit not enforced."""
    if not qemu_pid:
        return None
    found = limits_in_force(qemu_pid)
    if found is None:
        return Limits(None, None, None, None, not_enforced=CONTROLLERS)
    return Limits(
        memory_bytes=found.memory_bytes,
        cpus=found.cpus,
        pids_max=found.pids_max,
        io_weight=found.io_weight,
        not_enforced=found.not_enforced,
    )


def checkpoint_of(
    record: CheckpointRecord, disk_bytes: int = 0, shared_bytes: int = 0
) -> Checkpoint:
    from forkpoint.runtime.checkpoints.manifest import (
        Manifest,  # here: `forkpoint ls` never reads a manifest
    )

    manifest = Manifest.from_dict(record.manifest, checkpoint_id=record.id)
    return Checkpoint(
        id=record.id,
        session_id=record.session_id,
        name=record.name,
        kind=record.kind,
        created_at=record.created_at,
        parent_checkpoint=record.parent_checkpoint,
        image=record.image,
        size_bytes=record.size_bytes,
        duration_ms=round(manifest.duration_ms, 1),
        pause_ms=round(manifest.stats.pause_ms, 1),
        guest_ports=manifest.ports,
        disk_bytes=disk_bytes,
        shared_bytes=shared_bytes,
    )
