"""A watched directory, seen from the host: ``start`` once watching, then its changes."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from ..errors import AgentError
from ..protocol import (
    EventKind,
    Op,
    Response,
    WatchEndResult,
    WatchEvent,
    WatchFlushArgs,
    from_wire,
)
from .streams import EventStream

__all__ = ["WatchStream"]


class WatchStream:
    """The stream of a watch_dir request.

    ``call(op, args)`` sends a request on the same connection (watch_flush; raises);
    ``raise_error(op, response)`` turns an error response into the mapped exception.
    """

    def __init__(
        self,
        stream: EventStream,
        call: Callable[[Op, object], Awaitable[Response]],
        raise_error: Callable[[Op, Response], None],
    ) -> None:
        self._stream = stream
        self._call = call
        self._raise_error = raise_error

    async def started(self) -> None:
        """Returns once the guest watches. Raises NotFound (no such directory),
        InvalidInput (not a directory), AgentError."""
        item = await self._stream.next()
        if item is None:
            self.end()  # an error response raises here
            raise AgentError("agent answered watch_dir without a start event")
        if item[0] != EventKind.START:
            raise AgentError(f"agent sent {item[0]} before the start of watch_dir")

    async def next(self) -> WatchEvent | None:
        """The next change, or None at the end (then see :meth:`end`)."""
        while (item := await self._stream.next()) is not None:
            kind, data = item
            if kind == EventKind.FS:
                event: WatchEvent = from_wire(WatchEvent, json.loads(data))
                return event
        return None

    def end(self) -> WatchEndResult:
        """Why it ended (after :meth:`next` returned None). Raises TooLarge when the
        guest lost events (overflow)."""
        response = self._stream.response()
        self._raise_error(Op.WATCH_DIR, response)
        result: WatchEndResult = from_wire(WatchEndResult, response.result)
        return result

    async def flush(self) -> None:
        """Have every change made before this call queued here (``next`` yields them
        without waiting). Raises NotFound once the watch has ended."""
        await self._call(Op.WATCH_FLUSH, WatchFlushArgs(self._stream.rid))

    @property
    def queued(self) -> bool:
        """Whether :meth:`next` has something at hand (an event or the end)."""
        return self._stream.queued

    async def stop(self) -> None:
        """Stop watching. Idempotent."""
        await self._stream.cancel()
