"""Sessions' metrics (the ``metrics`` table): one row per running session every few
seconds, removed with the session and after :data:`KEEP_S`."""

from __future__ import annotations

from collections.abc import Iterable

from forkpoint.models import Metric

from .db import Store
from .models import utc_now

__all__ = ["KEEP_S", "MetricsStore"]

#: How long samples are kept (s): an hour at one every 5 s is 720 rows a session.
KEEP_S = 3600.0

_COLUMNS = "at, cpu_count, cpu_used_pct, mem_used, mem_total, mem_cache, disk_used, disk_total"


class MetricsStore:
    """Metric rows, in the runtime's :class:`Store` (same database, same locks)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, samples: Iterable[tuple[str, Metric]]) -> None:
        """Record ``(session id, sample)`` pairs (a session gone meanwhile is skipped) and
        drop what is older than :data:`KEEP_S`, in one transaction."""
        with self.store.transaction() as conn:
            for session_id, m in samples:
                conn.execute(
                    f"INSERT OR REPLACE INTO metrics (session_id, {_COLUMNS}) "
                    "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS "
                    "(SELECT 1 FROM sessions WHERE id = ?)",
                    (session_id, m.at, m.cpu_count, m.cpu_used_pct, m.mem_used, m.mem_total,
                     m.mem_cache, m.disk_used, m.disk_total, session_id),
                )  # fmt: skip
            conn.execute("DELETE FROM metrics WHERE at < ?", (utc_now(KEEP_S),))

    def latest(self) -> dict[str, Metric]:
        """Each session's last sample, by session id."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"SELECT session_id, {_COLUMNS} FROM metrics JOIN (SELECT session_id, "
                "max(at) AS at FROM metrics GROUP BY session_id) USING (session_id, at)"
            ).fetchall()
        return {row[0]: Metric(*row[1:]) for row in rows}

    def between(self, session_id: str, start: str | None, end: str | None) -> list[Metric]:
        """A session's samples taken from ``start`` to ``end`` (both included; None: no
        bound), oldest first."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM metrics WHERE session_id = ? AND at >= ? AND at <= ? "
                "ORDER BY at",
                (session_id, start or "", end or "~"),
            ).fetchall()
        return [Metric(*row) for row in rows]
