"""Wire protocol between the host and the in-guest agent (stdlib only, no forkpoint deps).

Frames are 4-byte big-endian length + UTF-8 JSON object (see ``framing``); message
shapes in ``messages``; typed args/results per op in ``models``; JSON conversion in
``codec``. Bump ``PROTOCOL_VERSION`` on any incompatible change.
"""

from .codec import from_wire, to_wire
from .errors import BadArguments, ProtocolError
from .framing import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    SYNC,
    SYNC_MAGIC,
    Decoded,
    FrameDecoder,
    Sync,
    encode_frame,
)
from .messages import (
    ErrorCode,
    ErrorInfo,
    Event,
    EventKind,
    Request,
    Response,
    error_message,
    event_message,
    ok_message,
    parse_reply,
    parse_request,
    request_id_of,
    request_message,
)
from .models import *  # noqa: F403
from .models import __all__ as _models_all

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "SYNC",
    "SYNC_MAGIC",
    "BadArguments",
    "Decoded",
    "ErrorCode",
    "ErrorInfo",
    "Event",
    "EventKind",
    "FrameDecoder",
    "ProtocolError",
    "Request",
    "Response",
    "Sync",
    "encode_frame",
    "error_message",
    "event_message",
    "from_wire",
    "ok_message",
    "parse_reply",
    "parse_request",
    "request_id_of",
    "request_message",
    "to_wire",
    *_models_all,
]
