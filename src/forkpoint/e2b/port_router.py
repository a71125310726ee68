"""Sandbox ports through the API port: a request to P that names a sandbox and a port
other than envd's (``E2b-Sandbox-Id`` + ``E2b-Sandbox-Port``, as E2B's SDKs send when
``E2B_SANDBOX_URL`` points at the gateway — the code interpreter's ``/execute`` does) goes
to that port inside the guest, over the agent's TCP tunnel.

An ASGI middleware in front of the gateway app: the request is re-sent as HTTP/1.1 with
``Connection: close`` (framed by h11), the answer streamed back as it comes, and a client
that goes away closes the tunnel, so the guest's server sees it leave (the code
interpreter then interrupts the running code).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .sandbox_port import PortStream, PortUnavailable, sandbox_port
from .sandboxes import Sandboxes

__all__ = ["ENVD_PORT", "SandboxPortRouter"]

#: The port of envd in an E2B sandbox: requests for it are the gateway's own.
ENVD_PORT = 49983
_CHUNK = 64 * 1024
# Per-hop headers: each side of the gateway frames its own connection.
_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade",
        b"proxy-connection", b"trailer"}  # fmt: skip


class SandboxPortRouter:
    def __init__(self, app: ASGIApp, sandboxes: Sandboxes) -> None:
        self.app = app
        self.sandboxes = sandboxes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            sandbox_id = _header(scope, b"e2b-sandbox-id") or ""
            port = _header(scope, b"e2b-sandbox-port") or ""
            if sandbox_id and port and port != str(ENVD_PORT):
                await self._forward(scope, receive, send, sandbox_id, port)
                return
        await self.app(scope, receive, send)

    async def _forward(
        self, scope: Scope, receive: Receive, send: Send, sandbox_id: str, port: str
    ) -> None:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            await _error(send, 400, f"E2b-Sandbox-Port must be a port number, not {port!r}")
            return
        token = _header(scope, b"e2b-traffic-access-token")
        try:
            async with sandbox_port(self.sandboxes, sandbox_id, int(port), token) as stream:
                await _exchange(scope, receive, send, stream)
        except PortUnavailable as unavailable:
            await _error(send, unavailable.status, unavailable.message)


async def _exchange(scope: Scope, receive: Receive, send: Send, stream: PortStream) -> None:
    """Send the request through the tunnel and stream the answer back; returns early (the
    tunnel then closes) when the client disconnects."""
    reader, writer = stream.reader, stream.writer
    conn = h11.Connection(our_role=h11.CLIENT)
    target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
    if stream.host is not None:
        headers = [(k, v) for k, v in headers if k.lower() != b"host"]
        headers.insert(0, (b"host", stream.host.encode("latin-1")))
    first = await receive()
    if first["type"] == "http.disconnect":
        return
    if not first.get("more_body", False):  # the whole body at hand: say its length
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(first.get("body", b""))).encode()))
    elif not any(k.lower() == b"content-length" for k, _ in headers):
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"connection", b"close"))

    async def put(event: Any) -> None:
        if data := conn.send(event):
            writer.write(data)
            await writer.drain()

    await put(h11.Request(method=scope["method"], target=target, headers=headers))
    message = first
    while True:
        if body := message.get("body", b""):
            await put(h11.Data(data=body))
        if not message.get("more_body", False):
            break
        message = await receive()
        if message["type"] == "http.disconnect":
            return
    await put(h11.EndOfMessage())
    pump = asyncio.ensure_future(_answer(conn, reader, send))
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        if pump.done():
            pump.result()
    finally:
        for task in (pump, gone):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def _answer(conn: h11.Connection, reader: Any, send: Send) -> None:
    started = False
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as error:
            if started:
                raise
            await _error(send, 502, f"the sandbox's server answered malformed HTTP: {error}")
            return
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(_CHUNK))
            continue
        if isinstance(event, h11.Response):
            started = True
            headers = [(k, v) for k, v in event.headers if k.lower() not in _HOP]
            await send({"type": "http.response.start", "status": event.status_code,
                        "headers": headers})  # fmt: skip
        elif isinstance(event, h11.Data):
            await send({"type": "http.response.body", "body": bytes(event.data),
                        "more_body": True})  # fmt: skip
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            if not started:
                await _error(send, 502, "the sandbox's server closed without answering")
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            return


def _header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (``name`` in lower case), or None."""
    return next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == name), None)


async def _disconnected(receive: Receive) -> None:
    message: Message = {}
    while message.get("type") != "http.disconnect":
        message = await receive()


async def _error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
