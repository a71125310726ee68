"""Length-prefixed JSON frames, the resync marker and an incremental decoder.

A frame is a 4-byte big-endian payload length followed by that many bytes of UTF-8 JSON
holding one object. Frames larger than ``MAX_FRAME_BYTES`` are refused on both sides.

``SYNC_MAGIC`` is a byte string that can never occur in a valid stream (valid payloads are
UTF-8 JSON, which holds neither NUL nor 0xFF bytes, and a length of 0 is invalid). Whoever
sends it says "everything before this is void": the decoder drops any partial frame and
reports ``SYNC``. Each new host connection starts with it, which makes the channel
self-healing after disconnects, VM restores and half-written frames.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any, Final

from .errors import ProtocolError

__all__ = [
    "HEADER_BYTES",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "SYNC",
    "SYNC_MAGIC",
    "Decoded",
    "FrameDecoder",
    "Sync",
    "encode_frame",
]

PROTOCOL_VERSION: Final = 2
HEADER_BYTES: Final = 4
MAX_FRAME_BYTES: Final = 4 * 1024 * 1024  # payload bytes, enforced on both sides
SYNC_MAGIC: Final = b"\x00\x00\x00\x00\xffFORKPOINT-SYNC\xff"

_HEADER = struct.Struct(">I")


class Sync:
    """Marker returned by :meth:`FrameDecoder.next` where the peer sent ``SYNC_MAGIC``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SYNC"


SYNC: Final = Sync()

Decoded = dict[str, Any] | Sync


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")


def encode_frame(message: Mapping[str, Any], *, max_frame: int = MAX_FRAME_BYTES) -> bytes:
    """Encode one JSON object as a frame.

    Raises ProtocolError if the message is not JSON-serialisable (NaN included) or its
    payload exceeds ``max_frame`` bytes.
    """
    try:
        payload = json.dumps(
            message, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        ).encode("ascii")
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"message cannot be encoded as JSON: {e}") from None
    if len(payload) > max_frame:
        raise ProtocolError(
            f"frame of {len(payload)} bytes exceeds the maximum of {max_frame} bytes"
        )
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental decoder: :meth:`feed` bytes, then call :meth:`next` until it returns None.

    Memory is bounded by one frame plus the last fed chunk: an oversized frame is skipped
    without being buffered, and bytes before a sync marker are not kept while unsynced.
    """

    def __init__(self, *, max_frame: int = MAX_FRAME_BYTES, require_sync: bool = False) -> None:
        """``require_sync``: ignore everything until the first ``SYNC_MAGIC``."""
        self._max = max_frame
        self._buf = bytearray()
        self._magic = -1  # position of the first SYNC_MAGIC in _buf, or -1
        self._skip = 0  # bytes of an oversized frame still to discard
        self._synced = not require_sync

    @property
    def synced(self) -> bool:
        """False while waiting for a sync marker."""
        return self._synced

    def reset(self, *, require_sync: bool) -> None:
        """Forget all buffered bytes (e.g. the connection ended)."""
        self._buf.clear()
        self._magic = -1
        self._skip = 0
        self._synced = not require_sync

    def feed(self, data: bytes) -> None:
        """Append received bytes. Never raises."""
        if not data:
            return
        old = len(self._buf)
        self._buf += data
        if self._magic < 0:
            self._magic = self._buf.find(SYNC_MAGIC, max(0, old - len(SYNC_MAGIC) + 1))

    def _consume(self, n: int) -> None:
        del self._buf[:n]
        if self._magic >= 0:
            self._magic -= n

    def _magic_prefix_at_end(self) -> int:
        """Length of the longest proper prefix of SYNC_MAGIC that ends the buffer."""
        for p in range(min(len(SYNC_MAGIC) - 1, len(self._buf)), 0, -1):
            if self._buf.endswith(SYNC_MAGIC[:p]):
                return p
        return 0

    def next_valid(self) -> Decoded | None:
        """:meth:`next`, a malformed frame skipped (it is consumed): for a reader that
        has no way to report one to its peer."""
        while True:
            try:
                return self.next()
            except ProtocolError:
                continue

    def next(self) -> Decoded | None:
        """Return the next message (a dict) or ``SYNC``, or None if more bytes are needed.

        Raises ProtocolError for one malformed frame (oversized, empty, not UTF-8, not a
        JSON object); that frame is consumed, so calling again continues with the rest.
        """
        while True:
            if self._magic == 0:
                self._consume(len(SYNC_MAGIC))
                self._magic = self._buf.find(SYNC_MAGIC)
                self._skip = 0
                self._synced = True
                return SYNC
            # Bytes we may treat as ordinary stream data: up to a sync marker, or up to a
            # possible start of one at the very end (it may complete with the next feed).
            if self._magic > 0:
                usable = self._magic
            else:
                usable = len(self._buf) - self._magic_prefix_at_end()
            if not self._synced:
                if self._magic > 0:
                    self._consume(self._magic)
                    continue
                self._consume(usable)
                return None
            if self._skip:
                n = min(self._skip, usable)
                self._consume(n)
                self._skip -= n
                if self._skip and self._magic != 0:
                    return None
                continue
            if usable < HEADER_BYTES:
                if self._magic > 0:  # a partial header cut off by a resync: drop it
                    self._consume(self._magic)
                    continue
                return None
            (length,) = _HEADER.unpack_from(self._buf, 0)
            if length == 0:
                self._consume(HEADER_BYTES)
                raise ProtocolError("empty frame (length 0)")
            if length > self._max:
                self._consume(HEADER_BYTES)
                self._skip = length
                raise ProtocolError(
                    f"frame of {length} bytes exceeds the maximum of {self._max} bytes"
                )
            if HEADER_BYTES + length > usable:
                if self._magic > 0:  # frame interrupted by a resync: drop its start
                    self._consume(self._magic)
                    continue
                return None
            payload = bytes(self._buf[HEADER_BYTES : HEADER_BYTES + length])
            self._consume(HEADER_BYTES + length)
            return _parse_payload(payload)


def _parse_payload(payload: bytes) -> dict[str, Any]:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"frame is not valid UTF-8: {e.reason} at byte {e.start}") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ProtocolError("frame JSON is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, int-digit limit, NaN
        raise ProtocolError(f"frame is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame must hold a JSON object, not {type(obj).__name__}")
    return obj
