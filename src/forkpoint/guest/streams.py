"""Long-lived streams to the host with flow control: process output and tunnels.

The agent may send a stream at most ``window`` bytes the host has not acknowledged
(``stream_credit``), plus one read. A sender out of credit waits, so a slow host slows the
process writing (its pipe fills) or the guest peer of a tunnel (TCP backpressure), and
memory stays bounded on both sides. Streams belong to the host connection that opened
them (``(generation, request id)``): a new connection cancels the old one's streams.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..protocol import Empty, EventKind, StreamCreditArgs
from .context import Context

__all__ = ["Stream", "StreamRegistry"]

_WAIT_S = 1.0  # re-check the connection this often while waiting


class Stream:
    """One request's event stream; ``send`` blocks while out of credit."""

    def __init__(self, ctx: Context, window: int) -> None:
        self.ctx = ctx
        self._credit = window
        self._cond = threading.Condition()
        self.cancelled = False
        self.finished = False
        self.on_cancel: Callable[[], None] | None = None

    def grant(self, n: int) -> None:
        with self._cond:
            self._credit += n
            self._cond.notify_all()

    def cancel(self) -> None:
        """Stop sending (the host said so, or its connection ended). Idempotent."""
        with self._cond:
            if self.cancelled:
                return
            self.cancelled = True
            self._cond.notify_all()
        if self.on_cancel is not None:
            self.on_cancel()

    def finish(self) -> None:
        """Nothing more will be sent: wakes :meth:`wait_done`."""
        with self._cond:
            self.finished = True
            self._cond.notify_all()

    def send(self, kind: EventKind, data: bytes) -> bool:
        """Send one event once there is credit. False if the stream is cancelled or the
        host is gone (it is then cancelled)."""
        with self._cond:
            while self._credit <= 0 and not self.cancelled and self.ctx.alive:
                self._cond.wait(_WAIT_S)
            if self.cancelled or not self.ctx.alive:
                return False
            self._credit -= len(data)
        if self.ctx.emit(kind, data):
            return True
        self.cancel()
        return False

    def wait_done(self) -> bool:
        """Wait until finished (True) or cancelled / the host gone (False)."""
        with self._cond:
            while not self.finished and not self.cancelled and self.ctx.alive:
                self._cond.wait(_WAIT_S)
            return self.finished and not self.cancelled


class StreamRegistry:
    """The open streams, by ``(generation, request id)``."""

    def __init__(self) -> None:
        self._streams: dict[tuple[int, int], Stream] = {}
        self._lock = threading.Lock()

    def open(self, ctx: Context, window: int) -> Stream:
        stream = Stream(ctx, window)
        with self._lock:
            self._streams[(ctx.generation, ctx.rid)] = stream
        return stream

    def close(self, stream: Stream) -> None:
        with self._lock:
            key = (stream.ctx.generation, stream.ctx.rid)
            if self._streams.get(key) is stream:
                del self._streams[key]

    def credit(self, ctx: Context, args: StreamCreditArgs) -> Empty:
        """Handler of stream_credit (a stream that has ended meanwhile is ignored)."""
        with self._lock:
            stream = self._streams.get((ctx.generation, args.request_id))
        if stream is not None:
            stream.grant(args.bytes)
        return Empty()

    def cancel(self, generation: int, request_id: int) -> None:
        with self._lock:
            stream = self._streams.pop((generation, request_id), None)
        if stream is not None:
            stream.cancel()

    def drop_stale(self, generation: int) -> None:
        """Cancel the streams of connections older than ``generation``."""
        with self._lock:
            stale = [k for k in self._streams if k[0] < generation]
            streams = [self._streams.pop(k) for k in stale]
        for stream in streams:
            stream.cancel()
