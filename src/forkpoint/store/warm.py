"""Warm VMs (the ``warm_vms`` table): QEMU processes started before a create asks.

A row exists before its QEMU does (a filler killed in between leaves a row without a live
process, which the pool discards), and leaves the table in the transaction that hands it
to a create: two creates never take the same VM, and no session gets a warm VM's uid.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from .db import Store, free_uid
from .models import new_session_id, utc_now

__all__ = ["WarmRecord", "WarmStore"]


@dataclass(frozen=True)
class WarmRecord:
    id: str  # the session id it becomes
    uid: int
    checkpoint_id: str
    key: str
    disk_layer: str
    qemu_pid: int | None  # None until it started (and had its state loaded)
    created_at: str
    passt_pid: int | None = None  # its network helper, connected (None: no network)
    forwards: tuple[tuple[int, int], ...] = ()  # (host, guest) ports its passt forwards

    @property
    def aux_pids(self) -> list[int]:
        """Its passt, as ``SessionRecord.aux_pids`` (what it becomes)."""
        return [self.passt_pid] if self.passt_pid else []

    @property
    def pids(self) -> set[int]:
        return {p for p in (self.qemu_pid, *self.aux_pids) if p}


_COLUMNS = "id, uid, checkpoint_id, key, disk_layer, qemu_pid, created_at, passt_pid, forwards"


class WarmStore:
    """Warm VM rows, in the runtime's :class:`Store` (same database, same locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def reserve(
        self,
        checkpoint_id: str,
        key: str,
        disk_layer: str,
        forwards: tuple[tuple[int, int], ...] = (),
    ) -> WarmRecord:
        """A new row: a fresh session id, a uid no session or warm VM has, and the host
        ports of ``forwards`` (chosen free under the home's ``ports`` lock, held by the
        caller) reserved."""
        with self.store.transaction() as conn:
            record = WarmRecord(
                id=new_session_id(), uid=free_uid(conn, self.store.uids),
                checkpoint_id=checkpoint_id, key=key, disk_layer=disk_layer, qemu_pid=None,
                created_at=utc_now(), forwards=forwards,
            )  # fmt: skip
            conn.execute(
                f"INSERT INTO warm_vms ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.id, record.uid, record.checkpoint_id, record.key, record.disk_layer,
                 None, record.created_at, None, json.dumps(forwards)),
            )  # fmt: skip
        return record

    def set_started(self, warm_id: str, qemu_pid: int, passt_pid: int | None) -> None:
        """The VM is loaded (and connected): from now on it can be taken."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE warm_vms SET qemu_pid = ?, passt_pid = ? WHERE id = ?",
                (qemu_pid, passt_pid, warm_id),
            )

    def take(self, key: str) -> WarmRecord | None:
        """Remove and return the oldest started VM of ``key`` (None: there is none)."""
        with self.store.transaction() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM warm_vms WHERE key = ? AND qemu_pid IS NOT NULL "
                "ORDER BY created_at, rowid LIMIT 1",
                (key,),
            ).fetchone()
            if row is None:
                return None
            conn.execute("DELETE FROM warm_vms WHERE id = ?", (row["id"],))
        return _record(row)

    def remove(self, warm_id: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM warm_vms WHERE id = ?", (warm_id,))

    def all(self) -> list[WarmRecord]:
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM warm_vms ORDER BY created_at, rowid"
            ).fetchall()
        return [_record(row) for row in rows]


def _record(row: sqlite3.Row) -> WarmRecord:
    return WarmRecord(
        id=row["id"], uid=int(row["uid"]), checkpoint_id=row["checkpoint_id"], key=row["key"],
        disk_layer=row["disk_layer"], qemu_pid=row["qemu_pid"], created_at=row["created_at"],
        passt_pid=row["passt_pid"],
        forwards=tuple((int(host), int(guest)) for host, guest in json.loads(row["forwards"])),
    )  # fmt: skip
