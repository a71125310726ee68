"""What one API server lets in: a cap on running sessions and on heavy operations at once.

Create, fork, checkpoint and rollback each cost a QEMU start-up or a pass over guest RAM:
CPU the host has little of (one client once started 134 VMs in five minutes on two
cores). :class:`Admission` is asked before each one starts, and says no — with
:class:`~forkpoint.errors.Busy` (HTTP 429 + ``Retry-After``) — rather than overload the
host:

* **running sessions**: those the home has running (or being created), plus the ones this
  server's operations in flight will start, may not pass ``max_sessions``;
* **heavy operations**: at most ``max_heavy`` run at once, the rest are refused at once
  (a queue would only hide the overload from the client).

A slot is held until the operation ends, also when the client stopped waiting for it
(see :mod:`forkpoint.server.operations`). Refusals are immediate: nothing waits here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from forkpoint.config import ApiLimits
from forkpoint.errors import Busy, Conflict
from forkpoint.models import SessionState

__all__ = ["Admission", "Ticket"]

_LIVE = frozenset({SessionState.RUNNING, SessionState.CREATING})
# How long a client should wait before trying again.
RETRY_HEAVY_S = 1.0  # another operation ends within about a second under TCG
RETRY_SESSIONS_S = 5.0  # someone has to remove a session first


@dataclass
class Ticket:
    """One admitted operation: release it (once) when the operation ends."""

    admission: Admission
    sessions: int
    heavy: bool = True
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission._release(self)


class Admission:
    """``live_sessions()``: how many sessions the home has running now (a blocking call,
    run in a thread)."""

    def __init__(self, limits: ApiLimits, live_sessions: Callable[[], int]) -> None:
        self.limits = limits
        self._live_sessions = live_sessions
        self._lock = asyncio.Lock()
        self._heavy = 0
        self._starting = 0  # sessions that admitted operations may still start
        #: The most sessions ever counted running (at admission), for tests and operators.
        self.peak_sessions = 0

    @property
    def heavy_running(self) -> int:
        return self._heavy

    async def admit(self, new_sessions: int = 0, *, heavy: bool = True) -> Ticket:
        """A ticket for one operation that may start ``new_sessions`` sessions; ``heavy``:
        it also takes one of the ``max_heavy`` slots (a diff's scratch fork only counts
        as a session: it should not hold up the creates and forks the slots are for).

        :raises Busy: ``max_heavy`` operations run already, or the sessions would pass
            ``max_sessions``.
        :raises Conflict: ``new_sessions`` alone is more than ``max_sessions`` (waiting
            cannot help).
        """
        cap = self.limits.max_sessions
        if new_sessions > cap:
            raise Conflict(
                f"this server runs at most {cap} sessions; {new_sessions} cannot start at once"
            )
        async with self._lock:
            if heavy and self._heavy >= self.limits.max_heavy:
                raise Busy(
                    f"{self._heavy} create/fork/checkpoint/rollback operations are running "
                    f"(the server's limit); retry shortly",
                    RETRY_HEAVY_S,
                )
            if new_sessions:
                live = await asyncio.to_thread(self._live_sessions)
                counted = live + self._starting
                self.peak_sessions = max(self.peak_sessions, counted)
                if counted + new_sessions > cap:
                    raise Busy(
                        f"{counted} sessions are running or starting and this server runs at "
                        f"most {cap}; remove one, or retry later",
                        RETRY_SESSIONS_S,
                    )
            self._heavy += heavy
            self._starting += new_sessions
            return Ticket(self, new_sessions, heavy)

    def _release(self, ticket: Ticket) -> None:
        self._heavy -= ticket.heavy
        self._starting -= ticket.sessions


def count_live(states: list[SessionState]) -> int:
    """How many of ``states`` count against the cap."""
    return sum(state in _LIVE for state in states)
