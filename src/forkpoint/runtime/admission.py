"""What a long-lived door lets in: a cap on running sessions and on heavy operations at
once — one policy, the runtime's, for the REST API, the E2B gateway and MCP alike.

Create, fork, checkpoint and rollback each cost a QEMU start-up or a pass over guest RAM:
CPU the host has little of (one client once started 134 VMs in five minutes on two
cores). :class:`Admission` is asked before each one starts, and says no — with
:class:`~forkpoint.errors.Busy` (each door's "retry later": HTTP 429 + ``Retry-After`` on
REST and E2B, a ``busy:`` tool error on MCP) — rather than overload the host:

* **running sessions**: those the home has running (or being created), plus the ones
  operations admitted here will still start, may not pass ``max_sessions``;
* **heavy operations**: at most ``max_heavy`` run at once, the rest are refused at once
  (a queue would only hide the overload from the client).

What each operation costs is decided here, once (:meth:`Admission.create`, ``fork``,
``checkpoint``, ``rollback``, ``scratch``), after its ids are looked up: an unknown id is
a ``NotFound``, never a ``Busy``. A door holds the :class:`Ticket` until the operation
ends, also when its client stopped waiting. Refusals are immediate: nothing waits here.
A runtime admits everything until a long-lived door sets limits
(:meth:`Runtime.serve_long_lived <forkpoint.runtime.Runtime.serve_long_lived>`); a CLI
command is bounded by the host's limits alone (``runtime/capacity.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from forkpoint.config import ApiLimits
from forkpoint.errors import Busy, Conflict
from forkpoint.models import Checkpoint, Session, SessionState

__all__ = ["UNLIMITED", "Admission", "Lookups", "Ticket", "count_live"]

#: Limits that admit everything (a runtime's until a long-lived door sets its own).
UNLIMITED = ApiLimits(max_sessions=1 << 30, max_heavy=1 << 30)

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
            self.admission.release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Lookups(Protocol):
    """The runtime's queries the policy needs (blocking: run in a thread)."""

    def list_sessions(self) -> list[Session]: ...
    def get(self, session: str) -> Session: ...
    def get_checkpoint(self, checkpoint: str) -> Checkpoint: ...
    def diff_forks(self, a: str, b: str | None = None) -> int: ...


class Admission:
    """The policy and its counters, for one runtime (one process)."""

    def __init__(self, limits: ApiLimits, lookups: Lookups) -> None:
        self.limits = limits
        #: The queries its costs need (the runtime's).
        self.lookups = lookups
        self._lock = asyncio.Lock()
        self._heavy = 0
        self._starting = 0  # sessions that admitted operations may still start
        #: The most sessions ever counted running (at admission), for tests and operators.
        self.peak_sessions = 0

    # -- what each operation costs -------------------------------------------------------

    async def create(self) -> Ticket:
        return await self.admit(1)

    async def fork(self, checkpoint: str, count: int) -> tuple[Ticket, Checkpoint]:
        """:raises NotFound: no such checkpoint (before any ``Busy``)."""
        source = await asyncio.to_thread(self.lookups.get_checkpoint, checkpoint)
        return await self.admit(count), source

    async def checkpoint(self, session: str) -> tuple[Ticket, Session]:
        """:raises NotFound: no such session (before any ``Busy``)."""
        found = await asyncio.to_thread(self.lookups.get, session)
        return await self.admit(0), found

    async def rollback(self, session: str) -> tuple[Ticket, Session]:
        """A rollback or undo: it starts a session again if it is not running (crashed,
        stopped, paused). :raises NotFound: no such session (before any ``Busy``)."""
        found = await asyncio.to_thread(self.lookups.get, session)
        reviving = found.state not in _LIVE
        return await self.admit(int(reviving)), found

    def free(self) -> Ticket:
        """The ticket of an operation that costs nothing here."""
        return Ticket(self, 0, heavy=False)

    async def scratch(self, forks: int) -> Ticket:
        """A diff's or rollback preview's short-lived forks: they count against the session
        cap while it runs, but take no heavy slot (a diff of a few seconds would otherwise
        hold up every create and fork on a 2-CPU host)."""
        return await self.admit(forks, heavy=False)

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
        if self.limits == UNLIMITED:
            return self.free()
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

    def release(self, ticket: Ticket) -> None:
        self._heavy -= ticket.heavy
        self._starting -= ticket.sessions

    def _live_sessions(self) -> int:
        return count_live([session.state for session in self.lookups.list_sessions()])


def count_live(states: list[SessionState]) -> int:
    """How many of ``states`` count against the cap."""
    return sum(state in _LIVE for state in states)
