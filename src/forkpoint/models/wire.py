"""Values that exist only on the wire: errors and the health answer. Part of
:mod:`forkpoint.models` (import them from there)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ErrorDetail", "ErrorResponse", "Health"]


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
