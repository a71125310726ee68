"""The host name a connection's first bytes ask for: a TLS ClientHello's server name
(SNI, RFC 6066) or a plain HTTP request's ``Host`` header. Pure parsing of what a guest
sent, so every malformed input is an answer (``None``: no name), never an exception.
"""

from __future__ import annotations

import struct

__all__ = ["MAX_PEEK", "host_of_http", "is_tls", "server_name", "with_headers"]

#: What the egress proxy reads before it decides: a ClientHello or request head is smaller.
MAX_PEEK = 16 * 1024
_HANDSHAKE, _CLIENT_HELLO, _SNI_EXTENSION, _HOST_NAME_TYPE = 0x16, 0x01, 0x0000, 0


def is_tls(data: bytes) -> bool:
    """Whether ``data`` starts a TLS handshake record."""
    return len(data) >= 3 and data[0] == _HANDSHAKE and data[1] == 3


def server_name(data: bytes) -> str | None:
    """The SNI host name of the ClientHello ``data`` starts with (``None``: incomplete,
    not a ClientHello, or no name)."""
    try:
        return _server_name(data)
    except (IndexError, struct.error, UnicodeDecodeError):
        return None


def _server_name(data: bytes) -> str | None:
    if not is_tls(data) or data[5] != _CLIENT_HELLO:
        return None
    record_end = 5 + struct.unpack_from("!H", data, 3)[0]
    at = 5 + 4 + 2 + 32  # record header, handshake header, version, random
    at += 1 + data[at]  # session id
    at += 2 + struct.unpack_from("!H", data, at)[0]  # cipher suites
    at += 1 + data[at]  # compression methods
    extensions_end = min(at + 2 + struct.unpack_from("!H", data, at)[0], record_end)
    at += 2
    while at + 4 <= extensions_end:
        kind, length = struct.unpack_from("!HH", data, at)
        at += 4
        if kind == _SNI_EXTENSION:
            names_end = at + 2 + struct.unpack_from("!H", data, at)[0]
            at += 2
            while at + 3 <= names_end:
                name_type, name_length = data[at], struct.unpack_from("!H", data, at + 1)[0]
                at += 3
                if name_type == _HOST_NAME_TYPE:
                    if at + name_length > len(data):
                        return None  # not all here yet
                    return _name(data[at : at + name_length].decode("ascii"))
                at += name_length
            return None
        at += length
    return None


def host_of_http(data: bytes) -> str | None:
    """The host name of the HTTP/1 request head ``data`` starts with (port dropped);
    ``None``: not a complete request head, or no ``Host``."""
    head, found, _ = data.partition(b"\r\n\r\n")
    if not found:
        return None
    for line in head.split(b"\r\n")[1:]:
        field, colon, value = line.partition(b":")
        if colon and field.strip().lower() == b"host":
            try:
                host = value.strip().decode("ascii")
            except UnicodeDecodeError:
                return None
            if host.startswith("["):  # an IPv6 literal: no name
                return None
            return _name(host.rsplit(":", 1)[0] if ":" in host else host)
    return None


def with_headers(data: bytes, headers: dict[str, str]) -> bytes:
    """The request head ``data`` starts with, ``headers`` set (replacing any the guest sent
    under the same names) and ``Connection: close``, so that a second request on the same
    connection cannot go out without them; the rest of ``data`` unchanged."""
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    replaced = {name.lower().encode() for name in headers} | {b"connection"}
    kept = [lines[0]] + [
        line for line in lines[1:] if line.partition(b":")[0].strip().lower() not in replaced
    ]
    added = [f"{name}: {value}".encode() for name, value in headers.items()]
    return b"\r\n".join([*kept, *added, b"Connection: close"]) + b"\r\n\r\n" + rest


def _name(text: str) -> str | None:
    name = text.strip().lower().rstrip(".")
    return name or None
