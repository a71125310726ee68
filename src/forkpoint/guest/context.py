"""What a request handler gets to talk back with, and the error it raises on purpose."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol import ErrorCode, EventKind, event_message

__all__ = ["ConnectionGone", "Context", "GuestError"]


class GuestError(Exception):
    """An error with a protocol ``code`` and a one-line message for the host."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ConnectionGone(Exception):
    """The host connection this request came from has ended; stop and send nothing."""


@dataclass(frozen=True, slots=True)
class Context:
    """One request: its id, the connection generation it arrived on, and a way to send.

    ``send(generation, message)`` returns False when the message was dropped (the host
    went away or a newer connection started).
    """

    rid: int
    generation: int
    send: Callable[[int, dict[str, Any]], bool]
    current_generation: Callable[[], int]

    def emit(self, kind: EventKind, data: bytes) -> bool:
        """Stream one event for this request. Returns False if the host is gone."""
        return self.send(self.generation, event_message(self.rid, kind, data))

    @property
    def alive(self) -> bool:
        return self.current_generation() == self.generation
