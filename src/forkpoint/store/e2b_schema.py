"""Schema migration of the E2B gateway's tables (see :mod:`forkpoint.store.e2b`)."""

from __future__ import annotations

import sqlite3

__all__ = [
    "migrate_e2b",
    "migrate_e2b_host_mask",
    "migrate_e2b_onto_sessions",
    "migrate_e2b_templates",
    "migrate_e2b_traffic_and_resume",
]


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


def migrate_e2b_onto_sessions(conn: sqlite3.Connection) -> None:
    """Schema v9: the gateway keeps no lifetime or checkpoints of its own. A running
    sandbox's end time becomes its session's ``expires_at`` (a paused one never expires),
    auto-pause its ``on_expiry``, the internal checkpoints' purpose their ``kind``."""
    conn.execute(
        """UPDATE sessions SET
            expires_at = (SELECT CASE WHEN e.paused_at IS NULL
                                 THEN strftime('%Y-%m-%dT%H:%M:%fZ', e.end_at, 'unixepoch')
                                 END
                          FROM e2b_sandboxes e WHERE e.session_id = sessions.id),
            on_expiry = (SELECT CASE e.auto_pause WHEN 1 THEN 'pause' ELSE 'remove' END
                         FROM e2b_sandboxes e WHERE e.session_id = sessions.id)
        WHERE id IN (SELECT session_id FROM e2b_sandboxes)"""
    )
    conn.execute(
        "UPDATE checkpoints SET kind = (SELECT purpose FROM e2b_internal_checkpoints i "
        "WHERE i.checkpoint_id = checkpoints.id) "
        "WHERE id IN (SELECT checkpoint_id FROM e2b_internal_checkpoints)"
    )
    conn.execute("DROP TABLE e2b_internal_checkpoints")
    conn.execute(
        """CREATE TABLE e2b_sandboxes_v9 (
            session_id   TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
            access_token TEXT NOT NULL,
            template     TEXT NOT NULL,
            metadata     TEXT NOT NULL DEFAULT '{}',
            env_vars     TEXT NOT NULL DEFAULT '{}',
            started_at   REAL NOT NULL
        )"""
    )
    conn.execute(
        "INSERT INTO e2b_sandboxes_v9 SELECT session_id, access_token, template, metadata, "
        "env_vars, started_at FROM e2b_sandboxes"
    )
    conn.execute("DROP TABLE e2b_sandboxes")
    conn.execute("ALTER TABLE e2b_sandboxes_v9 RENAME TO e2b_sandboxes")


def migrate_e2b_traffic_and_resume(conn: sqlite3.Connection) -> None:
    """Schema v11: a sandbox's ports may need its traffic token (``traffic_token``; NULL:
    anyone on the host may reach them), and a paused one may wake on a request to them
    (``auto_resume``)."""
    conn.execute("ALTER TABLE e2b_sandboxes ADD COLUMN traffic_token TEXT")
    conn.execute(
        "ALTER TABLE e2b_sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0 "
        "CHECK (auto_resume IN (0, 1))"
    )


def migrate_e2b_host_mask(conn: sqlite3.Connection) -> None:
    """Schema v12: the Host header requests to a sandbox's ports arrive with
    (``host_mask``, E2B's ``maskRequestHost``; NULL: as the client sent it)."""
    conn.execute("ALTER TABLE e2b_sandboxes ADD COLUMN host_mask TEXT")


def migrate_e2b_templates(conn: sqlite3.Connection) -> None:
    """Schema v15: templates built from code (E2B's template builder): a template is a name;
    each build of it becomes a forkpoint image (``image_hash``, and ``oci_id``: its podman
    image, the base of a template built ``from_template`` it) whose sandboxes have the
    build's ``cpus`` and ``memory_mib``; ``files``: the hashes of the uploads its steps
    copy (kept while a build names them); tags name builds."""
    conn.execute(
        """CREATE TABLE e2b_templates (
            template_id TEXT PRIMARY KEY,
            name        TEXT NOT NULL UNIQUE,
            created_at  REAL NOT NULL
        )"""
    )
    conn.execute(
        """CREATE TABLE e2b_template_builds (
            build_id    TEXT PRIMARY KEY,
            template_id TEXT NOT NULL REFERENCES e2b_templates(template_id) ON DELETE CASCADE,
            status      TEXT NOT NULL
                        CHECK (status IN ('waiting', 'building', 'ready', 'error')),
            tags        TEXT NOT NULL DEFAULT '[]',
            cpus        INTEGER NOT NULL,
            memory_mib  INTEGER NOT NULL,
            files       TEXT NOT NULL DEFAULT '[]',
            image_hash  TEXT,
            oci_id      TEXT,
            reason      TEXT,
            step        TEXT,
            created_at  REAL NOT NULL
        )"""
    )
    conn.execute(
        """CREATE TABLE e2b_template_tags (
            template_id TEXT NOT NULL REFERENCES e2b_templates(template_id) ON DELETE CASCADE,
            tag         TEXT NOT NULL,
            build_id    TEXT NOT NULL REFERENCES e2b_template_builds(build_id) ON DELETE CASCADE,
            created_at  REAL NOT NULL,
            PRIMARY KEY (template_id, tag)
        )"""
    )
