"""Where a restore goes and on which machine, checked before any QEMU starts: the target
of a fork (a checkpoint on the shape it was taken on) and of a rollback (a checkpoint of
the session's lineage, on the session's shape)."""

from __future__ import annotations

import asyncio

from forkpoint.errors import NotFound
from forkpoint.images import Image
from forkpoint.models import Network
from forkpoint.runtime.checkpoints.lineage import rollback_target
from forkpoint.runtime.checkpoints.manifest import Manifest
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.sessions.warm import WarmTarget
from forkpoint.store import CheckpointRecord, SessionRecord, Store
from forkpoint.vm import MachineShape

__all__ = ["fork_source", "fork_target", "rollback_plan"]


def fork_source(store: Store, checkpoint: str) -> tuple[CheckpointRecord, SessionRecord | None]:
    """The checkpoint, and the session it was taken of if that still exists (blocking)."""
    record = store.get_checkpoint(checkpoint)
    try:
        return record, store.get_session(record.session_id)
    except NotFound:
        return record, None


async def fork_target(
    context: RuntimeContext, record: CheckpointRecord, source: SessionRecord | None
) -> WarmTarget:
    """What forks of ``record`` start: its image, machine shape, network (the session it
    was taken of, if that still exists, else ``user``) and forwarded ports.
    :raises IncompatibleCheckpoint: it was made by another QEMU build or shape;
    :raises DamagedCheckpoint:"""
    manifest = Manifest.from_dict(record.manifest, checkpoint_id=record.id)
    image, shape = await asyncio.to_thread(
        context.machine, record.image_hash, manifest.shape.memory_mib, manifest.shape.cpus
    )
    await asyncio.to_thread(context.manifest, record.id, shape)
    network = source.network if source else Network.USER
    return WarmTarget(record, image, shape, network, manifest.ports)


def rollback_plan(
    context: RuntimeContext, record: SessionRecord, checkpoint: str | None
) -> tuple[CheckpointRecord, Image, MachineShape]:
    """Where a rollback of ``record`` goes and on which machine, checked (blocking).
    :raises Conflict: ``checkpoint`` is not in its lineage."""
    target = rollback_target(context.store, record, checkpoint)
    image, shape = context.machine(target.image_hash, record.memory_mib, record.cpus)
    context.manifest(target.id, shape)
    return target, image, shape
