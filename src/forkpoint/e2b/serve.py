"""Running the gateway: the HTTP app on P, the sandbox-port proxy on Q (127.0.0.1 and ::1,
as ``*.localhost`` resolves to both), and the runtime's reaper, in one event loop."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from forkpoint.config import ApiLimits
from forkpoint.errors import InvalidInput
from forkpoint.runtime import Runtime
from forkpoint.runtime.housekeeping.reaper import reaping
from forkpoint.threads import use_fan_out_pool

from .app import create_e2b_app
from .listener import TlsOrPlainListener
from .proxy import SandboxProxy
from .sandboxes import GatewayConfig, Sandboxes
from .tables import GatewayTables
from .tls import LocalCA

__all__ = ["TokenFile", "run_gateway"]


@dataclass
class TokenFile:
    """forkpoint's API token, re-read when the file changes."""

    path: Path
    _mtime: float = -1.0
    _token: str = ""

    def __call__(self) -> str:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return ""
        if mtime != self._mtime:
            self._token, self._mtime = self.path.read_text().strip(), mtime
        return self._token


async def run_gateway(
    runtime: Runtime,
    config: GatewayConfig,
    api_socket: socket.socket,
    proxy_sockets: list[socket.socket],
    token: TokenFile,
    *,
    tables: GatewayTables | None = None,
    reap_interval_s: float = 1.0,
    log_level: str = "warning",
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (which uvicorn handles) or ``stop`` is set; the
    gateway's rows in ``tables`` (default: the runtime's store)."""
    use_fan_out_pool()
    try:
        runtime.serve_long_lived(config.limits or ApiLimits.from_env())
    except ValueError as error:
        raise InvalidInput(str(error)) from None
    sandboxes = Sandboxes(runtime, config, tables)
    app = create_e2b_app(sandboxes, token)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=log_level, lifespan="off", access_log=False)
    )
    proxy = SandboxProxy(sandboxes, api_socket.getsockname()[1])
    tls = (await asyncio.to_thread(LocalCA(runtime.home.tls).ensure)).server_context()
    listeners = [TlsOrPlainListener(s, proxy.handle, tls) for s in proxy_sockets]

    async def stop_when_asked() -> None:
        if stop is not None:
            await stop.wait()
            server.should_exit = True

    stopper = asyncio.create_task(stop_when_asked())
    try:
        async with reaping(runtime, reap_interval_s):
            await server.serve(sockets=[api_socket])
    finally:
        stopper.cancel()
        for listener in listeners:
            listener.close()
