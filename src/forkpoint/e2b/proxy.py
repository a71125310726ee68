"""Sandbox ports on Q: ``<port>-<sandbox id>.localhost:Q`` → that port in the guest;
``api.localhost:Q`` → the API (E2B's SDKs derive the volume content API's address,
``https://api.<domain>``, from ``E2B_DOMAIN``).

A raw byte splice after the request head is read, so WebSockets, streamed responses and
long bodies pass through. The guest side is a TCP tunnel through the agent
(``Runtime.tcp_tunnel``): any port the guest listens on, at once, without restarting
passt. Absolute-form targets (``GET http://8000-id.localhost:Q/ HTTP/1.1``) are accepted
so clients can use Q as their ``HTTP_PROXY`` instead of resolving ``*.localhost``; the
API port itself is reachable that way too. Each client connection carries one request
(``Connection: close`` is forced unless it upgrades), so a proxy client reusing its
connection for another host never lands on the wrong sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from .sandbox_port import PortUnavailable, sandbox_port
from .sandboxes import Sandboxes

__all__ = ["SandboxProxy", "parse_host"]

_MAX_HEAD = 64 * 1024
_HOST = re.compile(r"^(\d{1,5})-([A-Za-z0-9-]+)\.localhost$", re.IGNORECASE)
_CHUNK = 64 * 1024


def parse_host(host: str) -> tuple[int, str] | None:
    """``8000-s-0123456789.localhost[:3001]`` → (8000, "s-0123456789")."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    match = _HOST.match(name.strip().rstrip("."))
    if not match or not 1 <= int(match.group(1)) <= 65535:
        return None
    return int(match.group(1)), match.group(2)


class _Reader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class _Writer(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def can_write_eof(self) -> bool: ...
    def write_eof(self) -> None: ...


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class SandboxProxy:
    """The listener on Q (``api_port`` is where absolute-form API requests go)."""

    def __init__(self, sandboxes: Sandboxes, api_port: int) -> None:
        self.sandboxes = sandboxes
        self.api_port = api_port

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await _read_head(reader)
            if head is None:
                return
            target, request, token = self._route(head)
            async with self._open(target, token) as (up_reader, up_writer, host):
                up_writer.write(request.encode(host))
                await up_writer.drain()
                await _splice(reader, writer, up_reader, up_writer)
        except _BadRequest as error:
            await _respond(writer, error.status, error.message)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _route(self, head: bytes) -> tuple[tuple[str, int] | tuple[int, str], _Head, str | None]:
        """Where the request goes, its head as sent on, and its traffic token."""
        lines = head.split(b"\r\n")
        try:
            method, target, version = lines[0].decode("latin-1").split(" ", 2)
        except ValueError:
            raise _BadRequest(400, "malformed request line") from None
        headers = [line for line in lines[1:] if line]
        host = _header(headers, b"host") or ""
        if "://" in target:  # absolute form: we are the client's HTTP proxy
            url = urlsplit(target)
            host = url.netloc
            target = (url.path or "/") + (f"?{url.query}" if url.query else "")
            headers = [h for h in headers if not h.lower().startswith(b"proxy-")]
        token = _header(headers, b"e2b-traffic-access-token")
        upgrade = any(h.lower().startswith(b"upgrade:") for h in headers)
        if not upgrade:
            headers = [h for h in headers if not h.lower().startswith(b"connection:")]
            headers.append(b"Connection: close")
        new_head = _Head(f"{method} {target} {version}", headers)
        parsed = parse_host(host)
        if parsed is not None:
            return parsed, new_head, token
        name, _, port = host.rpartition(":")
        if name in ("127.0.0.1", "localhost", "[::1]") and port == str(self.api_port):
            return (name.strip("[]"), self.api_port), new_head, token
        if (name or host).lower() == "api.localhost":  # E2B's layout: api.<domain> is the API
            return ("127.0.0.1", self.api_port), new_head, token
        raise _BadRequest(400, f"not a sandbox host: {host!r} (expected <port>-<id>.localhost)")

    @contextlib.asynccontextmanager
    async def _open(
        self, target: tuple[str, int] | tuple[int, str], token: str | None
    ) -> AsyncIterator[tuple[_Reader, _Writer, str | None]]:
        """The upstream connection and the Host header it wants (None: the client's)."""
        if isinstance(target[0], str):
            reader, writer = await asyncio.open_connection(target[0], target[1])
            try:
                yield reader, writer, None
            finally:
                writer.close()
            return
        port, sandbox_id = int(target[0]), str(target[1])
        try:
            async with sandbox_port(self.sandboxes, sandbox_id, port, token) as stream:
                yield stream.reader, stream.writer, stream.host
        except PortUnavailable as unavailable:
            raise _BadRequest(unavailable.status, unavailable.message) from None


@dataclass(frozen=True)
class _Head:
    """A request's head as it is sent on: its request line and header lines."""

    request_line: str
    headers: list[bytes]

    def encode(self, host: str | None) -> bytes:
        """The bytes to send, with ``Host: host`` instead of the client's (if given)."""
        headers = self.headers
        if host is not None:
            kept = [h for h in headers if not h.lower().startswith(b"host:")]
            headers = [b"Host: " + host.encode("latin-1"), *kept]
        return self.request_line.encode("latin-1") + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n"


def _header(lines: list[bytes], name: bytes) -> str | None:
    """The value of header ``name`` (lower case) among raw ``Name: value`` lines."""
    return next(
        (h.split(b":", 1)[1].strip().decode("latin-1") for h in lines
         if h.lower().startswith(name + b":")), None,
    )  # fmt: skip


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise _BadRequest(431, "request head too large") from None


async def _copy(src: _Reader, dst: _Writer) -> None:
    try:
        while chunk := await src.read(_CHUNK):
            dst.write(chunk)
            await dst.drain()
    finally:
        with contextlib.suppress(Exception):
            if dst.can_write_eof():
                dst.write_eof()


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: _Reader,
    up_writer: _Writer,
) -> None:
    """Copy both ways until the guest side ends (then the client side is closed)."""
    upstream = asyncio.create_task(_copy(reader, up_writer))
    try:
        await _copy(up_reader, writer)
    finally:
        upstream.cancel()
        with contextlib.suppress(BaseException):
            await upstream


async def _respond(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message}).encode()
    reason = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large"}.get(
        status, "Bad Gateway"
    )
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(ConnectionError):
        writer.write(head.encode() + body)
        await writer.drain()
