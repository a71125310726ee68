"""A process the agent owns, seen from the host: its pid first, then output, then its end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import AgentError
from ..protocol import EventKind, Op, ProcEndResult, Response
from .streams import EventStream

__all__ = ["ProcessStream"]


class ProcessStream:
    """The stream of a proc_start or proc_attach request.

    ``raise_error(response)`` turns an error response into the mapped exception;
    ``decode(response)`` reads a ProcEndResult.
    """

    def __init__(
        self,
        op: Op,
        stream: EventStream,
        raise_error: Callable[[Op, Response], None],
        decode: Callable[[Response], Any],
    ) -> None:
        self._op = op
        self._stream = stream
        self._raise_error = raise_error
        self._decode = decode
        self.pid: int | None = None

    async def started(self) -> int:
        """The pid, from the first event. Raises NotFound (no such command, cwd, user or
        process), InvalidInput, AgentError."""
        item = await self._stream.next()
        if item is None:
            self._end()  # an error response raises here
            raise AgentError(f"agent answered {self._op} without a start event")
        kind, data = item
        if kind != EventKind.START:
            raise AgentError(f"agent sent {kind} before the start of {self._op}")
        self.pid = int(data.decode("ascii"))
        return self.pid

    async def next(self) -> tuple[EventKind, bytes] | None:
        """The next stdout/stderr chunk, or None at the end (then see :meth:`end`)."""
        return await self._stream.next()

    def end(self) -> ProcEndResult:
        """How the stream ended (after :meth:`next` returned None). ``ended`` False: it
        was cancelled and the process runs on."""
        return self._end()

    def _end(self) -> ProcEndResult:
        response = self._stream.response()
        self._raise_error(self._op, response)
        result: ProcEndResult = self._decode(response)
        return result

    async def detach(self) -> None:
        """Stop streaming; the process keeps running in the guest. Idempotent."""
        await self._stream.cancel()
