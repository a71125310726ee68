"""What happened to sessions (the ``events`` table), in order: the last :data:`KEEP` are
kept; they outlive their sessions."""

from __future__ import annotations

import json
from collections.abc import Iterable

from forkpoint.models import Event, EventKind

from .db import Store
from .models import utc_now

__all__ = ["KEEP", "EventsStore", "NewEvent"]

#: How many events are kept (the oldest go first).
KEEP = 100_000

#: An event before it is stored: kind, session, checkpoint, detail.
NewEvent = tuple[EventKind, str, str | None, dict[str, str]]


class EventsStore:
    """Event rows, in the runtime's :class:`Store` (same database, same locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, events: Iterable[NewEvent]) -> None:
        """Append ``events`` (one transaction, one timestamp) and drop the oldest beyond
        :data:`KEEP`."""
        rows = [(utc_now(), kind.value, s, c, json.dumps(d)) for kind, s, c, d in events]
        if not rows:
            return
        with self.store.transaction() as conn:
            conn.executemany(
                "INSERT INTO events (at, kind, session_id, checkpoint_id, detail) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            conn.execute("DELETE FROM events WHERE id <= (SELECT max(id) FROM events) - ?", (KEEP,))

    def after(self, after: int, session_id: str | None, limit: int) -> list[Event]:
        """The first ``limit`` events with an id above ``after`` (of ``session_id`` only,
        if given), oldest first."""
        return self._select("id > ?", (after,), session_id, "id", limit)

    def last(self, count: int, session_id: str | None) -> list[Event]:
        """The last ``count`` events (of ``session_id`` only, if given), oldest first."""
        return self._select("1", (), session_id, "id DESC", count)[::-1]

    def _select(
        self, where: str, args: tuple[object, ...], session_id: str | None, order: str, limit: int
    ) -> list[Event]:
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT id, at, kind, session_id, checkpoint_id, detail FROM events "
                f"WHERE {where} AND (? IS NULL OR session_id = ?) ORDER BY {order} LIMIT ?",
                (*args, session_id, session_id, limit),
            ).fetchall()
        return [
            Event(id=r[0], at=r[1], kind=EventKind(r[2]), session=r[3], checkpoint=r[4],
                  detail=json.loads(r[5]))
            for r in rows
        ]  # fmt: skip
