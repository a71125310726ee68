"""The subset of the Connect protocol (JSON codec, no compression) that envd speaks.

Unary calls are plain JSON bodies; streams are envelopes ``flags:u8 | length:u32 BE |
JSON``, ending with an end-stream envelope (flags ``0x02``) that carries an error if the
call failed. Errors have a Connect code, mapped to an HTTP status for unary calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncIterator
from typing import Any, TypeVar

__all__ = [
    "CONNECT_JSON",
    "KEEPALIVE",
    "ConnectError",
    "Keepalive",
    "decode_message",
    "end_stream",
    "envelope",
    "read_envelopes",
    "with_keepalives",
]

T = TypeVar("T")

CONNECT_JSON = "application/connect+json"
_HEADER = struct.Struct(">BI")
_END_STREAM = 0x02
_MAX_MESSAGE = 16 << 20

_HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "unauthenticated": 401,
}


class ConnectError(Exception):
    """An RPC failure with its Connect ``code`` (``not_found``, ``invalid_argument``, …)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS.get(self.code, 500)

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}


def decode_message(payload: bytes) -> dict[str, Any]:
    """A request message (a JSON object; empty means ``{}``)."""
    try:
        message = json.loads(payload or b"{}")
    except ValueError:
        raise ConnectError("invalid_argument", "malformed JSON message") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "a message must be a JSON object")
    return message


def envelope(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(0, len(data)) + data


def end_stream(error: ConnectError | None = None) -> bytes:
    data = json.dumps({"error": error.to_json()} if error else {}).encode()
    return _HEADER.pack(_END_STREAM, len(data)) + data


class Keepalive:
    """What :func:`with_keepalives` yields after a silence."""


KEEPALIVE = Keepalive()
_OVER = object()


async def with_keepalives(
    items: AsyncIterator[T], keepalive_s: float
) -> AsyncIterator[T | Keepalive]:
    """``items``, with :data:`KEEPALIVE` after each ``keepalive_s`` of silence; an error
    of ``items`` is raised here. A task reads ``items`` into a queue, so a keepalive never
    cancels a pending read; when the consumer stops, the task is cancelled, which closes
    ``items``."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def feed() -> None:
        try:
            async for item in items:
                await queue.put(item)
        except Exception as error:  # handed to the consumer
            await queue.put(_Failed(error))
        else:
            await queue.put(_OVER)
        finally:
            with contextlib.suppress(Exception):
                await items.aclose()  # type: ignore[attr-defined]

    task = asyncio.create_task(feed())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), keepalive_s)
            except TimeoutError:
                yield KEEPALIVE
                continue
            if item is _OVER:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


class _Failed:
    def __init__(self, error: Exception) -> None:
        self.error = error


async def read_envelopes(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The messages of a client stream, as they arrive (stops at end-stream or EOF)."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) >= _HEADER.size:
            flags, length = _HEADER.unpack_from(buffer)
            if length > _MAX_MESSAGE:
                raise ConnectError("resource_exhausted", f"message of {length} bytes too large")
            if len(buffer) < _HEADER.size + length:
                break
            payload = bytes(buffer[_HEADER.size : _HEADER.size + length])
            del buffer[: _HEADER.size + length]
            if flags & _END_STREAM:
                return
            yield decode_message(payload)
