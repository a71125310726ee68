"""Map the agent's error codes onto the forkpoint error tree."""

from __future__ import annotations

from ..errors import (
    AgentError,
    CommandNotFound,
    CommandTimeout,
    Conflict,
    ForkpointError,
    GuestRefused,
    InvalidInput,
    NotFound,
)
from ..protocol import ErrorCode, ErrorInfo, Op

__all__ = ["error_from_agent"]

_RUNS_A_COMMAND = frozenset({Op.EXEC, Op.SPAWN, Op.PROC_START})


def error_from_agent(
    op: str, error: ErrorInfo, *, command: str | None = None, timeout_s: float | None = None
) -> ForkpointError:
    """The exception to raise for an error response to ``op``.

    ``command``/``timeout_s`` describe an exec, for CommandTimeout.
    """
    code, message = error.code, error.message
    if code == ErrorCode.NOT_FOUND:
        if op in _RUNS_A_COMMAND:  # "command not found", "working directory not found"
            return CommandNotFound(message)
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
    if code == ErrorCode.IO_ERROR:
        # The guest's own filesystem or network said no (EBUSY removing /dev, ENOSPC,
        # EROFS, a refused guest port): its state, not a failure of forkpoint.
        return GuestRefused(f"{op}: {message}")
    if code == ErrorCode.TOO_LARGE:
        return InvalidInput(f"{op}: {message}")
    if code == ErrorCode.TIMEOUT and command is not None and timeout_s is not None:
        return CommandTimeout(command, timeout_s)
    return AgentError(f"agent failed {op}: {code}: {message}")
