"""Store records as users see them: :mod:`forkpoint.models` values made from records."""

from __future__ import annotations

from forkpoint.models import Checkpoint, Port, Session
from forkpoint.store import CheckpointRecord, SessionRecord

__all__ = ["checkpoint_of", "session_of"]


def session_of(record: SessionRecord) -> Session:
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
        egress={key: list(record.egress.get(key, [])) for key in ("allow", "deny")},
    )


def checkpoint_of(record: CheckpointRecord) -> Checkpoint:
    from .manifest import Manifest  # here: `forkpoint ls` never reads a manifest

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
    )
