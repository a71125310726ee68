"""Map the agent's error codes onto the forkpoint error tree."""

from __future__ import annotations

from ..errors import AgentError, CommandTimeout, ForkpointError, InvalidInput, NotFound
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
    if code in (ErrorCode.INVALID_INPUT, ErrorCode.PERMISSION_DENIED):
        return InvalidInput(message)
    if code == ErrorCode.TOO_LARGE:
        return InvalidInput(f"{op}: {message}")
    if code == ErrorCode.TIMEOUT and command is not None and timeout_s is not None:
        return CommandTimeout(command, timeout_s)
    return AgentError(f"agent failed {op}: {code}: {message}")
