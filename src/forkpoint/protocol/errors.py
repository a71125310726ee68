"""Errors raised by the wire layer (shared by the host and the in-guest agent)."""

from __future__ import annotations

__all__ = ["BadArguments", "ProtocolError"]


class ProtocolError(Exception):
    """The byte stream or a message in it is malformed (bad frame, bad JSON, bad shape).

    The decoder raises it for one bad frame and stays usable: the bad frame is consumed.
    """


class BadArguments(ProtocolError):
    """A well-formed request whose ``args`` do not fit the op (missing, wrong type, range)."""
