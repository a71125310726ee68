"""A guest port served on this machine's 127.0.0.1 through ``tcp_tunnel``, while a block
runs: each connection to the listener is a stream to the port in the guest (over the
agent's channel; on a cluster through the session's node). ``forkpoint port`` on a
cluster and the page's screenshots of a cluster's session use it; nothing listens on any
other address."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

__all__ = ["guest_port_on_loopback"]

_CHUNK = 1 << 16


class Tunnels(Protocol):
    """What has ``tcp_tunnel``: this host's runtime or the cluster's."""

    def tcp_tunnel(
        self, session: str, guest_port: int
    ) -> contextlib.AbstractAsyncContextManager[tuple[Any, Any]]: ...


@contextlib.asynccontextmanager
async def guest_port_on_loopback(
    tunnels: Tunnels, session: str, guest_port: int, local_port: int = 0
) -> AsyncIterator[int]:
    """Serve ``session``'s ``guest_port`` on ``127.0.0.1:local_port`` (0: a free port,
    yielded) while the block runs.

    :raises NotFound: no such session, or nothing listens on that guest port (checked
        before listening)."""
    async with tunnels.tcp_tunnel(session, guest_port):
        pass

    handlers: set[asyncio.Task[None]] = set()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        handlers.add(handler)
        try:
            async with tunnels.tcp_tunnel(session, guest_port) as (up_reader, up_writer):
                copies = [
                    asyncio.ensure_future(_copy(reader, up_writer)),
                    asyncio.ensure_future(_copy(up_reader, writer)),
                ]
                try:  # both ways until both ended, or one of them failed
                    await asyncio.wait(copies, return_when=asyncio.FIRST_EXCEPTION)
                finally:
                    for copy in copies:
                        copy.cancel()
        except Exception:  # the guest stopped listening, or a reset: this connection only
            pass
        finally:
            handlers.discard(handler)
            writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", local_port)
    async with server:
        try:
            yield int(server.sockets[0].getsockname()[1])
        finally:  # connections still open end with the block, their tunnels closed
            for handler in list(handlers):
                handler.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)


async def _copy(source: Any, sink: Any) -> None:
    """Copy until ``source``'s EOF, then pass the EOF on."""
    while data := await source.read(_CHUNK):
        sink.write(data)
        await sink.drain()
    if sink.can_write_eof():
        sink.write_eof()
