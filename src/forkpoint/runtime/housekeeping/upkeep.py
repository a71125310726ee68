"""What every CLI call and the reaper of every long-lived door (:mod:`.reaper`) do first:
end sessions past their timeout, keep each running session's QEMU log under its cap and
discard the rollback standbys a killed forkpoint left half-started.

A session's lifetime ends as its ``on_expiry`` says. ``remove`` (E2B's "kill"): its VM,
files and port forwards go, its checkpoints stay (they outlive sessions anyway) — done
here, without QEMU. ``pause``: checkpointed and stopped, which needs the VM engine — the
sessions due are :func:`due_to_pause`'s, and ``Runtime.expire`` pauses them. Cheap when
nothing is due — two store reads and a ``stat`` per running session — so ``forkpoint ls``
can afford it.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from forkpoint.errors import ForkpointError
from forkpoint.models import EventKind, Expiry, SessionState
from forkpoint.store import Store, session_lock, utc_now
from forkpoint.vm.logcap import trim_log

if TYPE_CHECKING:
    from forkpoint.runtime.queries import Queries

__all__ = ["due_to_pause", "expires_after", "record_expired", "upkeep"]


def expires_after(timeout_s: float | None) -> str | None:
    """``expires_at`` for a lifetime of ``timeout_s`` from now (None: never), in the
    store's timestamp format."""
    if timeout_s is None:
        return None
    moment = datetime.now(UTC) + timedelta(seconds=timeout_s)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def upkeep(queries: Queries) -> list[str]:
    """Remove expired sessions and trim running ones' logs; returns the ids removed.

    A session whose lock is held (an operation under way) is left for the next round.
    """
    now = utc_now()  # ISO-8601 UTC with a fixed width: compares as text
    expired = []
    for record in queries.store.list_sessions():
        if _due(record.expires_at, now) and record.on_expiry == Expiry.REMOVE:
            expired.append(record.id)
        elif record.state == SessionState.RUNNING:
            trim_log(queries.files(record.id).qemu_log)
    removed = [session_id for session_id in expired if _remove_expired(queries, session_id, now)]
    record_expired(queries.store, removed, Expiry.REMOVE)
    _discard_dead_standbys(queries)
    return removed


def record_expired(store: Store, session_ids: list[str], then: Expiry) -> None:
    """The ``expired`` events of sessions whose lifetime ended (then removed or paused)."""
    if not session_ids:
        return
    from forkpoint.store.events import EventsStore  # loaded by `ls` only when needed

    EventsStore(store).add((EventKind.EXPIRED, s, None, {"then": then.value}) for s in session_ids)


def due_to_pause(queries: Queries) -> list[str]:
    """Running sessions whose lifetime is over and which are to be paused then."""
    now = utc_now()
    return [
        r.id
        for r in queries.store.list_sessions()
        if _due(r.expires_at, now)
        and r.on_expiry == Expiry.PAUSE
        and r.state == SessionState.RUNNING
    ]


def _due(expires_at: str | None, now: str) -> bool:
    return expires_at is not None and expires_at <= now


def _discard_dead_standbys(queries: Queries) -> None:
    """Rollback standbys a killed forkpoint left half-started (see :mod:`.standby`); a
    failure leaves them for the next round, as for expired sessions."""
    from forkpoint.store.standby import StandbyStore

    if any(row.qemu_pid is None for row in StandbyStore(queries.store).all()):
        from forkpoint.runtime.restore.standby import (
            Standbys,  # rare: QEMU's modules are not loaded by every query
        )

        with contextlib.suppress(ForkpointError, OSError):
            Standbys(queries.home, queries.store).discard_dead()


def _remove_expired(queries: Queries, session_id: str, now: str) -> bool:
    from forkpoint.runtime.sessions.cleanup import (
        destroy_session,  # rare: not loaded by every query
    )

    # Busy (its lock is held) or failing: left for the next round — the caller's own
    # command must not fail because another session could not be removed.
    with contextlib.suppress(ForkpointError, OSError):
        with session_lock(queries.home, session_id, timeout_s=0):
            record = queries.store.get_session(session_id)
            if record.expires_at is None or record.expires_at > now:
                return False  # its timeout was extended meanwhile
            destroy_session(queries.home, queries.store, queries.files(record.id), record)
            return True
    return False
