"""E2B-specific state per sandbox (the ``e2b_sandboxes`` table), kept beside the session.

One row per session created through the E2B gateway: the sandbox's envd access token,
the template name it was created from, metadata, default environment, its end time and
what happens then (kill, or pause when ``auto_pause``), and the checkpoints the gateway made
for its own purposes (pauses, forks), which are not the user's snapshots. The row goes
with its session (``ON DELETE CASCADE``).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, replace

from forkpoint.errors import NotFound

from .db import Store

__all__ = ["E2bSandboxRecord", "E2bStore"]


@dataclass(frozen=True)
class E2bSandboxRecord:
    """``started_at``/``end_at`` are Unix seconds; ``paused_at`` the pause checkpoint's id
    while the sandbox is paused (None when running)."""

    session_id: str
    access_token: str
    template: str
    started_at: float
    end_at: float
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    auto_pause: bool = False
    paused_at: str | None = None


def _record(row: sqlite3.Row) -> E2bSandboxRecord:
    return E2bSandboxRecord(
        session_id=row["session_id"], access_token=row["access_token"],
        template=row["template"], started_at=row["started_at"], end_at=row["end_at"],
        metadata=json.loads(row["metadata"]), env_vars=json.loads(row["env_vars"]),
        auto_pause=bool(row["auto_pause"]), paused_at=row["paused_at"],
    )  # fmt: skip


class E2bStore:
    """The gateway's rows, in the runtime's :class:`Store` (same database, same locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def insert(self, record: E2bSandboxRecord) -> E2bSandboxRecord:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO e2b_sandboxes (session_id, access_token, template, metadata, "
                "env_vars, started_at, end_at, auto_pause, paused_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.session_id, record.access_token, record.template,
                    json.dumps(record.metadata), json.dumps(record.env_vars),
                    record.started_at, record.end_at, int(record.auto_pause), record.paused_at,
                ),
            )  # fmt: skip
        return record

    def get(self, session_id: str) -> E2bSandboxRecord:
        """:raises NotFound: no E2B sandbox with this id."""
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT * FROM e2b_sandboxes WHERE session_id = ?", (session_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"sandbox {session_id} not found")
        return _record(row)

    def find(self, session_id: str) -> E2bSandboxRecord | None:
        try:
            return self.get(session_id)
        except NotFound:
            return None

    def list(self) -> list[E2bSandboxRecord]:
        with self.store.transaction() as conn:
            rows = conn.execute("SELECT * FROM e2b_sandboxes ORDER BY started_at").fetchall()
        return [_record(r) for r in rows]

    def update(self, record: E2bSandboxRecord, **changes: object) -> E2bSandboxRecord:
        new = replace(record, **changes)  # type: ignore[arg-type]
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE e2b_sandboxes SET end_at = ?, auto_pause = ?, paused_at = ?, "
                "metadata = ? WHERE session_id = ?",
                (new.end_at, int(new.auto_pause), new.paused_at, json.dumps(new.metadata),
                 new.session_id),
            )  # fmt: skip
        return new

    def delete(self, session_id: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM e2b_sandboxes WHERE session_id = ?", (session_id,))

    def add_internal_checkpoint(self, checkpoint_id: str, session_id: str, purpose: str) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO e2b_internal_checkpoints VALUES (?, ?, ?)",
                (checkpoint_id, session_id, purpose),
            )

    def internal_checkpoints(self) -> set[str]:
        with self.store.transaction() as conn:
            rows = conn.execute("SELECT checkpoint_id FROM e2b_internal_checkpoints").fetchall()
        return {r[0] for r in rows}

    def forget_internal_checkpoint(self, checkpoint_id: str) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "DELETE FROM e2b_internal_checkpoints WHERE checkpoint_id = ?", (checkpoint_id,)
            )
