"""A session's guest port on the client's loopback, wherever the session runs.

Like ``kubectl port-forward``: a listener on the client's ``127.0.0.1``; each connection
to it becomes a byte stream through the cluster (authenticated by Ray's token) to the
session's node daemon, and from there over the guest agent's channel to the port inside
the guest. Nothing listens on any other address, on the client or on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from forkpoint.cluster.runtime import ClusterRuntime

__all__ = ["serve_tunnel"]


async def serve_tunnel(
    cluster: ClusterRuntime,
    session: str,
    guest_port: int,
    local_port: int,
    listening: Callable[[int], None],
) -> None:
    """Serve ``session``'s ``guest_port`` on ``127.0.0.1:local_port`` (0: any free port)
    until cancelled; ``listening(port)`` once it does.

    :raises NotFound: no such session, or nothing listens on that guest port (checked
        before listening); :raises NodeLost: its node is gone."""
    entry = await asyncio.to_thread(cluster.live_entry, session)
    daemon = cluster.daemon(entry.node)
    await cluster.call(
        entry.node, "tunnel_close", await _open(cluster, entry.node, entry.id, guest_port)
    )

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            tunnel = await _open(cluster, entry.node, entry.id, guest_port)
        except Exception:  # the guest stopped listening: this connection only
            writer.close()
            return
        try:
            await asyncio.gather(_up(reader, daemon, tunnel), _down(daemon, tunnel, writer))
        except Exception:  # a reset on either side ends this connection only
            pass
        finally:
            with contextlib.suppress(Exception):
                await daemon.tunnel_close.remote(tunnel)
            writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", local_port)
    async with server:
        listening(int(server.sockets[0].getsockname()[1]))
        await server.serve_forever()


async def _open(cluster: ClusterRuntime, node: str, session: str, guest_port: int) -> int:
    tunnel: int = await cluster.call(node, "tunnel_open", session, guest_port)
    return tunnel


async def _up(reader: asyncio.StreamReader, daemon: Any, tunnel: int) -> None:
    while data := await reader.read(1 << 16):
        await daemon.tunnel_send.remote(tunnel, data)
    await daemon.tunnel_send.remote(tunnel, b"")  # the client's EOF, passed on


async def _down(daemon: Any, tunnel: int, writer: asyncio.StreamWriter) -> None:
    while data := await daemon.tunnel_receive.remote(tunnel):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
