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

from forkpoint.errors import Conflict, ForkpointError, InvalidInput
from forkpoint.models import CheckpointKind, HistoryStep, Session
from forkpoint.runtime.checkpoints.service import Checkpoints
from forkpoint.runtime.checkpoints.writer import Captured
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.housekeeping.collector import Collector
from forkpoint.runtime.restore.service import Restore
from forkpoint.runtime.usage import checkpoint_shared_bytes
from forkpoint.store import CheckpointRecord, session_lock_async
from forkpoint.store.history import HistoryStore, StepRecord

__all__ = ["DEFAULT_KEEP", "History", "label_of"]

DEFAULT_KEEP = 20
_LABEL_CHARS = 200


def label_of(command: str | Sequence[str]) -> str:
    text = command if isinstance(command, str) else shlex.join(command)
    return text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 1] + "…"


class History:
    def __init__(
        self,
        context: RuntimeContext,
        checkpoints: Checkpoints,
        collector: Collector,
        restore: Restore,
    ) -> None:
        self.context = context
        self.checkpoints = checkpoints
        self.collector = collector
        self.restore = restore
        self._steps = HistoryStore(context.store)

    async def record(self, session: str, label: str | Sequence[str]) -> None:
        """Checkpoint ``session`` before a step, if it keeps a history (else nothing: one
        indexed read). Returns once the VM's state is captured (the pause): the step
        runs while its checkpoint is written, and is listed when that is done (``history``
        and ``undo`` wait for it; so does the session's next checkpoint, and a CLI
        process before it exits)."""
        record = await asyncio.to_thread(self.context.store.get_session, session)
        keep = await asyncio.to_thread(self._steps.keep, record.id)
        if keep is None:
            return
        async with session_lock_async(self.context.home, record.id):
            captured = await self.checkpoints.capture_held(record.id, None, CheckpointKind.HISTORY)
        self.context.finish_later(record.id, self._finish(captured, label, keep))

    async def _finish(self, captured: Captured, label: str | Sequence[str], keep: int) -> None:
        checkpoint = await captured.finish()
        step = StepRecord(checkpoint.id, checkpoint.session_id, label_of(label), automatic=True)
        await asyncio.to_thread(self._steps.add, step)
        await self._retain(checkpoint.session_id, keep)
        await asyncio.to_thread(captured.prepare_next)
        self.checkpoints.preparer.in_background(checkpoint.session_id)  # as a checkpoint does

    async def _retain(self, session_id: str, keep: int) -> None:
        """Delete automatic checkpoints beyond the last ``keep``, and undone ones, where
        nothing depends on them."""
        for checkpoint_id in await asyncio.to_thread(self._beyond_retention, session_id, keep):
            try:
                await self.collector.remove_checkpoint(checkpoint_id)
            except ForkpointError:
                continue  # a session (a fork, or this one) still runs from it: kept

    def _beyond_retention(self, session_id: str, keep: int) -> list[str]:
        steps = self._steps.steps(session_id)
        own = self.context.store.list_checkpoints(session_id=session_id)
        ordered = [c for c in own if c.id in steps]
        live = [c for c in ordered if steps[c.id].automatic and not steps[c.id].undone]
        doomed = [c for c in ordered if steps[c.id].undone] + live[: max(0, len(live) - keep)]
        return [c.id for c in doomed]

    async def history(self, session: str) -> list[HistoryStep]:
        """The steps of a session created with ``history``, oldest first: automatic
        checkpoints not undone, and named ones (a step still being written included).

        :raises NotFound: :raises Conflict: the session keeps no history.
        """
        record = await asyncio.to_thread(self.context.store.get_session, session)
        await self.context.settled(record.id)
        return await asyncio.to_thread(self._history, record.id)

    def _history(self, session: str) -> list[HistoryStep]:
        store = self.context.store
        record = store.get_session(session)
        if self._steps.keep(record.id) is None:
            raise Conflict(f"session {record.id} keeps no history (create it with --history)")
        steps = self._steps.steps(record.id)
        sessions = store.list_sessions()

        def shared(checkpoint: CheckpointRecord) -> int:  # with the steps before and after
            return checkpoint_shared_bytes(self.context.home, checkpoint)

        out: list[HistoryStep] = []
        for checkpoint in store.list_checkpoints(session_id=record.id):
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
                    created_at=checkpoint.created_at,
                    size_bytes=checkpoint.size_bytes - shared(checkpoint),
                    automatic=step.automatic if step else False, forks=forks,
                )
            )  # fmt: skip
        return out

    def step_labels(self) -> dict[str, str]:
        """Checkpoint id → step label, for every history step not undone (blocking)."""
        return self._steps.labels()

    async def undo(self, session: str, steps: int = 1) -> Session:
        """Roll back to the checkpoint taken before the last ``steps`` steps, processes
        included; those steps are marked undone.

        :raises InvalidInput: ``steps`` < 1; :raises Conflict: no history, or fewer steps.
        """
        if steps < 1:
            raise InvalidInput("steps must be at least 1")
        listed = await self.history(session)
        automatic = [s for s in listed if s.automatic]
        if len(automatic) < steps:
            raise Conflict(f"session {session} has {len(automatic)} step(s) to undo, not {steps}")
        result = await self.restore.rollback(session, automatic[-steps].checkpoint)
        await asyncio.to_thread(self._steps.mark_undone, [s.checkpoint for s in automatic[-steps:]])
        keep = await asyncio.to_thread(self._steps.keep, result.id)
        await self._retain(result.id, keep or DEFAULT_KEEP)
        return result
