"""TCP tunnels: a host byte stream to 127.0.0.1:port in the guest, over the agent channel.

Any guest port is reachable this way without a network forward (adding one restarts
passt, which cuts the VM's connections). ``tunnel_open`` connects, streams ``start`` and
then what the guest peer sends (flow-controlled, ``streams``) and answers at its EOF; the
host writes with ``tunnel_write`` (one at a time: they run in order and block while the
peer does not read), half-closes with ``tunnel_shutdown`` and closes with
``stream_cancel``. A tunnel belongs to its host connection: a new connection closes it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Final

from ..protocol import (
    STREAM_READ_BYTES,
    Empty,
    ErrorCode,
    EventKind,
    TunnelArgs,
    TunnelEndResult,
    TunnelOpenArgs,
    TunnelWriteArgs,
)
from .context import ConnectionGone, Context, GuestError
from .streams import StreamRegistry

__all__ = ["TunnelOps"]

MAX_TUNNELS: Final = 1024
_CONNECT_TIMEOUT_S: Final = 5.0


class TunnelOps:
    """Handlers of the tunnel ops; tunnels are keyed by ``(generation, open request id)``."""

    def __init__(self, streams: StreamRegistry) -> None:
        self._streams = streams
        self._sockets: dict[tuple[int, int], socket.socket] = {}
        self._lock = threading.Lock()

    def open(self, ctx: Context, args: TunnelOpenArgs) -> TunnelEndResult:
        """Connect and relay the guest peer's bytes. Raises GuestError not_found when
        nothing listens on the port."""
        with self._lock:
            if len(self._sockets) >= MAX_TUNNELS:
                raise GuestError(ErrorCode.CONFLICT, f"too many open tunnels ({MAX_TUNNELS})")
        try:
            sock = socket.create_connection(("127.0.0.1", args.port), _CONNECT_TIMEOUT_S)
        except ConnectionRefusedError:
            raise GuestError(
                ErrorCode.NOT_FOUND, f"nothing listens on guest port {args.port}"
            ) from None
        except OSError as e:
            raise GuestError(
                ErrorCode.IO_ERROR, f"cannot connect to guest port {args.port}: {e}"
            ) from None
        sock.settimeout(None)
        key = (ctx.generation, ctx.rid)
        with self._lock:
            self._sockets[key] = sock
        stream = self._streams.open(ctx, args.window)
        stream.on_cancel = lambda: self.close(key)
        try:
            if not stream.send(EventKind.START, b""):
                raise ConnectionGone
            while True:
                try:
                    data = sock.recv(STREAM_READ_BYTES)
                except OSError:  # reset by the peer, or closed by the host
                    return TunnelEndResult(eof=False)
                if not data:
                    return TunnelEndResult(eof=True)
                if not stream.send(EventKind.DATA, data):
                    if not ctx.alive:
                        raise ConnectionGone
                    return TunnelEndResult(eof=False)
        finally:
            # The host may still write after the peer's EOF: the socket stays until the
            # host closes it (stream_cancel) or its connection ends.
            self._streams.close(stream)

    def _on_socket(
        self, ctx: Context, tunnel: int, action: Callable[[socket.socket], object]
    ) -> Empty:
        with self._lock:
            sock = self._sockets.get((ctx.generation, tunnel))
        if sock is None:
            raise GuestError(ErrorCode.NOT_FOUND, f"no such tunnel: {tunnel}")
        try:
            action(sock)
        except OSError as e:
            raise GuestError(ErrorCode.CONFLICT, f"tunnel {tunnel} is closed: {e}") from None
        return Empty()

    def write(self, ctx: Context, args: TunnelWriteArgs) -> Empty:
        """Send the bytes (blocks while the guest peer does not read)."""
        return self._on_socket(ctx, args.tunnel, lambda sock: sock.sendall(args.data))

    def shutdown(self, ctx: Context, args: TunnelArgs) -> Empty:
        """Half-close: the guest peer reads EOF."""
        return self._on_socket(ctx, args.tunnel, lambda sock: sock.shutdown(socket.SHUT_WR))

    def close(self, key: tuple[int, int]) -> None:
        """Close a tunnel's socket (wakes its reader). Idempotent."""
        with self._lock:
            sock = self._sockets.pop(key, None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def drop_stale(self, generation: int) -> None:
        """Close the tunnels of connections older than ``generation``."""
        with self._lock:
            stale = [k for k in self._sockets if k[0] < generation]
        for key in stale:
            self.close(key)
