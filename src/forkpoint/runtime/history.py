"""Step histories: a checkpoint before every step, ``history`` and ``undo``.

A session created with ``history`` gets a checkpoint labelled with the step (the command,
or the path written) before every ``exec``, ``spawn`` and file write made through forkpoint.
``undo`` rolls back to the checkpoint before the last N steps (processes included) and
marks those steps undone, so the next ``undo`` goes further back. Retention: the last
``keep`` automatic checkpoints stay, with every named one; older ones (and undone ones) are
deleted as soon as nothing depends on them (a fork started from one keeps it).
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from forkpoint.errors import Conflict, ForkpointError, InvalidInput
from forkpoint.models import CheckpointKind, HistoryStep, Session
from forkpoint.store.history import HistoryStore, StepRecord

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["DEFAULT_KEEP", "history_of", "label_of", "record_step", "undo"]

DEFAULT_KEEP = 20
_LABEL_CHARS = 200


def label_of(command: str | Sequence[str]) -> str:
    text = command if isinstance(command, str) else shlex.join(command)
    return text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 1] + "…"


async def record_step(runtime: Runtime, session: str, label: str) -> None:
    """Checkpoint ``session`` before a step, if it keeps a history (else nothing: one
    indexed read)."""
    store = HistoryStore(runtime.store)
    record = await asyncio.to_thread(runtime.store.get_session, session)
    keep = await asyncio.to_thread(store.keep, record.id)
    if keep is None:
        return
    checkpoint = await runtime.checkpoint(record.id, kind=CheckpointKind.HISTORY)
    await asyncio.to_thread(
        store.add, StepRecord(checkpoint.id, record.id, label_of(label), automatic=True)
    )
    await _retain(runtime, record.id, keep)


async def _retain(runtime: Runtime, session_id: str, keep: int) -> None:
    """Delete automatic checkpoints beyond the last ``keep``, and undone ones, where
    nothing depends on them."""
    for checkpoint_id in await asyncio.to_thread(_beyond_retention, runtime, session_id, keep):
        try:
            await runtime.remove_checkpoint(checkpoint_id)
        except ForkpointError:
            continue  # a session (a fork, or this one) still runs from it: kept


def _beyond_retention(runtime: Runtime, session_id: str, keep: int) -> list[str]:
    steps = HistoryStore(runtime.store).steps(session_id)
    ordered = [c for c in runtime.store.list_checkpoints(session_id=session_id) if c.id in steps]
    live = [c for c in ordered if steps[c.id].automatic and not steps[c.id].undone]
    doomed = [c for c in ordered if steps[c.id].undone] + live[: max(0, len(live) - keep)]
    return [c.id for c in doomed]


def history_of(runtime: Runtime, session: str) -> list[HistoryStep]:
    """The session's steps, oldest first: automatic checkpoints not undone, and named ones.

    :raises NotFound: :raises Conflict: the session keeps no history.
    """
    store = HistoryStore(runtime.store)
    record = runtime.store.get_session(session)
    if store.keep(record.id) is None:
        raise Conflict(f"session {record.id} keeps no history (create it with --history)")
    steps = store.steps(record.id)
    sessions = runtime.store.list_sessions()
    out: list[HistoryStep] = []
    for checkpoint in runtime.store.list_checkpoints(session_id=record.id):
        step = steps.get(checkpoint.id)
        if step is None and checkpoint.name is None:
            continue  # an unnamed checkpoint taken by hand: not part of the history
        if step is not None and step.undone:
            continue
        forks = tuple(
            s.id for s in sessions if s.parent_checkpoint == checkpoint.id and s.id != record.id
        )
        out.append(
            HistoryStep(
                step=len(out) + 1, checkpoint=checkpoint.id,
                label=step.label if step else f"checkpoint {checkpoint.name}",
                created_at=checkpoint.created_at, size_bytes=checkpoint.size_bytes,
                automatic=step.automatic if step else False, forks=forks,
            )
        )  # fmt: skip
    return out


async def undo(runtime: Runtime, session: str, steps: int = 1) -> Session:
    """Roll back to the checkpoint taken before the last ``steps`` steps, processes
    included; those steps are marked undone.

    :raises InvalidInput: ``steps`` < 1; :raises Conflict: no history, or fewer steps.
    """
    if steps < 1:
        raise InvalidInput("steps must be at least 1")
    listed = await asyncio.to_thread(history_of, runtime, session)
    automatic = [s for s in listed if s.automatic]
    if len(automatic) < steps:
        raise Conflict(f"session {session} has {len(automatic)} step(s) to undo, not {steps}")
    target = automatic[-steps]
    result = await runtime.rollback(session, target.checkpoint)
    store = HistoryStore(runtime.store)
    await asyncio.to_thread(store.mark_undone, [s.checkpoint for s in automatic[-steps:]])
    keep = await asyncio.to_thread(store.keep, result.id)
    await _retain(runtime, result.id, keep or DEFAULT_KEEP)
    return result
