"""The metadata store: one SQLite database (WAL) per ``$FORKPOINT_HOME``, the source of truth.

Several processes (CLIs, a server) use the same database at once. Every write is one
short ``BEGIN IMMEDIATE`` transaction; waits for another writer are bounded by the busy
timeout. One ``Store`` holds one connection, shared by threads under a lock.

Group several writes atomically with ``with store.transaction(): ...``; keep such blocks
short (never hold one across QEMU work: other processes wait on it).
"""

from __future__ import annotations

import enum
import json
import sqlite3
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Final

from forkpoint.config import Home
from forkpoint.errors import (
    Conflict,
    InternalError,
    InUse,
    InvalidInput,
    LimitExceeded,
    NotFound,
)
from forkpoint.models import JAIL_HOME_BLOCKS, JAIL_UID_BASE, JAIL_UIDS
from forkpoint.polling import poll_until_sync
from forkpoint.store._rows import (
    CHECKPOINT_COLUMNS,
    SESSION_COLUMNS,
    SESSION_UPDATERS,
    check_int,
    check_layer_name,
    check_port,
    check_str,
    checkpoint_from_row,
    describe_dependents,
    egress_json,
    enum_value,
    kind_value,
    opt_pid,
    pids_json,
    ports_of,
    require_absent,
    require_checkpoint,
    require_layer,
    require_name_free,
    session_from_row,
)
from forkpoint.store.models import (
    CheckpointKind,
    CheckpointRecord,
    Expiry,
    LayerRecord,
    Network,
    PortForward,
    SessionRecord,
    SessionState,
    TemplateRecord,
    utc_now,
    validate_name,
)
from forkpoint.store.schema import MIGRATIONS, migrate, schema_version

__all__ = ["DEFAULT_BUSY_TIMEOUT_S", "KEEP", "Keep", "Store"]

DEFAULT_BUSY_TIMEOUT_S = 10.0


class Keep(enum.Enum):
    """Marks an :meth:`Store.update_session` field left as it is (None is a value)."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP


class Store:
    """Metadata of sessions, checkpoints, disk layers and templates.

    Open with :meth:`Store.open`; use as a context manager (or call :meth:`close`).
    Methods are thread-safe. Lookups raise ``NotFound``; uniqueness violations raise
    ``Conflict``; removing something still depended on raises ``InUse``; malformed
    values raise ``InvalidInput``. A failed call changes nothing.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        """Wrap an open, migrated connection; use :meth:`Store.open` instead."""
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.RLock()
        self._writing = False
        self.path = path
        self.uids = session_uids(path.parent)

    # --- lifecycle ---------------------------------------------------------------------

    @classmethod
    def open(cls, home: Home, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Store:
        """Open (creating directories and the database if needed) and migrate.

        Raises:
            Conflict: the database was written by a newer forkpoint.
        """
        home.ensure()
        path = home.db
        conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            _enable_wal(conn, busy_timeout_s)
            # FULL: a committed checkpoint/session survives a power cut, not just a crash.
            conn.execute("PRAGMA synchronous = FULL")
            migrate(conn, MIGRATIONS, where=str(path))
            conn.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            conn.close()
            raise
        store = cls(conn, path)
        store._give_uids()
        return store

    def _give_uids(self) -> None:
        """A uid for each session stored before sessions had one (schema v4)."""
        with self._read() as conn:
            missing = conn.execute("SELECT id FROM sessions WHERE uid IS NULL").fetchall()
        for (session_id,) in missing:
            with self.transaction() as conn:
                conn.execute(
                    "UPDATE sessions SET uid = ? WHERE id = ? AND uid IS NULL",
                    (free_uid(conn, self.uids), session_id),
                )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The database's schema version (``PRAGMA user_version``)."""
        with self._read() as conn:
            return schema_version(conn)

    # --- transactions ------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise InternalError("the metadata store is closed")
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write transaction (``BEGIN IMMEDIATE``); store calls inside join it.

        Commits when the block exits normally, rolls back on any exception. Other
        threads of this process wait; other processes wait up to the busy timeout.
        """
        with self._lock:
            conn = self._connection()
            if self._writing:
                yield conn  # nested: part of the outer transaction
                return
            if conn.in_transaction:
                raise InternalError("store bug: write requested inside a read snapshot")
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise InternalError(f"metadata database {self.path} is busy: {exc}") from exc
            self._writing = True
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if _is_full(exc):  # found by the fault campaign: was a bare OperationalError
                    raise InternalError(
                        f"cannot write the metadata database {self.path}: the disk is full"
                    ) from exc
                raise
            finally:
                self._writing = False

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot (or the enclosing transaction)."""
        with self._lock:
            conn = self._connection()
            if conn.in_transaction:
                yield conn
                return
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    # --- sessions ----------------------------------------------------------------------

    def insert_session(
        self, record: SessionRecord, *, max_active: int | None = None
    ) -> SessionRecord:
        """Store a new session and its ports; return it as stored.

        ``max_active``: refuse when that many sessions are already creating or running —
        counted in the same write transaction as the insert, so two racing creates
        cannot both pass.

        Raises:
            LimitExceeded: ``max_active`` sessions are active already.
            Conflict: the id or name is taken, or a host port is allocated.
            NotFound: ``disk_layer`` or ``parent_checkpoint`` is unknown.
            InvalidInput: a malformed field.
        """
        validate_name(record.name, "session")
        with self.transaction() as conn:
            require_absent(conn, "sessions", "id", record.id, f"session id {record.id}")
            if max_active is not None:
                require_below(conn, max_active)
            if record.name is not None:
                require_name_free(conn, "sessions", "session", record.name)
            require_layer(conn, record.disk_layer)
            require_checkpoint(conn, record.parent_checkpoint)
            conn.execute(
                f"INSERT INTO sessions ({SESSION_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.name,
                    check_str(record.image, "image"),
                    check_str(record.image_hash, "image_hash"),
                    enum_value(SessionState, record.state, "state"),
                    record.created_at,
                    record.parent_checkpoint,
                    check_int(record.memory_mib, "memory_mib", minimum=1),
                    check_int(record.cpus, "cpus", minimum=1),
                    enum_value(Network, record.network, "network"),
                    record.disk_layer,
                    check_int(record.generation, "generation", minimum=0),
                    opt_pid(record.qemu_pid),
                    pids_json(record.aux_pids),
                    record.uid if record.uid is not None else free_uid(conn, self.uids),
                    SESSION_UPDATERS["disk_mib"](record.disk_mib),
                    SESSION_UPDATERS["expires_at"](record.expires_at),
                    egress_json(record.egress),
                    SESSION_UPDATERS["on_expiry"](record.on_expiry),
                    int(record.pause_memory),
                    int(record.paused_on_disk),
                ),
            )
            for port in record.ports:
                self.add_port(record.id, port.guest_port, port.host_port)
            return self.get_session(record.id)

    def get_session(self, id_or_name: str) -> SessionRecord:
        """The session with this id or name.

        Raises:
            NotFound: ``unknown session: X``.
        """
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ? OR name = ? "
                "ORDER BY id = ? DESC LIMIT 1",
                (id_or_name, id_or_name, id_or_name),
            ).fetchone()
            if row is None:
                raise NotFound(f"unknown session: {id_or_name}")
            return session_from_row(row, ports_of(conn, row["id"]))

    def list_sessions(self) -> list[SessionRecord]:
        """All sessions, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY created_at, rowid"
            ).fetchall()
            ports: dict[str, list[PortForward]] = {}
            for p in conn.execute(
                "SELECT session_id, guest_port, host_port FROM ports ORDER BY guest_port"
            ):
                ports.setdefault(p["session_id"], []).append(
                    PortForward(p["guest_port"], p["host_port"])
                )
            return [session_from_row(row, ports.get(row["id"], [])) for row in rows]

    def update_session(
        self,
        session_id: str,
        *,
        name: str | None | Keep = KEEP,
        image: str | Keep = KEEP,
        image_hash: str | Keep = KEEP,
        state: SessionState | Keep = KEEP,
        parent_checkpoint: str | None | Keep = KEEP,
        memory_mib: int | Keep = KEEP,
        cpus: int | Keep = KEEP,
        network: Network | Keep = KEEP,
        disk_layer: str | Keep = KEEP,
        generation: int | Keep = KEEP,
        qemu_pid: int | None | Keep = KEEP,
        aux_pids: Sequence[int] | Keep = KEEP,
        disk_mib: int | None | Keep = KEEP,
        expires_at: str | None | Keep = KEEP,
        egress: Mapping[str, object] | Keep = KEEP,
        on_expiry: Expiry | Keep = KEEP,
        pause_memory: bool | Keep = KEEP,
        paused_on_disk: bool | Keep = KEEP,
    ) -> SessionRecord:
        """Change the fields given (the others keep their values); return the new record.

        For a read-modify-write (e.g. ``generation + 1``) wrap the read and this call in
        :meth:`transaction`.

        Raises:
            NotFound: unknown session, or an unknown ``disk_layer``/``parent_checkpoint``.
            InvalidInput: a malformed value.
            Conflict: the new name is taken.
        """
        given: dict[str, object] = {
            "name": name, "image": image, "image_hash": image_hash, "state": state,
            "parent_checkpoint": parent_checkpoint, "memory_mib": memory_mib, "cpus": cpus,
            "network": network, "disk_layer": disk_layer, "generation": generation,
            "qemu_pid": qemu_pid, "aux_pids": aux_pids, "disk_mib": disk_mib,
            "expires_at": expires_at, "egress": egress, "on_expiry": on_expiry,
            "pause_memory": pause_memory, "paused_on_disk": paused_on_disk,
        }  # fmt: skip
        fields = {key: value for key, value in given.items() if value is not KEEP}
        values = {key: SESSION_UPDATERS[key](value) for key, value in fields.items()}
        with self.transaction() as conn:
            current = self.get_session(session_id)
            new_name = values.get("name")
            if isinstance(new_name, str) and new_name != current.name:
                require_name_free(conn, "sessions", "session", new_name)
            if "disk_layer" in values:
                require_layer(conn, str(values["disk_layer"]))
            if values.get("parent_checkpoint") is not None:
                require_checkpoint(conn, str(values["parent_checkpoint"]))
            if values:
                assignments = ", ".join(f"{key} = ?" for key in values)
                conn.execute(
                    f"UPDATE sessions SET {assignments} WHERE id = ?",
                    (*values.values(), current.id),
                )
            return self.get_session(current.id)

    def delete_session(self, session_id: str) -> None:
        """Forget a session and its port forwards (its checkpoints stay).

        Its disk layer becomes garbage once nothing else references it
        (see :meth:`unreferenced_layers`).

        Raises:
            NotFound: unknown session.
        """
        with self.transaction() as conn:
            current = self.get_session(session_id)
            conn.execute("DELETE FROM sessions WHERE id = ?", (current.id,))

    # --- ports -------------------------------------------------------------------------

    def add_port(self, session_id: str, guest_port: int, host_port: int) -> PortForward:
        """Record that ``127.0.0.1:host_port`` forwards to the session's ``guest_port``.

        Raises:
            NotFound: unknown session.
            Conflict: the host port is allocated, or the guest port is already forwarded.
            InvalidInput: a port outside 1-65535.
        """
        guest = check_port(guest_port, "guest_port")
        host = check_port(host_port, "host_port")
        with self.transaction() as conn:
            sid = self.get_session(session_id).id
            owner = conn.execute(
                "SELECT session_id FROM ports WHERE host_port = ?", (host,)
            ).fetchone()
            if owner is not None:
                raise Conflict(f"host port {host} is already allocated to session {owner[0]}")
            existing = conn.execute(
                "SELECT host_port FROM ports WHERE session_id = ? AND guest_port = ?",
                (sid, guest),
            ).fetchone()
            if existing is not None:
                raise Conflict(
                    f"guest port {guest} of session {sid} is already forwarded "
                    f"to host port {existing[0]}"
                )
            conn.execute(
                "INSERT INTO ports (session_id, guest_port, host_port) VALUES (?, ?, ?)",
                (sid, guest, host),
            )
            return PortForward(guest, host)

    def remove_ports(self, session_id: str) -> list[PortForward]:
        """Drop all of the session's forwards; return what was dropped.

        Raises:
            NotFound: unknown session.
        """
        with self.transaction() as conn:
            current = self.get_session(session_id)
            conn.execute("DELETE FROM ports WHERE session_id = ?", (current.id,))
            return list(current.ports)

    def allocated_host_ports(self) -> set[int]:
        """Every host port recorded for any session or reserved for a warm VM."""
        with self._read() as conn:
            ports = {row[0] for row in conn.execute("SELECT host_port FROM ports")}
            for (forwards,) in conn.execute("SELECT forwards FROM warm_vms"):
                ports.update(host for host, _ in json.loads(forwards))
        return ports

    # --- checkpoints -------------------------------------------------------------------

    def insert_checkpoint(self, record: CheckpointRecord) -> CheckpointRecord:
        """Store a new checkpoint; return it as stored.

        Raises:
            Conflict: the id or name is taken.
            NotFound: ``disk_layer`` or ``parent_checkpoint`` is unknown.
            InvalidInput: a malformed field.
        """
        validate_name(record.name, "checkpoint")
        try:
            kind = CheckpointKind(record.kind).value
            manifest = json.dumps(record.manifest, sort_keys=True)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"invalid checkpoint record: {exc}") from exc
        with self.transaction() as conn:
            require_absent(conn, "checkpoints", "id", record.id, f"checkpoint id {record.id}")
            if record.name is not None:
                require_name_free(conn, "checkpoints", "checkpoint", record.name)
            require_layer(conn, record.disk_layer)
            require_checkpoint(conn, record.parent_checkpoint)
            conn.execute(
                f"INSERT INTO checkpoints ({CHECKPOINT_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    check_str(record.session_id, "session_id"),
                    record.name,
                    kind,
                    record.created_at,
                    record.disk_layer,
                    record.parent_checkpoint,
                    check_str(record.image, "image"),
                    check_str(record.image_hash, "image_hash"),
                    manifest,
                    check_int(record.size_bytes, "size_bytes", minimum=0),
                ),
            )
            return self.get_checkpoint(record.id)

    def get_checkpoint(self, id_or_name: str) -> CheckpointRecord:
        """The checkpoint with this id or name.

        Raises:
            NotFound: ``unknown checkpoint: X``.
        """
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE id = ? OR name = ? "
                "ORDER BY id = ? DESC LIMIT 1",
                (id_or_name, id_or_name, id_or_name),
            ).fetchone()
            if row is None:
                raise NotFound(f"unknown checkpoint: {id_or_name}")
            return checkpoint_from_row(row)

    def list_checkpoints(
        self,
        session_id: str | None = None,
        kind: CheckpointKind | str | Sequence[CheckpointKind] | None = None,
    ) -> list[CheckpointRecord]:
        """Checkpoints, oldest first, optionally of one session and/or of one kind (or of
        any of several)."""
        where: list[str] = []
        args: list[str] = []
        if session_id is not None:
            where.append("session_id = ?")
            args.append(session_id)
        if kind is not None:
            kinds = [kind] if isinstance(kind, str) else list(kind)
            where.append(f"kind IN ({', '.join('?' * len(kinds))})")
            args.extend(kind_value(k) for k in kinds)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints{clause} ORDER BY created_at, rowid",
                args,
            ).fetchall()
            return [checkpoint_from_row(row) for row in rows]

    def checkpoint_dependents(self, checkpoint_id: str) -> list[str]:
        """Ids of the sessions and checkpoints that still need this checkpoint, sorted.

        That is: sessions started from (or last rolled back to) it — it is their default
        rollback target — and checkpoints descending from it (their lineage). Disk layers
        are not a reason: a frozen layer outlives its checkpoint for as long as any layer
        stacked on it exists (see :meth:`unreferenced_layers`).

        Raises:
            NotFound: unknown checkpoint.
        """
        with self._read() as conn:
            ck = self.get_checkpoint(checkpoint_id)
            rows = conn.execute(
                """
                SELECT id FROM sessions WHERE parent_checkpoint = :ck
                UNION
                SELECT id FROM checkpoints WHERE id != :ck AND parent_checkpoint = :ck
                ORDER BY id
                """,
                {"ck": ck.id},
            ).fetchall()
            return [row[0] for row in rows]

    def delete_checkpoint(self, checkpoint_id: str) -> CheckpointRecord:
        """Forget a checkpoint (and any template mapping to it); return what was deleted.

        Its disk layer becomes garbage once nothing else references it.

        Raises:
            NotFound: unknown checkpoint.
            InUse: sessions or checkpoints still depend on it (they are named).
        """
        with self.transaction() as conn:
            ck = self.get_checkpoint(checkpoint_id)
            dependents = self.checkpoint_dependents(ck.id)
            if dependents:
                raise InUse(f"checkpoint {ck.id} is in use by {describe_dependents(dependents)}")
            conn.execute("DELETE FROM checkpoints WHERE id = ?", (ck.id,))
            return ck

    # --- layers ------------------------------------------------------------------------

    def insert_layer(self, name: str, backing: str | None = None) -> LayerRecord:
        """Record a qcow2 layer file (``Home.layers / name``) backed by ``backing``.

        Raises:
            Conflict: a layer of that name exists.
            NotFound: the backing layer is unknown.
            InvalidInput: the name is not a plain file name.
        """
        check_layer_name(name)
        record = LayerRecord(name=name, backing=backing, created_at=utc_now())
        with self.transaction() as conn:
            require_absent(conn, "layers", "name", name, f"layer {name}")
            if backing is not None:
                require_layer(conn, backing)
            conn.execute(
                "INSERT INTO layers (name, backing, created_at) VALUES (?, ?, ?)",
                (record.name, record.backing, record.created_at),
            )
            return record

    def get_layer(self, name: str) -> LayerRecord:
        """The layer called ``name``.

        Raises:
            NotFound: ``unknown layer: X``.
        """
        with self._read() as conn:
            row = conn.execute(
                "SELECT name, backing, created_at FROM layers WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                raise NotFound(f"unknown layer: {name}")
            return LayerRecord(row["name"], row["backing"], row["created_at"])

    def layer_chain(self, name: str) -> list[str]:
        """``name`` followed by its backing layers, down to the root.

        Raises:
            NotFound: unknown layer.
        """
        with self._read() as conn:
            self.get_layer(name)
            rows = conn.execute(
                """
                WITH RECURSIVE chain(name, backing, depth) AS (
                    SELECT name, backing, 0 FROM layers WHERE name = ?
                    UNION ALL
                    SELECT layers.name, layers.backing, chain.depth + 1
                      FROM layers JOIN chain ON layers.name = chain.backing
                )
                SELECT name FROM chain ORDER BY depth
                """,
                (name,),
            ).fetchall()
            return [row[0] for row in rows]

    def unreferenced_layers(self) -> list[str]:
        """Layers no session, checkpoint or other layer refers to (sorted).

        Garbage collection deletes each one (:meth:`delete_layer` first, then the
        file) and asks again until this is empty: deleting a layer can free its backing.
        """
        with self._read() as conn:
            rows = conn.execute(
                """
                SELECT name FROM layers AS l
                 WHERE NOT EXISTS (SELECT 1 FROM sessions WHERE disk_layer = l.name)
                   AND NOT EXISTS (SELECT 1 FROM checkpoints WHERE disk_layer = l.name)
                   AND NOT EXISTS (SELECT 1 FROM layers AS up WHERE up.backing = l.name)
                 ORDER BY name
                """
            ).fetchall()
            return [row[0] for row in rows]

    def layer_names(self) -> set[str]:
        """The name of every recorded layer."""
        with self._read() as conn:
            return {row[0] for row in conn.execute("SELECT name FROM layers")}

    def delete_layer(self, name: str) -> None:
        """Forget a layer. Delete its file only after this succeeded.

        Raises:
            NotFound: unknown layer.
            InUse: a session, checkpoint or layer still refers to it.
        """
        with self.transaction() as conn:
            self.get_layer(name)
            users = [
                f"{what} {row[0]}"
                for what, sql in (
                    ("session", "SELECT id FROM sessions WHERE disk_layer = ?"),
                    ("checkpoint", "SELECT id FROM checkpoints WHERE disk_layer = ?"),
                    ("layer", "SELECT name FROM layers WHERE backing = ?"),
                )
                for row in conn.execute(sql, (name,))
            ]
            if users:
                raise InUse(f"layer {name} is in use by {', '.join(users)}")
            conn.execute("DELETE FROM layers WHERE name = ?", (name,))

    # --- templates ---------------------------------------------------------------------

    def get_template(self, image_hash: str, machine_key: str) -> str | None:
        """The template checkpoint id for this image and machine shape, if any."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT checkpoint_id FROM templates WHERE image_hash = ? AND machine_key = ?",
                (image_hash, machine_key),
            ).fetchone()
            return None if row is None else str(row[0])

    def set_template(self, image_hash: str, machine_key: str, checkpoint_id: str) -> None:
        """Make ``checkpoint_id`` the template for this image and machine shape (replaces).

        Raises:
            NotFound: unknown checkpoint.
        """
        with self.transaction() as conn:
            ck = self.get_checkpoint(checkpoint_id)
            conn.execute(
                "INSERT INTO templates (image_hash, machine_key, checkpoint_id, created_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (image_hash, machine_key) DO UPDATE SET "
                "checkpoint_id = excluded.checkpoint_id, created_at = excluded.created_at",
                (
                    check_str(image_hash, "image_hash"),
                    check_str(machine_key, "machine_key"),
                    ck.id,
                    utc_now(),
                ),
            )

    def delete_template(self, image_hash: str, machine_key: str) -> None:
        """Forget the template mapping (the checkpoint itself stays).

        Raises:
            NotFound: no template for this image and machine shape.
        """
        with self.transaction() as conn:
            cursor = conn.execute(
                "DELETE FROM templates WHERE image_hash = ? AND machine_key = ?",
                (image_hash, machine_key),
            )
            if cursor.rowcount == 0:
                raise NotFound(f"no template for image {image_hash} on machine {machine_key}")

    def list_templates(self) -> list[TemplateRecord]:
        """All template mappings, by image hash and machine key."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT image_hash, machine_key, checkpoint_id, created_at FROM templates "
                "ORDER BY image_hash, machine_key"
            ).fetchall()
            return [TemplateRecord(*row) for row in rows]


# --- helpers -----------------------------------------------------------------------------


def require_below(conn: sqlite3.Connection, max_active: int) -> None:
    """:raises LimitExceeded: ``max_active`` sessions are creating or running."""
    (active,) = conn.execute(
        "SELECT COUNT(*) FROM sessions WHERE state IN (?, ?)",
        (SessionState.CREATING.value, SessionState.RUNNING.value),
    ).fetchone()
    if active >= max_active:
        raise LimitExceeded(
            f"{active} sessions are running, the most allowed (FORKPOINT_MAX_SESSIONS="
            f"{max_active}): remove or stop one first"
        )


def session_uids(root: Path) -> range:
    """The uids the sessions of the home at ``root`` run as (see ``JAIL_UID_BASE``)."""
    block = 1 + zlib.crc32(str(root).encode()) % JAIL_HOME_BLOCKS
    first = JAIL_UID_BASE + block * JAIL_UIDS
    return range(first, first + JAIL_UIDS)


def free_uid(conn: sqlite3.Connection, uids: range) -> int:
    """The lowest of ``uids`` no stored session or warm VM has.

    :raises Conflict: every one is taken.
    """
    taken = {
        row[0]
        for row in conn.execute(
            "SELECT uid FROM sessions WHERE uid IS NOT NULL UNION SELECT uid FROM warm_vms"
        )
    }
    for uid in uids:
        if uid not in taken:
            return uid
    raise Conflict(f"all {len(uids)} session uids are in use: remove sessions")


def _enable_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    # Switching a fresh database to WAL needs an exclusive lock, and SQLite does not
    # always apply the busy handler to it: retry while another process opens it too.
    failure: sqlite3.OperationalError | None = None

    def switch() -> str | None:
        nonlocal failure
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise InternalError(f"cannot open the metadata database: {exc}") from exc
            failure = exc
            return None

    mode = poll_until_sync(
        switch,
        timeout_s=timeout_s,
        timed_out=lambda: InternalError(f"cannot open the metadata database: {failure}"),
        interval_s=0.01,
    )
    if mode.lower() != "wal":
        raise InternalError(f"the metadata database cannot use WAL (mode: {mode})")


def _is_full(error: BaseException) -> bool:
    """SQLite could not write for want of space (SQLITE_FULL)."""
    return isinstance(error, sqlite3.Error) and (
        getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
        or "disk is full" in str(error)
    )
