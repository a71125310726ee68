"""Volumes (the ``volumes`` table): a name, an id and the E2B content API's token each;
their files live under ``Home.volumes``."""

from __future__ import annotations

import dataclasses
import secrets
import sqlite3
from collections.abc import Iterable

from forkpoint.errors import Conflict, InUse, NotFound
from forkpoint.models import Volume

from .db import Store
from .models import utc_now

__all__ = ["VolumesStore"]

_COLUMNS = "id, name, created_at, token"


def _volume(row: tuple[str, str, str, str]) -> Volume:
    return Volume(id=row[0], name=row[1], created_at=row[2], token=row[3])


class VolumesStore:
    """Volume rows, in the runtime's :class:`Store` (same database, same locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, name: str) -> Volume:
        """A new volume called ``name`` (a name in use is a :class:`Conflict`)."""
        volume = Volume(
            id="v-" + secrets.token_hex(5), name=name, created_at=utc_now(),
            token="fpv_" + secrets.token_urlsafe(24),
        )  # fmt: skip
        try:
            with self.store.transaction() as conn:
                conn.execute(
                    f"INSERT INTO volumes ({_COLUMNS}) VALUES (?, ?, ?, ?)",
                    (volume.id, volume.name, volume.created_at, volume.token),
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"a volume named {name!r} exists already") from None
        return volume

    def all(self) -> list[Volume]:
        """Every volume, oldest first, with its mounts."""
        with self.store.transaction() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM volumes ORDER BY created_at, id")
            volumes = [_volume(row) for row in rows.fetchall()]
            mounts: dict[str, list[str]] = {}
            for volume_id, session_id, path in conn.execute(
                "SELECT volume_id, session_id, path FROM volume_mounts ORDER BY session_id, path"
            ):
                mounts.setdefault(volume_id, []).append(f"{session_id}:{path}")
        return [dataclasses.replace(v, mounts=tuple(mounts.get(v.id, ()))) for v in volumes]

    def get(self, ref: str) -> Volume:
        """The volume with id or name ``ref``."""
        with self.store.transaction() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM volumes WHERE id = ? OR name = ? ORDER BY id = ? DESC",
                (ref, ref, ref),
            ).fetchone()
            if row is None:
                raise NotFound(f"no volume {ref!r}")
            mounts = conn.execute(
                "SELECT session_id || ':' || path FROM volume_mounts WHERE volume_id = ? "
                "ORDER BY session_id, path", (row[0],),
            ).fetchall()  # fmt: skip
        return dataclasses.replace(_volume(row), mounts=tuple(m[0] for m in mounts))

    def remove(self, volume_id: str) -> None:
        """Forget the volume. :raises InUse: a session has it mounted."""
        with self.store.transaction() as conn:
            users = [row[0] for row in conn.execute(
                "SELECT DISTINCT session_id FROM volume_mounts WHERE volume_id = ? "
                "ORDER BY session_id", (volume_id,),
            )]  # fmt: skip
            if users:
                raise InUse(f"volume {volume_id} is mounted by session(s) {', '.join(users)}")
            conn.execute("DELETE FROM volumes WHERE id = ?", (volume_id,))

    def set_mounts(self, session_id: str, mounts: Iterable[tuple[str, str]]) -> None:
        """Record that ``session_id``'s guest has ``mounts`` (``(volume id, path)``); a
        volume removed meanwhile is left out (its mount serves nothing)."""
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM volume_mounts WHERE session_id = ?", (session_id,))
            conn.executemany(
                "INSERT INTO volume_mounts (session_id, path, volume_id) SELECT ?, ?, ? "
                "WHERE EXISTS (SELECT 1 FROM volumes WHERE id = ?)",
                [(session_id, at, vol, vol) for vol, at in mounts],
            )

    def mounts_of(self, session_id: str) -> tuple[tuple[str, str], ...]:
        """``session_id``'s mounts: ``(volume id, path)`` pairs, by path."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT volume_id, path FROM volume_mounts WHERE session_id = ? ORDER BY path",
                (session_id,),
            ).fetchall()
        return tuple((str(v), str(p)) for v, p in rows)
