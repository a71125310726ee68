"""E2B-specific state per sandbox (the ``e2b_sandboxes`` table), kept beside the session.

One row per session created through the E2B gateway: the sandbox's envd access token,
the template name it was created from, metadata and default environment. Everything else
a sandbox is — its lifetime and what happens at its end, whether it is paused, the
checkpoints made for a pause or a fork — is its session's (see :mod:`forkpoint.runtime`).
The row goes with its session (``ON DELETE CASCADE``).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field

from forkpoint.errors import NotFound

from .db import Store

__all__ = ["E2bSandboxRecord", "E2bStore"]


@dataclass(frozen=True)
class E2bSandboxRecord:
    """``started_at``: Unix seconds."""

    session_id: str
    access_token: str
    template: str
    started_at: float
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    #: What a request to one of its ports must carry (None: nothing, as on E2B by default).
    traffic_token: str | None = None
    #: Paused, it wakes on a request to one of its ports.
    auto_resume: bool = False
    #: The Host header requests to its ports arrive with (``${PORT}``: the port); None: theirs.
    host_mask: str | None = None


def _record(row: sqlite3.Row) -> E2bSandboxRecord:
    return E2bSandboxRecord(
        session_id=row["session_id"], access_token=row["access_token"],
        template=row["template"], started_at=row["started_at"],
        metadata=json.loads(row["metadata"]), env_vars=json.loads(row["env_vars"]),
        traffic_token=row["traffic_token"], auto_resume=bool(row["auto_resume"]),
        host_mask=row["host_mask"],
    )  # fmt: skip


class E2bStore:
    """The gateway's rows, in the runtime's :class:`Store` (same database, same locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def insert(self, record: E2bSandboxRecord) -> E2bSandboxRecord:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO e2b_sandboxes (session_id, access_token, template, metadata, "
                "env_vars, started_at, traffic_token, auto_resume, host_mask) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.session_id, record.access_token, record.template,
                    json.dumps(record.metadata), json.dumps(record.env_vars), record.started_at,
                    record.traffic_token, int(record.auto_resume), record.host_mask,
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
            rows = conn.execute("SELECT * FROM e2b_sandboxes ORDER BY started_at, rowid").fetchall()
        return [_record(r) for r in rows]

    def delete(self, session_id: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM e2b_sandboxes WHERE session_id = ?", (session_id,))
