"""The host end of a long-lived, flow-controlled stream (process output, a tunnel).

The agent sends a stream at most a window of bytes we have not acknowledged; we
acknowledge (``stream_credit``) as the consumer takes events, so what is queued here stays
bounded by the window and the connection's reader never waits for a slow consumer (other
requests on the connection keep flowing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Final

from ..errors import ForkpointError
from ..protocol import EventKind, Op, Response, StreamCancelArgs, StreamCreditArgs

__all__ = ["EventStream"]

_CANCEL_TIMEOUT_S: Final = 5.0

Call = Callable[[Op, object], Awaitable[Response]]


class EventStream:
    """Events of one request and, after them, its final response.

    ``call(op, args)`` sends a request on the same connection (for credit and cancel);
    ``forget()`` drops the request's routing once it is over.
    """

    def __init__(
        self,
        rid: int,
        future: asyncio.Future[Response],
        window: int,
        call: Call,
        forget: Callable[[], None],
    ) -> None:
        self.rid = rid
        self._future = future
        self._window = window
        self._call = call
        self._forget = forget
        self._queue: asyncio.Queue[tuple[EventKind, bytes] | None] = asyncio.Queue()
        self._unacked = 0
        self._acks: set[asyncio.Task[None]] = set()
        self._over = False
        # The response arrives after every event (one ordered connection), so the end
        # marker queues behind them.
        future.add_done_callback(lambda _: self._queue.put_nowait(None))

    async def on_event(self, kind: EventKind, data: bytes) -> None:
        """The connection's reader hands over one event (never waits)."""
        self._queue.put_nowait((kind, data))

    async def next(self) -> tuple[EventKind, bytes] | None:
        """The next event, or None once the request has answered (see :meth:`response`)."""
        if self._over:
            return None
        item = await self._queue.get()
        if item is None:
            self._over = True
            self._forget()
            return None
        self._unacked += len(item[1])
        if self._unacked >= self._window // 4:
            self._grant(self._unacked)
            self._unacked = 0
        return item

    def response(self) -> Response:
        """The final response (after :meth:`next` returned None). Raises AgentError if the
        connection broke."""
        return self._future.result()

    @property
    def over(self) -> bool:
        return self._over

    @property
    def queued(self) -> bool:
        """Whether :meth:`next` would answer at once."""
        return self._over or not self._queue.empty()

    def _grant(self, n: int) -> None:
        async def ack() -> None:
            with contextlib.suppress(ForkpointError):
                await self._call(Op.STREAM_CREDIT, StreamCreditArgs(self.rid, n))

        task = asyncio.get_running_loop().create_task(ack())
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)

    async def cancel(self) -> None:
        """Stop the stream early (a process runs on; a tunnel closes). Idempotent."""
        if self._over:
            return
        self._over = True
        self._forget()
        if not self._future.done():
            request = asyncio.ensure_future(
                self._call(Op.STREAM_CANCEL, StreamCancelArgs(self.rid))
            )
            # Past the wait it finishes on its own, maybe failing as its connection goes.
            request.add_done_callback(lambda done: done.cancelled() or done.exception())
            with contextlib.suppress(ForkpointError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(request), _CANCEL_TIMEOUT_S)
