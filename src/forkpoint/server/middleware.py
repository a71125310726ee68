"""Pure-ASGI middleware: bearer-token auth and request body caps.

Pure ASGI (not Starlette's ``BaseHTTPMiddleware``) so request and response bodies stay
streamed. Both answer with the API's error shape, ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BearerAuth", "BodyLimit", "BodyTooLarge", "send_error"]


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a streamed body passes its cap (an HTTPException so
    FastAPI's body parsing re-raises it instead of turning it into a 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


async def send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return None


class BodyLimit:
    """Refuse bodies over ``limit_for(scope)`` bytes with 413: at once when Content-Length
    says so, else while streaming (chunked uploads are counted as they arrive)."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[Scope], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        declared = _header(scope, b"content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await send_error(send, 400, "invalid_input", "bad Content-Length header")
                return
            if int(declared) > limit:
                await send_error(send, 413, "too_large", f"request body larger than {limit} bytes")
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as error:
            if started:
                raise
            await send_error(send, 413, "too_large", str(error.detail))


class BearerAuth:
    """Require ``Authorization: Bearer <token>`` on every request but ``open_paths``."""

    def __init__(self, app: ASGIApp, token: str, open_paths: frozenset[str]) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in self.open_paths:
            given = _header(scope, b"authorization") or b""
            # Constant-time compare: the token is the only thing guarding a TCP listener.
            if not hmac.compare_digest(given, self.expected):
                await send_error(send, 401, "unauthorized", "missing or wrong bearer token")
                return
        await self.app(scope, receive, send)
