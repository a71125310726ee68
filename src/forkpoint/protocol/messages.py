"""Message shapes: requests, final responses and streamed events.

- request  ``{"id": int, "op": str, "args": {...}}``
- response ``{"id": int|null, "ok": true, "result": {...}}`` or
  ``{"id": int|null, "ok": false, "error": {"code": str, "message": str}}``
  (``id`` is null only when the agent could not read the request's id)
- event    ``{"id": int, "event": <EventKind>, "data": <base64>}``, sent for a request
  before its final response.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .errors import ProtocolError

__all__ = [
    "MAX_REQUEST_ID",
    "ErrorCode",
    "ErrorInfo",
    "Event",
    "EventKind",
    "Request",
    "Response",
    "error_message",
    "event_message",
    "decode_b64",
    "ok_message",
    "parse_reply",
    "parse_request",
    "request_id_of",
    "request_message",
]

MAX_REQUEST_ID = 2**53 - 1  # stays exact in every JSON implementation


class ErrorCode(StrEnum):
    """``error.code`` values the agent sends."""

    INVALID_INPUT = "invalid_input"  # bad args, path is a directory / not a directory, ...
    NOT_FOUND = "not_found"  # missing path, command, working directory or process
    PERMISSION_DENIED = "permission_denied"
    CONFLICT = "conflict"  # wrong state, e.g. stdin of a process started without it
    TIMEOUT = "timeout"  # exec ran past its timeout; its process group was killed
    TOO_LARGE = "too_large"  # a frame or result exceeds the protocol limits
    PROTOCOL_ERROR = "protocol_error"  # malformed frame or message
    UNKNOWN_OP = "unknown_op"
    IO_ERROR = "io_error"  # other OS errors (no space, ...)
    INTERNAL = "internal"  # a bug in the agent


class EventKind(StrEnum):
    """``event`` values of streamed events."""

    STDOUT = "stdout"
    STDERR = "stderr"
    PTY = "pty"  # a PTY's output (its stdout and stderr are one terminal)
    CHUNK = "chunk"
    START = "start"  # a process started (data: its pid in ASCII) or a tunnel connected
    DATA = "data"  # bytes from the guest end of a tunnel
    FS = "fs"  # a watched directory changed (data: a JSON WatchEvent)


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    op: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Response:
    """A final response; exactly one of ``result`` / ``error`` is set."""

    id: int | None
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    kind: EventKind
    data: bytes


def _check_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"message id must be an integer, not {type(value).__name__}")
    if not 0 <= value <= MAX_REQUEST_ID:
        raise ProtocolError(f"message id {value} is out of range 0..{MAX_REQUEST_ID}")
    return value


def request_id_of(obj: dict[str, Any]) -> int | None:
    """The request id of a (possibly malformed) message, if it has a valid one."""
    try:
        return _check_id(obj.get("id"))
    except ProtocolError:
        return None


def parse_request(obj: dict[str, Any]) -> Request:
    """Validate a decoded frame as a request. Raises ProtocolError."""
    rid = _check_id(obj.get("id"))
    op = obj.get("op")
    if not isinstance(op, str) or not op:
        raise ProtocolError("request field 'op' must be a non-empty string")
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError("request field 'args' must be an object")
    extra = set(obj) - {"id", "op", "args"}
    if extra:
        raise ProtocolError(f"unknown request field(s): {', '.join(sorted(extra))}")
    return Request(rid, op, args)


def decode_b64(value: object, what: str) -> bytes:
    """Strict base64 decoding. Raises ProtocolError."""
    if not isinstance(value, str):
        raise ProtocolError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{what} is not valid base64") from None


def parse_reply(obj: dict[str, Any]) -> Response | Event:
    """Validate a decoded frame sent by the agent. Raises ProtocolError."""
    if "event" in obj:
        try:
            kind = EventKind(obj["event"])
        except (ValueError, TypeError):
            raise ProtocolError(f"unknown event kind {obj['event']!r}") from None
        return Event(_check_id(obj.get("id")), kind, decode_b64(obj.get("data"), "event data"))
    raw_id = obj.get("id")
    rid: int | None = None if raw_id is None else _check_id(raw_id)
    ok = obj.get("ok")
    if ok is True:
        result = obj.get("result")
        if not isinstance(result, dict):
            raise ProtocolError("response field 'result' must be an object")
        return Response(rid, result=result)
    if ok is False:
        err = obj.get("error")
        if (
            not isinstance(err, dict)
            or not isinstance(err.get("code"), str)
            or not isinstance(err.get("message"), str)
        ):
            raise ProtocolError("response field 'error' must be {code: str, message: str}")
        return Response(rid, error=ErrorInfo(err["code"], err["message"]))
    raise ProtocolError("message is neither an event nor a response (field 'ok' missing)")


def request_message(rid: int, op: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "op": op, "args": args}


def ok_message(rid: int | None, result: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "ok": True, "result": result}


def error_message(rid: int | None, code: str, message: str) -> dict[str, Any]:
    return {"id": rid, "ok": False, "error": {"code": str(code), "message": message}}


def event_message(rid: int, kind: EventKind, data: bytes) -> dict[str, Any]:
    return {"id": rid, "event": str(kind), "data": base64.b64encode(data).decode("ascii")}
