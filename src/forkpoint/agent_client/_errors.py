"""Map the agent's error codes onto the forkpoint error tree."""

from __future__ import annotations

from ..errors import (
    AgentError,
    CommandTimeout,
    Conflict,
    ForkpointError,
    GuestRefused,
    InvalidInput,
    NotFound,
)
from ..protocol import ErrorCode, ErrorInfo

__all__ = ["error_from_agent"]


def error_from_agent(
    op: str, error: ErrorInfo, *, command: str | None = None, timeout_s: float | None = None
) -> ForkpointError:
    """The exception to raise for an error response to ``op``.

    ``command``/``timeout_s`` describe an exec, for CommandTimeout.
    """
    code, message = error.code, error.message
    if code == ErrorCode.NOT_FOUND:
        return NotFound(message)
    if code == ErrorCode.CONFLICT:
        return Conflict(message)
    if code == ErrorCode.UNKNOWN_OP:
        return AgentError(
            f"the agent in this guest does not know {op}: its image predates it (rebuild "
            "the image and create a new session)"
        )
    if code in (ErrorCode.INVALID_INPUT, ErrorCode.PERMISSION_DENIED):
        # The host checked the arguments before sending them: what the agent still
        # refuses is the guest's state (is a directory, permission denied, ...).
        return GuestRefused(message)
    if code == ErrorCode.TOO_LARGE:
        return InvalidInput(f"{op}: {message}")
    if code == ErrorCode.TIMEOUT and command is not None and timeout_s is not None:
        return CommandTimeout(command, timeout_s)
    return AgentError(f"agent failed {op}: {code}: {message}")
