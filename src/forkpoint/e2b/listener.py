"""One port, HTTP and HTTPS: each connection's first byte says which (a TLS handshake
starts with 0x16, an HTTP request with a letter), read without taking it off the socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable

__all__ = ["TLS_OR_PLAIN_TIMEOUT_S", "TlsOrPlainListener"]

TLS_OR_PLAIN_TIMEOUT_S = 30.0  # a client that connects and says nothing is dropped then
_TLS_HANDSHAKE = 0x16

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class TlsOrPlainListener:
    """Accepts on ``sock`` and hands each connection to ``handle`` as streams, through
    TLS (``context``) when the client starts a handshake."""

    def __init__(self, sock: socket.socket, handle: Handler, context: ssl.SSLContext) -> None:
        self._sock = sock
        self._handle = handle
        self._context = context
        self._tasks: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        self._accepting = asyncio.create_task(self._accept())

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self._tasks):
            task.cancel()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            task = asyncio.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = await asyncio.wait_for(_peek(loop, conn), TLS_OR_PLAIN_TIMEOUT_S)
            if not first:
                conn.close()
                return
            reader = asyncio.StreamReader()
            protocol = asyncio.StreamReaderProtocol(reader)
            tls = self._context if first[0] == _TLS_HANDSHAKE else None
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=tls,
                ssl_handshake_timeout=TLS_OR_PLAIN_TIMEOUT_S if tls else None,
            )  # fmt: skip
        except (OSError, TimeoutError, ssl.SSLError):
            conn.close()  # a failed handshake (an untrusting client) or a silent one
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self._handle(reader, writer)


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The connection's first byte, left in the socket (b"" if it closed)."""
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fileno(), ready)
    try:
        await readable
    finally:
        loop.remove_reader(conn.fileno())
    with contextlib.suppress(BlockingIOError):
        return conn.recv(1, socket.MSG_PEEK)
    return b""
