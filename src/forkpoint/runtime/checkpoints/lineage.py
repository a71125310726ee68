"""Which checkpoints a session may roll back to: its own, and those it descends from."""

from __future__ import annotations

from forkpoint.errors import Conflict, NotFound, UnknownCheckpoint
from forkpoint.store import CheckpointRecord, SessionRecord, Store

__all__ = ["lineage", "rollback_target"]


def lineage(store: Store, record: SessionRecord) -> list[str]:
    """Ids of the session's own checkpoints (oldest first), then of its ancestors
    (nearest first)."""
    own = [c.id for c in store.list_checkpoints(session_id=record.id)]
    ancestors: list[str] = []
    current = record.parent_checkpoint
    while current and current not in ancestors:
        ancestors.append(current)
        try:
            current = store.get_checkpoint(current).parent_checkpoint
        except NotFound:
            break
    return own + ancestors


def rollback_target(
    store: Store, record: SessionRecord, checkpoint: str | None
) -> CheckpointRecord:
    """The checkpoint to roll the session back to; default: its latest own checkpoint,
    else the one it started from.

    :raises UnknownCheckpoint: no such checkpoint; :raises Conflict: it is not in the session's
        lineage, or the session has none.
    """
    if checkpoint is None:
        own = store.list_checkpoints(session_id=record.id)
        latest = own[-1].id if own else record.parent_checkpoint
        if latest is None:
            raise Conflict(f"session {record.id} has no checkpoint to roll back to")
        return store.get_checkpoint(latest)
    try:
        target = store.get_checkpoint(checkpoint)
    except NotFound as error:
        raise UnknownCheckpoint(str(error)) from error
    if target.id not in lineage(store, record):
        raise Conflict(
            f"checkpoint {target.id} is not in the lineage of session {record.id}; "
            f"use `forkpoint fork {target.id}` to start a new session from it"
        )
    return target
