"""Schema migration of the E2B gateway's tables (see :mod:`forkpoint.store.e2b`)."""

from __future__ import annotations

import sqlite3

__all__ = ["migrate_e2b"]


def migrate_e2b(conn: sqlite3.Connection) -> None:
    """Schema v3: the E2B gateway's per-sandbox state and its internal checkpoints."""
    conn.execute(
        """CREATE TABLE e2b_sandboxes (
            session_id   TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
            access_token TEXT NOT NULL,
            template     TEXT NOT NULL,
            metadata     TEXT NOT NULL DEFAULT '{}',
            env_vars     TEXT NOT NULL DEFAULT '{}',
            started_at   REAL NOT NULL,
            end_at       REAL NOT NULL,
            auto_pause   INTEGER NOT NULL DEFAULT 0,
            paused_at    TEXT
        )"""
    )
    # Checkpoints the gateway made for a pause or a fork: hidden from the snapshot list,
    # deleted once nothing depends on them. No foreign key: they outlive their sandbox.
    conn.execute(
        """CREATE TABLE e2b_internal_checkpoints (
            checkpoint_id TEXT PRIMARY KEY,
            session_id    TEXT NOT NULL,
            purpose       TEXT NOT NULL CHECK (purpose IN ('pause', 'fork'))
        )"""
    )
