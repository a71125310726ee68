"""Watchers the runtime holds for pollers: a door that answers one request at a time
(REST, MCP, E2B's sync SDK) creates one, asks for its events now and then, removes it.

A watcher is a :class:`~.watch.DirWatch` kept open between requests. Asking for events
flushes the guest's queue first, so every change made before the request is in the
answer. A watcher whose stream ended (its directory removed, the session stopped or
rolled back) answers its last events once and is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from forkpoint.errors import AgentError, Conflict, ForkpointError, NotFound
from forkpoint.models import FileEvent, Watcher
from forkpoint.runtime.guest.watch import DirWatch

__all__ = ["MAX_WATCHERS_PER_SESSION", "Watchers"]

MAX_WATCHERS_PER_SESSION = 32
MAX_WAIT_S = 60.0

OpenWatch = Callable[..., contextlib.AbstractAsyncContextManager[DirWatch]]
ResolveSession = Callable[[str], str]


@dataclass
class _Held:
    info: Watcher
    watch: DirWatch
    stack: contextlib.AsyncExitStack
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Watchers:
    """``open_watch(session, path, recursive=, entries=)`` starts a watch;
    ``session_id(ref)`` turns a session id or name into its id (blocking)."""

    def __init__(self, open_watch: OpenWatch, session_id: ResolveSession) -> None:
        self._open_watch = open_watch
        self._session_id = session_id
        self._held: dict[str, _Held] = {}

    async def create_watcher(
        self, session: str, path: str, *, recursive: bool = False, entries: bool = False
    ) -> Watcher:
        """Watch directory ``path`` until :meth:`remove_watcher`.
        :raises NotFound: no such session or directory. :raises InvalidInput: a file.
        :raises Conflict: the session has ``MAX_WATCHERS_PER_SESSION`` already."""
        session_id = await asyncio.to_thread(self._session_id, session)
        if sum(h.info.session_id == session_id for h in self._held.values()) >= (
            MAX_WATCHERS_PER_SESSION
        ):
            raise Conflict(
                f"session {session_id} has {MAX_WATCHERS_PER_SESSION} watchers already "
                "(remove one first)"
            )
        stack = contextlib.AsyncExitStack()
        watch = await stack.enter_async_context(
            self._open_watch(session_id, path, recursive=recursive, entries=entries)
        )
        info = Watcher(f"w-{secrets.token_hex(5)}", session_id, path, recursive, entries)
        self._held[info.id] = _Held(info, watch, stack)
        return info

    async def watcher_events(
        self, session: str, watcher: str, *, wait: float = 0.0
    ) -> list[FileEvent]:
        """The changes since the last call (in order); with ``wait`` (s, at most 60) and
        none yet, the first one to come within that time.
        :raises NotFound: no such watcher in that session (or it has ended)."""
        held = await self._get(session, watcher)
        async with held.lock:
            try:
                events = await held.watch.pending()
                if not events and wait > 0 and not held.watch.ended:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(wait, MAX_WAIT_S)):
                            events = await held.watch.pending(wait=True)
            except AgentError:  # its connection is gone (a rollback, a stop): it has ended
                events = []
                held.watch.ended = True
            except ForkpointError:
                await self._drop(held)
                raise
            if held.watch.ended:
                await self._drop(held)
            return events

    async def remove_watcher(self, session: str, watcher: str) -> None:
        """Stop watching. :raises NotFound:"""
        await self._drop(await self._get(session, watcher))

    async def _get(self, session: str, watcher: str) -> _Held:
        session_id = await asyncio.to_thread(self._session_id, session)
        held = self._held.get(watcher)
        if held is None or held.info.session_id != session_id:
            raise NotFound(f"no watcher {watcher} in session {session_id} (or it has ended)")
        return held

    async def _drop(self, held: _Held) -> None:
        if self._held.pop(held.info.id, None) is not None:
            with contextlib.suppress(ForkpointError):
                await held.stack.aclose()
