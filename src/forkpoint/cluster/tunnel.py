"""A guest port reached from anywhere in the cluster, through the session's node.

:func:`node_streams` is a byte stream to a guest port as a reader/writer pair, over
actor calls to the session's node daemon (authenticated by Ray's token) and from there
over the guest agent's channel: what ``ClusterRuntime.tcp_tunnel`` gives the E2B
gateway's port proxy. :func:`serve_tunnel` puts such streams on the client's loopback,
like ``kubectl port-forward`` (``forkpoint port``). Nothing listens on any other address,
on the client or on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = ["NodeStreamReader", "NodeStreamWriter", "node_streams", "serve_tunnel"]

_CHUNK = 1 << 16

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
        await writer.wait_closed()
        with contextlib.suppress(Exception):
            await call("tunnel_close", tunnel)


async def serve_tunnel(
    runtime: Runtime,
    session: str,
    guest_port: int,
    local_port: int,
    listening: Callable[[int], None],
) -> None:
    """Serve ``session``'s ``guest_port`` on ``127.0.0.1:local_port`` (0: any free port)
    until cancelled, through ``runtime.tcp_tunnel`` (on a cluster: through its node);
    ``listening(port)`` once it does.

    :raises NotFound: no such session, or nothing listens on that guest port (checked
        before listening); :raises NodeLost: its node is gone."""
    async with runtime.tcp_tunnel(session, guest_port):
        pass

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with runtime.tcp_tunnel(session, guest_port) as (up_reader, up_writer):
                await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        except Exception:  # the guest stopped listening, or a reset: this connection only
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", local_port)
    async with server:
        listening(int(server.sockets[0].getsockname()[1]))
        await server.serve_forever()


class _Reader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class _Writer(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def can_write_eof(self) -> bool: ...
    def write_eof(self) -> None: ...


async def _copy(source: _Reader, sink: _Writer) -> None:
    """Copy until ``source``'s EOF, then pass the EOF on."""
    while data := await source.read(_CHUNK):
        sink.write(data)
        await sink.drain()
    if sink.can_write_eof():
        sink.write_eof()
