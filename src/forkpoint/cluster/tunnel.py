"""A guest port reached from anywhere in the cluster, through the session's node.

:func:`node_streams` is a byte stream to a guest port as a reader/writer pair, over
actor calls to the session's node daemon (authenticated by Ray's token) and from there
over the guest agent's channel: ``ClusterRuntime.tcp_tunnel``, which the E2B gateway's
port proxy, the page's screenshots and ``forkpoint port`` (``runtime/guest/loopback.py``:
on the client's 127.0.0.1, like ``kubectl port-forward``) use. Nothing listens on any
address of the node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = ["NodeStreamReader", "NodeStreamWriter", "node_streams"]

#: One call of the node daemon's ``tunnel_*`` methods (its errors as forkpoint's).
DaemonCall = Callable[..., Awaitable[Any]]


class NodeStreamReader:
    """``read(n)`` like :class:`asyncio.StreamReader`'s: b"" at the guest's EOF."""

    def __init__(self, call: DaemonCall, tunnel: int) -> None:
        self._call = call
        self._tunnel = tunnel
        self._buffer = b""
        self._eof = False

    async def read(self, n: int = -1) -> bytes:
        if not self._buffer and not self._eof:
            self._buffer = await self._call("tunnel_receive", self._tunnel)
            self._eof = not self._buffer
        cut = len(self._buffer) if n < 0 else n
        data, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return data

    def at_eof(self) -> bool:
        return self._eof and not self._buffer


class NodeStreamWriter:
    """``write`` / ``drain`` / ``write_eof`` / ``close`` like :class:`asyncio.StreamWriter`'s:
    written bytes cross in one call per ``drain``."""

    def __init__(self, call: DaemonCall, tunnel: int) -> None:
        self._call = call
        self._tunnel = tunnel
        self._buffer = bytearray()
        self._closing = False
        self._eof: asyncio.Task[None] | None = None

    def write(self, data: bytes) -> None:
        if self._closing or self._eof is not None:
            raise ConnectionResetError("tunnel writer is closed")
        self._buffer += data

    async def drain(self) -> None:
        if self._buffer:
            data, self._buffer = bytes(self._buffer), bytearray()
            await self._call("tunnel_send", self._tunnel, data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        """Half-close: the guest reads EOF once what was written has crossed."""
        if self._eof is None:
            self._eof = asyncio.ensure_future(self._send_eof())

    async def _send_eof(self) -> None:
        await self.drain()
        await self._call("tunnel_send", self._tunnel, b"")

    def close(self) -> None:
        self._closing = True

    def is_closing(self) -> bool:
        return self._closing

    async def wait_closed(self) -> None:
        if self._eof is not None:
            with contextlib.suppress(Exception):
                await self._eof


@contextlib.asynccontextmanager
async def node_streams(
    call: DaemonCall, session: str, guest_port: int
) -> AsyncIterator[tuple[NodeStreamReader, NodeStreamWriter]]:
    """A byte stream to ``guest_port`` of ``session`` through its node's daemon, closed
    on exit. :raises NotFound: nothing listens there (on enter)."""
    tunnel: int = await call("tunnel_open", session, guest_port)
    writer = NodeStreamWriter(call, tunnel)
    try:
        yield NodeStreamReader(call, tunnel), writer
    finally:
        try:
            await writer.wait_closed()
        finally:  # also when cancelled: the node must not keep the guest connection
            closing = asyncio.ensure_future(call("tunnel_close", tunnel))
            with contextlib.suppress(Exception):
                await asyncio.shield(closing)
