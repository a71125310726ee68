"""The host end of a TCP tunnel: asyncio-stream-like reader and writer over the agent.

Reading: ``data`` events of the tunnel_open stream (flow-controlled by ``EventStream``).
Writing: a sender task sends the buffered bytes as tunnel_write requests, one at a time
(the agent runs them in order; each returns once the guest socket took the bytes);
``drain`` waits while more than ``HIGH_WATER`` bytes are buffered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from ..errors import AgentError, ForkpointError
from ..protocol import CHUNK_BYTES, EventKind, Op, Response, TunnelArgs, TunnelWriteArgs
from .streams import EventStream

__all__ = ["HIGH_WATER", "TunnelReader", "TunnelWriter"]

HIGH_WATER: Final = 4 * CHUNK_BYTES

Call = Callable[[Op, object], Awaitable[Response]]


class TunnelReader:
    """``read(n)``: up to ``n`` bytes (any amount if ``n`` < 0); b"" at EOF."""

    def __init__(self, stream: EventStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def read(self, n: int = -1) -> bytes:
        while not self._buffer:
            item = await self._stream.next()
            if item is None:
                return b""
            kind, data = item
            if kind == EventKind.DATA:
                self._buffer = data
        if n < 0 or n >= len(self._buffer):
            data, self._buffer = self._buffer, b""
            return data
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def at_eof(self) -> bool:
        return not self._buffer and self._stream.over


class TunnelWriter:
    """``write`` / ``drain`` / ``write_eof`` / ``close`` / ``wait_closed``, like
    :class:`asyncio.StreamWriter`. Errors of the sender surface in ``drain``."""

    def __init__(self, tunnel: int, call: Call, cancel: Callable[[], Awaitable[None]]) -> None:
        self._tunnel = tunnel
        self._call = call
        self._cancel = cancel
        self._buffer = bytearray()
        self._eof = False
        self._closing = False
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._error: BaseException | None = None
        self._task = asyncio.get_running_loop().create_task(self._send_loop())

    def write(self, data: bytes) -> None:
        if self._closing or self._eof:
            raise ConnectionResetError("tunnel writer is closed")
        if data:
            self._buffer += data
            if len(self._buffer) > HIGH_WATER:
                self._drained.clear()
            self._wake.set()

    async def drain(self) -> None:
        """Wait until the buffer is below the high-water mark. Raises the sender's error
        (ConnectionResetError when the guest side is gone)."""
        if self._error is not None:
            raise ConnectionResetError(str(self._error))
        await self._drained.wait()
        if self._error is not None:
            raise ConnectionResetError(str(self._error))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        """Half-close: the guest peer reads EOF once the buffered bytes are sent."""
        self._eof = True
        self._wake.set()

    def close(self) -> None:
        """Send what is buffered, then close the tunnel (both directions)."""
        self._closing = True
        self._wake.set()

    def is_closing(self) -> bool:
        return self._closing

    async def wait_closed(self) -> None:
        await asyncio.shield(self._task)

    async def _send_loop(self) -> None:
        sent_eof = False
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._buffer and self._error is None:
                    chunk = bytes(self._buffer[:CHUNK_BYTES])
                    del self._buffer[:CHUNK_BYTES]
                    if len(self._buffer) <= HIGH_WATER:
                        self._drained.set()
                    await self._call(Op.TUNNEL_WRITE, TunnelWriteArgs(self._tunnel, chunk))
                if self._eof and not sent_eof:
                    sent_eof = True
                    await self._call(Op.TUNNEL_SHUTDOWN, TunnelArgs(self._tunnel))
                if self._closing:
                    return
        except ForkpointError as e:
            self._error = e
            self._buffer.clear()
            if not isinstance(e, AgentError):
                return  # the tunnel is gone, the connection is fine: closed below
        finally:
            self._drained.set()
            await self._cancel()
