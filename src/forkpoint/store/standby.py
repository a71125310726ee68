"""Rollback standbys (the ``standbys`` table): one QEMU per session started ahead.

A row exists before its QEMU does (a starter killed in between leaves a row without a
live process, discarded when met) and leaves the table in the transaction that hands it
to a rollback, so two rollbacks never load the same process.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from .db import Store
from .models import utc_now

__all__ = ["StandbyRecord", "StandbyStore"]


@dataclass(frozen=True)
class StandbyRecord:
    session_id: str
    checkpoint_id: str  # the checkpoint whose RAM file it maps, on a layer of its disk
    key: str  # the machine it is (shape with its QEMU build, network)
    tag: str  # names its process and sockets (see VmFiles.standby)
    disk_layer: str
    qemu_pid: int | None  # None until it started
    created_at: str


_COLUMNS = "session_id, checkpoint_id, key, tag, disk_layer, qemu_pid, created_at"


class StandbyStore:
    """Standby rows, in the runtime's :class:`Store` (same database, same locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def reserve(self, session_id: str, checkpoint_id: str, key: str, tag: str, layer: str) -> None:
        """The row of a standby about to start; the session must have none."""
        with self.store.transaction() as conn:
            conn.execute(
                f"INSERT INTO standbys ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL, ?)",
                (session_id, checkpoint_id, key, tag, layer, utc_now()),
            )

    def set_started(self, session_id: str, tag: str, qemu_pid: int) -> bool:
        """Record its QEMU; False if the row is gone (discarded while it started)."""
        with self.store.transaction() as conn:
            cursor = conn.execute(
                "UPDATE standbys SET qemu_pid = ? WHERE session_id = ? AND tag = ?",
                (qemu_pid, session_id, tag),
            )
        return cursor.rowcount == 1

    def get(self, session_id: str) -> StandbyRecord | None:
        with self.store.transaction() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM standbys WHERE session_id = ?", (session_id,)
            ).fetchone()
        return None if row is None else _record(row)

    def remove(self, session_id: str, tag: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM standbys WHERE session_id = ? AND tag = ?", (session_id, tag))

    def take(self, session_id: str) -> StandbyRecord | None:
        """Remove and return the session's standby (None: it has none)."""
        with self.store.transaction() as conn:
            if (record := self.get(session_id)) is not None:  # joins this transaction
                conn.execute("DELETE FROM standbys WHERE session_id = ?", (session_id,))
        return record

    def all(self) -> list[StandbyRecord]:
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM standbys ORDER BY created_at, rowid"
            ).fetchall()
        return [_record(row) for row in rows]


def _record(row: sqlite3.Row) -> StandbyRecord:
    return StandbyRecord(
        session_id=row["session_id"], checkpoint_id=row["checkpoint_id"], key=row["key"],
        tag=row["tag"], disk_layer=row["disk_layer"], qemu_pid=row["qemu_pid"],
        created_at=row["created_at"],
    )  # fmt: skip
