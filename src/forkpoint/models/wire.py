"""Values that exist only on the wire: errors, the health answer and long operations.
Part of :mod:`forkpoint.models` (import them from there)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from forkpoint.models import Checkpoint, Session

__all__ = [
    "ErrorDetail",
    "ErrorResponse",
    "Health",
    "Operation",
    "OperationKind",
    "OperationState",
]


@dataclass(frozen=True)
class ErrorDetail:
    """A :class:`~forkpoint.errors.ForkpointError` on the wire: its ``code``, one-line
    ``message`` and the structured fields of its class (None when they do not apply)."""

    code: str
    message: str
    log_tail: str | None = None
    command: str | None = None
    timeout_s: float | None = None
    package: str | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True)
class ErrorResponse:
    """Every error body of the REST API, and a failed fork's slot."""

    error: ErrorDetail

    @classmethod
    def of(cls, error: Any) -> ErrorResponse:
        """From a :class:`~forkpoint.errors.ForkpointError`."""
        return cls(ErrorDetail(**error.to_dict()))


@dataclass(frozen=True)
class Health:
    status: str
    version: str


class OperationKind(StrEnum):
    CREATE = "create"
    FORK = "fork"
    CHECKPOINT = "checkpoint"
    ROLLBACK = "rollback"


class OperationState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class Operation:
    """A create, fork, checkpoint or rollback that outlasted its request's ``wait``: the
    API answered 202 with this, and ``GET /v1/operations/{operation_id}`` shows how it goes.
    ``target``: the session (checkpoint, rollback) or checkpoint (fork) it works on.
    Once ``succeeded``, ``result`` is what the request would have answered (a session, a
    checkpoint, or a fork's list); once ``failed``, ``error`` says why."""

    operation_id: str
    kind: OperationKind
    state: OperationState
    created_at: str
    target: str | None = None
    finished_at: str | None = None
    result: Session | Checkpoint | list[Session | ErrorResponse] | None = None
    error: ErrorDetail | None = None
