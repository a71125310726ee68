"""Schema of the metadata database and its migrations.

The schema version is SQLite's ``PRAGMA user_version``. ``MIGRATIONS[i]`` upgrades a
database from version ``i`` to ``i + 1``; ``SCHEMA_VERSION == len(MIGRATIONS)``. Append
new migrations, never edit a released one. A database newer than this code is refused.

Migrations run inside one ``BEGIN IMMEDIATE`` transaction with foreign keys off (the
procedure SQLite documents for table rebuilds), then ``PRAGMA foreign_key_check`` must
come back empty before the commit. They must not use ``executescript`` (it commits).

Deliberately not foreign keys: ``checkpoints.session_id`` (a checkpoint outlives its
session and may belong to a session that was never stored, e.g. an image build).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from forkpoint.errors import Conflict, InternalError

from .e2b_schema import (
    migrate_e2b,
    migrate_e2b_host_mask,
    migrate_e2b_onto_sessions,
    migrate_e2b_templates,
    migrate_e2b_traffic_and_resume,
)

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Migration", "migrate", "schema_version"]

Migration = Callable[[sqlite3.Connection], None]


def _run(conn: sqlite3.Connection, *statements: str) -> None:
    for statement in statements:
        conn.execute(statement)


def _v1_core(conn: sqlite3.Connection) -> None:
    """Layers, checkpoints, sessions and their port forwards."""
    _run(
        conn,
        """CREATE TABLE layers (
            name       TEXT PRIMARY KEY,
            backing    TEXT REFERENCES layers(name),
            created_at TEXT NOT NULL
        )""",
        "CREATE INDEX layers_backing ON layers(backing)",
        """CREATE TABLE checkpoints (
            id                TEXT PRIMARY KEY,
            session_id        TEXT NOT NULL,
            name              TEXT UNIQUE,
            kind              TEXT NOT NULL CHECK (kind IN ('user', 'template')),
            created_at        TEXT NOT NULL,
            disk_layer        TEXT NOT NULL REFERENCES layers(name),
            parent_checkpoint TEXT REFERENCES checkpoints(id),
            image             TEXT NOT NULL,
            image_hash        TEXT NOT NULL,
            manifest          TEXT NOT NULL DEFAULT '{}',
            size_bytes        INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX checkpoints_session ON checkpoints(session_id)",
        "CREATE INDEX checkpoints_parent ON checkpoints(parent_checkpoint)",
        "CREATE INDEX checkpoints_layer ON checkpoints(disk_layer)",
        """CREATE TABLE sessions (
            id                TEXT PRIMARY KEY,
            name              TEXT UNIQUE,
            image             TEXT NOT NULL,
            image_hash        TEXT NOT NULL,
            state             TEXT NOT NULL
                              CHECK (state IN ('creating', 'running', 'stopped', 'crashed')),
            created_at        TEXT NOT NULL,
            parent_checkpoint TEXT REFERENCES checkpoints(id),
            memory_mib        INTEGER NOT NULL CHECK (memory_mib > 0),
            cpus              INTEGER NOT NULL CHECK (cpus > 0),
            network           TEXT NOT NULL CHECK (network IN ('user', 'none')),
            disk_layer        TEXT NOT NULL REFERENCES layers(name),
            generation        INTEGER NOT NULL DEFAULT 0,
            qemu_pid          INTEGER,
            aux_pids          TEXT NOT NULL DEFAULT '[]'
        )""",
        "CREATE INDEX sessions_parent ON sessions(parent_checkpoint)",
        "CREATE INDEX sessions_layer ON sessions(disk_layer)",
        # host_port is UNIQUE across all sessions: two sessions can never share one.
        """CREATE TABLE ports (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            guest_port INTEGER NOT NULL CHECK (guest_port BETWEEN 1 AND 65535),
            host_port  INTEGER NOT NULL UNIQUE CHECK (host_port BETWEEN 1 AND 65535),
            PRIMARY KEY (session_id, guest_port)
        )""",
    )


def _v2_templates(conn: sqlite3.Connection) -> None:
    """Template checkpoints per (image, machine shape); forgotten with their checkpoint."""
    _run(
        conn,
        """CREATE TABLE templates (
            image_hash    TEXT NOT NULL,
            machine_key   TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,
            created_at    TEXT NOT NULL,
            PRIMARY KEY (image_hash, machine_key)
        )""",
        "CREATE INDEX templates_checkpoint ON templates(checkpoint_id)",
    )


def _v4_jail(conn: sqlite3.Connection) -> None:
    """What confines a session: the uid its QEMU and passt run as, its disk size, when it
    expires, and where its guest may connect (``egress``: JSON ``{"allow": [...], "deny":
    [...]}`` of CIDRs on top of the default policy). Sessions that exist get their uid
    from :meth:`Store.open`, which knows the home's block of uids."""
    _run(
        conn,
        "ALTER TABLE sessions ADD COLUMN uid INTEGER",
        "ALTER TABLE sessions ADD COLUMN disk_mib INTEGER",
        "ALTER TABLE sessions ADD COLUMN expires_at TEXT",
        "ALTER TABLE sessions ADD COLUMN egress TEXT NOT NULL DEFAULT '{}'",
    )
    conn.execute("CREATE UNIQUE INDEX sessions_uid ON sessions(uid)")


def _v5_history(conn: sqlite3.Connection) -> None:
    """Sessions with a step history (``keep``: automatic checkpoints kept), and the label of
    each checkpoint of such a session (``automatic``: made before a step, not by name;
    ``undone``: an ``undo`` went back past that step).
    A step goes with its checkpoint; the session row may go first (its checkpoints stay)."""
    _run(
        conn,
        """CREATE TABLE history_sessions (
            session_id TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
            keep INTEGER NOT NULL
        )""",
        """CREATE TABLE history_steps (
            checkpoint_id TEXT PRIMARY KEY REFERENCES checkpoints(id) ON DELETE CASCADE,
            session_id TEXT NOT NULL,
            label TEXT NOT NULL,
            automatic INTEGER NOT NULL,
            undone INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX history_steps_session ON history_steps(session_id)",
    )


def _v6_warm(conn: sqlite3.Connection) -> None:
    """QEMU processes started ahead of a create (``runtime/sessions/warm.py``): each waits, paused,
    to become the session ``id`` with uid ``uid``, restored from ``checkpoint_id``; ``key``
    says what it was started for (checkpoint, machine shape with its QEMU build, network)."""
    _run(
        conn,
        """CREATE TABLE warm_vms (
            id TEXT PRIMARY KEY,
            uid INTEGER NOT NULL UNIQUE,
            checkpoint_id TEXT NOT NULL,
            key TEXT NOT NULL,
            disk_layer TEXT NOT NULL,
            qemu_pid INTEGER,
            created_at TEXT NOT NULL
        )""",
        "CREATE INDEX warm_vms_key ON warm_vms(key)",
    )


def _v7_warm_loaded(conn: sqlite3.Connection) -> None:
    """Warm VMs hold their state loaded and their passt connected (``passt_pid``),
    forwarding host ports reserved for them (``forwards``: JSON ``[[host, guest], ...]``;
    no session's ``ports`` row may take one). The rows of version 6 stand for VMs that
    have neither: dropped (their processes, files and layers are then orphans, which the
    sweep removes)."""
    _run(
        conn,
        "DELETE FROM warm_vms",
        "ALTER TABLE warm_vms ADD COLUMN passt_pid INTEGER",
        "ALTER TABLE warm_vms ADD COLUMN forwards TEXT NOT NULL DEFAULT '[]'",
    )


def _v8_standbys(conn: sqlite3.Connection) -> None:
    """A session's rollback standby (``runtime/restore/standby.py``): a QEMU started ahead, paused
    before any state, that a rollback of ``session_id`` to ``checkpoint_id`` on the machine
    ``key`` loads instead of starting one. ``tag`` names its process and sockets beside the
    session's; ``qemu_pid`` is None until it started."""
    _run(
        conn,
        """CREATE TABLE standbys (
            session_id TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
            checkpoint_id TEXT NOT NULL,
            key TEXT NOT NULL,
            tag TEXT NOT NULL,
            disk_layer TEXT NOT NULL,
            qemu_pid INTEGER,
            created_at TEXT NOT NULL
        )""",
    )


def _v9_purpose_and_expiry(conn: sqlite3.Connection) -> None:
    """One hidden-checkpoint concept and one lifetime concept. A checkpoint's ``kind`` is
    why it exists: ``user`` or one of forkpoint's own (``template``, ``history`` for the
    automatic steps, ``pause``, ``fork``) — the table is rebuilt for its wider CHECK. A
    session's ``on_expiry`` says what its ``expires_at`` does: ``remove`` it or ``pause``
    it. The E2B gateway's own end times, auto-pause flags and internal checkpoints move
    onto these (:func:`~.e2b_schema.migrate_e2b_onto_sessions`)."""
    _run(
        conn,
        "ALTER TABLE sessions ADD COLUMN on_expiry TEXT NOT NULL DEFAULT 'remove' "
        "CHECK (on_expiry IN ('remove', 'pause'))",
        """CREATE TABLE checkpoints_v9 (
            id                TEXT PRIMARY KEY,
            session_id        TEXT NOT NULL,
            name              TEXT UNIQUE,
            kind              TEXT NOT NULL
                              CHECK (kind IN ('user', 'template', 'history', 'pause', 'fork')),
            created_at        TEXT NOT NULL,
            disk_layer        TEXT NOT NULL REFERENCES layers(name),
            parent_checkpoint TEXT REFERENCES checkpoints(id),
            image             TEXT NOT NULL,
            image_hash        TEXT NOT NULL,
            manifest          TEXT NOT NULL DEFAULT '{}',
            size_bytes        INTEGER NOT NULL DEFAULT 0
        )""",
        "INSERT INTO checkpoints_v9 SELECT id, session_id, name, kind, created_at, disk_layer, "
        "parent_checkpoint, image, image_hash, manifest, size_bytes FROM checkpoints",
        "DROP TABLE checkpoints",
        "ALTER TABLE checkpoints_v9 RENAME TO checkpoints",
        "CREATE INDEX checkpoints_session ON checkpoints(session_id)",
        "CREATE INDEX checkpoints_parent ON checkpoints(parent_checkpoint)",
        "CREATE INDEX checkpoints_layer ON checkpoints(disk_layer)",
        "UPDATE checkpoints SET kind = 'history' WHERE id IN "
        "(SELECT checkpoint_id FROM history_steps WHERE automatic = 1)",
    )
    migrate_e2b_onto_sessions(conn)


def _v10_metrics(conn: sqlite3.Connection) -> None:
    """A running session's use sampled every few seconds (``store/metrics.py``), gone with
    the session; kept an hour."""
    _run(
        conn,
        """CREATE TABLE metrics (
            session_id   TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            at           TEXT NOT NULL,
            cpu_count    INTEGER NOT NULL,
            cpu_used_pct REAL NOT NULL,
            mem_used     INTEGER NOT NULL,
            mem_total    INTEGER NOT NULL,
            mem_cache    INTEGER NOT NULL,
            disk_used    INTEGER NOT NULL,
            disk_total   INTEGER NOT NULL,
            PRIMARY KEY (session_id, at)
        ) WITHOUT ROWID""",
        "CREATE INDEX metrics_at ON metrics(at)",
    )


def _v13_events(conn: sqlite3.Connection) -> None:
    """What happened to sessions, in order (``store/events.py``); no foreign key: an
    event outlives its session."""
    _run(
        conn,
        """CREATE TABLE events (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            at            TEXT NOT NULL,
            kind          TEXT NOT NULL,
            session_id    TEXT NOT NULL,
            checkpoint_id TEXT,
            detail        TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX events_session ON events(session_id, id)",
    )


def _v14_filesystem_pause(conn: sqlite3.Connection) -> None:
    """A pause may keep only a session's disk: ``pause_memory`` says whether a pause at its
    expiry keeps its memory, ``paused_on_disk`` that it was paused so (it resumes by
    booting from its disk)."""
    _run(
        conn,
        "ALTER TABLE sessions ADD COLUMN pause_memory INTEGER NOT NULL DEFAULT 1 "
        "CHECK (pause_memory IN (0, 1))",
        "ALTER TABLE sessions ADD COLUMN paused_on_disk INTEGER NOT NULL DEFAULT 0 "
        "CHECK (paused_on_disk IN (0, 1))",
    )


def _v16_volumes(conn: sqlite3.Connection) -> None:
    """Volumes (``store/volumes.py``): directories that outlive sessions; ``token`` is the
    E2B content API's credential for one; ``volume_mounts`` where each session's guest has
    them (a volume in use cannot be removed)."""
    _run(
        conn,
        """CREATE TABLE volumes (
            id         TEXT PRIMARY KEY,
            name       TEXT NOT NULL UNIQUE,
            token      TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE volume_mounts (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            path       TEXT NOT NULL,
            volume_id  TEXT NOT NULL REFERENCES volumes(id),
            PRIMARY KEY (session_id, path)
        ) WITHOUT ROWID""",
        "CREATE INDEX volume_mounts_volume ON volume_mounts(volume_id)",
    )


MIGRATIONS: tuple[Migration, ...] = (
    _v1_core,
    _v2_templates,
    migrate_e2b,
    _v4_jail,
    _v5_history,
    _v6_warm,
    _v7_warm_loaded,
    _v8_standbys,
    _v9_purpose_and_expiry,
    _v10_metrics,
    migrate_e2b_traffic_and_resume,
    migrate_e2b_host_mask,
    _v13_events,
    _v14_filesystem_pause,
    migrate_e2b_templates,
    _v16_volumes,
)
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    """The database's schema version (0 for a brand-new file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _refuse_newer(current: int, target: int, where: str) -> None:
    if current > target:
        raise Conflict(
            f"metadata database {where} has schema version {current}, but this forkpoint "
            f"only knows up to version {target}: upgrade forkpoint (or use another "
            "FORKPOINT_HOME)"
        )


def migrate(
    conn: sqlite3.Connection, migrations: Sequence[Migration] = MIGRATIONS, *, where: str = ""
) -> int:
    """Bring the database up to ``len(migrations)``; return the version before.

    ``conn`` must be in autocommit mode (``isolation_level=None``) and not in a
    transaction. Safe to call from several processes at once: the version is read again
    under the write lock, so each migration runs exactly once.

    Raises:
        Conflict: the database is newer than ``migrations`` knows.
        InternalError: a migration left foreign keys inconsistent (nothing committed).
    """
    target = len(migrations)
    current = schema_version(conn)
    _refuse_newer(current, target, where)
    if current == target:
        return current  # the common case: no write lock taken
    conn.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction, so set it first
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)  # another process may have migrated meanwhile
            _refuse_newer(current, target, where)
            for version in range(current, target):
                migrations[version](conn)
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise InternalError(
                    f"schema migration {current}->{target} broke foreign keys: {broken[:3]}"
                )
            conn.execute(f"PRAGMA user_version = {int(target)}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.execute("PRAGMA foreign_keys = ON")
    return current
