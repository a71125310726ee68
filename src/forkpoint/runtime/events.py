"""Lifecycle events: what happened to sessions, recorded as each operation succeeds, read
by anyone who follows them (``forkpoint events``, ``GET /v1/events``, its SSE stream).

The runtime records an event around each of its operations that changes a session's life
(:meth:`Events.announce`), so every door — CLI, REST, SDK, MCP, the E2B gateway, the page
— and the reaper's expiries produce the same events. They live in the store, so a
follower sees what other processes did too.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, ParamSpec, TypeVar

from forkpoint.errors import ForkpointError, InvalidInput, NotFound
from forkpoint.models import Checkpoint, Event, EventKind, Session
from forkpoint.protocol import RestoreStatus
from forkpoint.runtime.context import RuntimeContext
from forkpoint.store.events import EventsStore, NewEvent

__all__ = [
    "MAX_EVENTS",
    "Events",
    "became",
    "checkpointed",
    "created",
    "forked",
    "record_hook_failures",
    "removed",
]

P = ParamSpec("P")
R = TypeVar("R")

#: The most events one call answers.
MAX_EVENTS = 1000
#: How often a waiting follower looks for new events (another process may add them).
_POLL_S = 0.2

_log = logging.getLogger(__name__)


class Events:
    def __init__(self, context: RuntimeContext) -> None:
        self.context = context
        self.rows = EventsStore(context.store)

    def announce(
        self,
        operation: Callable[P, Awaitable[R]],
        describe: Callable[..., Iterable[NewEvent]],
    ) -> Callable[P, Coroutine[Any, Any, R]]:
        """``operation``, recording ``describe(result, *args, **kwargs)`` once it has
        succeeded (``describe`` may read the store: it runs in a thread)."""

        @functools.wraps(operation)
        async def announced(*args: P.args, **kwargs: P.kwargs) -> R:
            result = await operation(*args, **kwargs)
            await asyncio.to_thread(self._record, describe, result, args, kwargs)
            return result

        return announced

    async def events(
        self, after: int = 0, session: str | None = None, wait: float = 0.0, limit: int = 100
    ) -> list[Event]:
        """The events with an id above ``after`` (of ``session`` only: an id, or the name
        of a session that still exists), oldest first, at most ``limit``; with none yet,
        waits up to ``wait`` seconds for one."""
        deadline = time.monotonic() + wait
        limit = max(1, min(limit, MAX_EVENTS))
        if session is not None:
            session = await asyncio.to_thread(self._session_id, session)
        while True:
            found = await asyncio.to_thread(self.rows.after, after, session, limit)
            if found or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def recent_events(self, count: int = 20, session: str | None = None) -> list[Event]:
        """The last ``count`` events (of ``session`` only), oldest first (blocking)."""
        session_id = None if session is None else self._session_id(session)
        return self.rows.last(max(1, min(count, MAX_EVENTS)), session_id)

    def _session_id(self, ref: str) -> str:
        try:
            return self.context.store.get_session(ref).id
        except (NotFound, InvalidInput):  # removed since (its events stay), or not a name
            return ref

    def _record(
        self,
        describe: Callable[..., Iterable[NewEvent]],
        result: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        try:
            self.rows.add(describe(result, *args, **kwargs))
        except ForkpointError as error:  # the operation happened: it is not undone for this
            _log.warning("forkpoint: an event was not recorded: %s", error.message)


# -- what each operation's result says happened (``describe`` for :meth:`announce`) --------


def created(session: Session, *_: Any, **__: Any) -> list[NewEvent]:
    return [(EventKind.CREATED, session.id, session.parent_checkpoint, {"image": session.image})]


def forked(results: list[Session | ForkpointError], *_: Any, **__: Any) -> list[NewEvent]:
    return [
        (EventKind.FORKED, s.id, s.parent_checkpoint, {"image": s.image})
        for s in results
        if isinstance(s, Session)
    ]


def checkpointed(checkpoint: Checkpoint, *_: Any, **__: Any) -> list[NewEvent]:
    detail = {
        "kind": checkpoint.kind.value,
        **({"name": checkpoint.name} if checkpoint.name else {}),
    }
    return [(EventKind.CHECKPOINTED, checkpoint.session_id, checkpoint.id, detail)]


def became(kind: EventKind) -> Callable[..., list[NewEvent]]:
    """An operation answering the session it changed: ``rolled_back``, ``paused``, ..."""

    def describe(session: Session, *_: Any, **__: Any) -> list[NewEvent]:
        return [(kind, session.id, session.parent_checkpoint, {})]

    return describe


def removed(session_id: str, *_: Any, **__: Any) -> list[NewEvent]:
    return [(EventKind.REMOVED, session_id, None, {})]


def record_hook_failures(
    context: RuntimeContext, session_id: str, guest: RestoreStatus | None
) -> None:
    """Record the restore hooks that failed in the restore ``guest`` reports (blocking);
    called as the restore finishes, so they come before its own event."""
    if guest is None:
        return
    EventsStore(context.store).add(
        (
            EventKind.RESTORE_HOOK_FAILED,
            session_id,
            guest.checkpoint,
            {
                "hook": run.name,
                "status": "killed at its time limit"
                if run.timed_out
                else (run.error or f"exit {run.exit_code}"),
                "event": guest.event or "",
                "generation": str(guest.generation),
            },
        )
        for run in guest.hook_runs
        if not run.ok
    )
