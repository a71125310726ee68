"""A session's egress proxy: judges its guest's HTTP and TLS connections by host name.

The kernel redirects the session uid's TCP connections to ports 80 and 443 here
(:mod:`.nftables`); this process reads the original destination (``SO_ORIGINAL_DST``) and
the name the guest asked for (``Host``, TLS SNI: :mod:`.sniff`), and decides with the
session's :class:`~.egress.EgressPolicy`, re-read from its file when it changed (so a
change applies to the next connection):

- a name an entry allows: connected to the name's own addresses, resolved on the host now
  (the guest's chosen address is used if it is one of them). A guest cannot reach another
  address by naming an allowed host;
- a name an entry denies: closed;
- no entry names it (or no name): the original destination, if the address rules allow it.

The host's own addresses are never connected to. A plain-HTTP request to a host the policy
has headers for goes out with them set (and ``Connection: close``, so that the connection
carries no second request without them). TLS is passed through untouched (no interception):
the name is only read, and no header can be set. Runs as ``python -m
forkpoint.vm.egress_proxy POLICY_FILE FD``, ``FD`` its inherited listening socket
(:mod:`.egress_proxies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import socket
import struct
import sys
from pathlib import Path

from forkpoint.egress import EgressPolicy, Verdict
from forkpoint.vm.sniff import MAX_PEEK, host_of_http, is_tls, server_name, with_headers

__all__ = ["main"]

_SO_ORIGINAL_DST = 80
_PEEK_TIMEOUT_S = 5.0  # a guest that connects and says nothing (a server-first protocol)
_HTTP_METHOD = re.compile(rb"^[A-Z]{1,16}( |$)")  # "GET ", or the start of one
_CONNECT_TIMEOUT_S = 10.0
_CHUNK = 64 * 1024

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class _Policy:
    """The policy file, re-read when its modification time changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stamp: tuple[int, int] | None = None
        self.policy = EgressPolicy()

    def current(self) -> EgressPolicy:
        stat = self.path.stat()
        stamp = (stat.st_ino, stat.st_mtime_ns)  # replaced (a new inode) or rewritten
        if stamp != self.stamp:
            self.policy = EgressPolicy.from_json(json.loads(self.path.read_text()))
            self.stamp = stamp
        return self.policy


def _original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where the guest meant to connect before the kernel redirected it here (IPv4)."""
    raw = sock.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


async def _first_bytes(reader: asyncio.StreamReader) -> bytes:
    """What the guest sends first, until it has said what it will say before an answer (a
    whole TLS record, an HTTP request head, or something else), or stops, or the cap."""
    data = b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_PEEK_TIMEOUT_S):
            while len(data) < MAX_PEEK:
                chunk = await reader.read(MAX_PEEK - len(data))
                if not chunk:
                    break
                data += chunk
                if _said_enough(data):
                    break
    return data


def _said_enough(data: bytes) -> bool:
    if data[:1] == b"\x16" and len(data) < 5:
        return False  # a TLS record header, not whole yet
    if is_tls(data):  # its 5-byte header is here: the record's length is known
        return len(data) >= 5 + int.from_bytes(data[3:5], "big")
    if _HTTP_METHOD.match(data) is None:
        return True  # another protocol: its address decides, nothing to wait for
    return b"\r\n\r\n" in data


def _name_of(data: bytes) -> str | None:
    return server_name(data) if is_tls(data) else host_of_http(data)


async def _upstream(
    policy: EgressPolicy, name: str | None, destination: str, port: int, *, pinned: bool
) -> Address | None:
    """The address to connect to, or ``None``: refused. ``pinned``: only to the name's own
    addresses (it gets credentials: a guest must not send them elsewhere by naming it)."""
    chosen = ipaddress.ip_address(destination)
    verdict = policy.host_verdict(name) if name is not None else None
    if verdict == Verdict.REFUSE:
        return None
    if name is not None and (verdict == Verdict.ACCEPT or pinned):
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                name, port, family=socket.AF_INET, type=socket.SOCK_STREAM
            )
        except OSError:
            return None
        addresses = [ipaddress.ip_address(info[4][0]) for info in found]
        if not addresses:
            return None
        chosen = chosen if chosen in addresses else addresses[0]
    if verdict != Verdict.ACCEPT and policy.address_verdict(chosen) == Verdict.REFUSE:
        return None
    return None if _is_local(chosen) else chosen


def _is_local(address: Address) -> bool:
    """Whether ``address`` is one of the host's own: binding to it succeeds."""
    if address.is_loopback or address.is_unspecified:
        return True
    with socket.socket(socket.AF_INET if address.version == 4 else socket.AF_INET6) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


async def _serve(
    policies: _Policy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        sock = writer.get_extra_info("socket")
        destination, port = _original_destination(sock)
        first = await _first_bytes(reader)
        policy, name = policies.current(), _name_of(first)
        headers = policy.headers_for(name) if name is not None and not is_tls(first) else {}
        address = await _upstream(policy, name, destination, port, pinned=bool(headers))
        if address is None:
            return
        if headers:  # plain HTTP: the operator's credentials go on (never into the guest)
            first = with_headers(first, headers)
        async with asyncio.timeout(_CONNECT_TIMEOUT_S):
            up_reader, up_writer = await asyncio.open_connection(str(address), port)
        try:
            up_writer.write(first)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()
    except (OSError, TimeoutError, ValueError):
        pass  # the guest sees its connection closed
    finally:
        writer.close()


async def _run(policy_file: Path, listen_fd: int) -> None:
    policies = _Policy(policy_file)
    listener = socket.socket(fileno=listen_fd)
    server = await asyncio.start_server(
        lambda r, w: _serve(policies, r, w), sock=listener, limit=MAX_PEEK
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    asyncio.run(_run(Path(sys.argv[1]), int(sys.argv[2])))


if __name__ == "__main__":
    main()
