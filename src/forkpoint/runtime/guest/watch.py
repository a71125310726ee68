"""A watched directory of a session: its changes as an async iterator, or polled."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

from forkpoint.agent_client import AgentClient
from forkpoint.agent_client.watch import WatchStream
from forkpoint.errors import NotFound
from forkpoint.models import FileEvent

__all__ = ["DirWatch", "watch_dir"]


class DirWatch:
    """Iterate for each change as it comes (until the directory is gone), or call
    :meth:`pending` for the changes made so far."""

    def __init__(self, stream: WatchStream) -> None:
        self._stream = stream
        self.ended = False

    async def __aiter__(self) -> AsyncIterator[FileEvent]:
        while (event := await self._next()) is not None:
            yield event

    async def _next(self) -> FileEvent | None:
        if self.ended:
            return None
        event = await self._stream.next()
        if event is None:
            self.ended = True
            self._stream.end()  # raises TooLarge when the guest lost events
        return event

    async def pending(self, *, wait: bool = False) -> list[FileEvent]:
        """Every change made before this call and not returned yet; ``wait``: if there
        is none, wait for the next. :raises TooLarge: the guest lost events."""
        if not self.ended:
            with contextlib.suppress(NotFound):  # it ended meanwhile: its end is queued
                await self._stream.flush()
        events: list[FileEvent] = []
        if wait and not self._stream.queued and (event := await self._next()) is not None:
            events.append(event)
        while not self.ended and self._stream.queued:
            if (event := await self._next()) is not None:
                events.append(event)
        return events


@contextlib.asynccontextmanager
async def watch_dir(
    agent: AbstractAsyncContextManager[AgentClient], path: str, recursive: bool, entries: bool
) -> AsyncIterator[DirWatch]:
    """Watch ``path`` while the block runs, holding ``agent`` meanwhile."""
    async with agent as client:
        stream = await client.watch_dir(path, recursive=recursive, entries=entries)
        try:
            await stream.started()
            yield DirWatch(stream)
        finally:
            await stream.stop()
