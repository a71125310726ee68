"""Step histories (the ``history_sessions`` and ``history_steps`` tables).

A session created with ``history`` has a row in ``history_sessions`` (how many automatic
checkpoints to keep); each checkpoint the runtime takes before a step has a row in
``history_steps`` with its label (the command, or the path written). Both go with what
they describe (``ON DELETE CASCADE``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .db import Store

__all__ = ["HistoryStore", "StepRecord"]


@dataclass(frozen=True)
class StepRecord:
    checkpoint_id: str
    session_id: str
    label: str
    automatic: bool
    undone: bool = False


class HistoryStore:
    """History rows, in the runtime's :class:`Store` (same database, same locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def enable(self, session_id: str, keep: int) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO history_sessions (session_id, keep) VALUES (?, ?)",
                (session_id, keep),
            )

    def keep(self, session_id: str) -> int | None:
        """Automatic checkpoints kept, or None: the session keeps no history."""
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT keep FROM history_sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
        return None if row is None else int(row["keep"])

    def add(self, step: StepRecord) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO history_steps (checkpoint_id, session_id, label, "
                "automatic) VALUES (?, ?, ?, ?)",
                (step.checkpoint_id, step.session_id, step.label, int(step.automatic)),
            )

    def mark_undone(self, checkpoint_ids: list[str]) -> None:
        with self.store.transaction() as conn:
            conn.executemany(
                "UPDATE history_steps SET undone = 1 WHERE checkpoint_id = ?",
                [(c,) for c in checkpoint_ids],
            )

    def labels(self) -> dict[str, str]:
        """checkpoint id → label of every step not undone, of every session."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT checkpoint_id, label FROM history_steps WHERE undone = 0"
            ).fetchall()
        return {r["checkpoint_id"]: r["label"] for r in rows}

    def steps(self, session_id: str) -> dict[str, StepRecord]:
        """The session's labelled checkpoints, by checkpoint id."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT * FROM history_steps WHERE session_id = ?", (session_id,)
            ).fetchall()
        return {
            r["checkpoint_id"]: StepRecord(
                r["checkpoint_id"],
                r["session_id"],
                r["label"],
                bool(r["automatic"]),
                bool(r["undone"]),
            )  # fmt: skip
            for r in rows
        }
