"""What every envd call carries (sandbox, user, deadline) and error mapping to Connect."""

from __future__ import annotations

from dataclasses import dataclass

from forkpoint.errors import CommandTimeout, Conflict, ForkpointError, InvalidInput, NotFound
from forkpoint.runtime import Runtime

from .connect import ConnectError
from .sandboxes import Sandbox

__all__ = ["DEFAULT_USER", "EnvdCall", "connect_error", "not_running"]

DEFAULT_USER = "user"  # E2B runs commands and file operations as `user` (uid 1000)


@dataclass(frozen=True)
class EnvdCall:
    """One authenticated envd request for a running sandbox."""

    runtime: Runtime
    sandbox: Sandbox
    user: str = DEFAULT_USER
    deadline_s: float | None = None  # Connect-Timeout-Ms
    keepalive_s: float | None = None  # Keepalive-Ping-Interval

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.id


def not_running(sandbox_id: str) -> ConnectError:
    """What E2B's edge answers for a killed, paused or expired sandbox (the SDK raises
    ``SandboxNotRunningException`` on "was not found")."""
    return ConnectError("unavailable", f"The sandbox {sandbox_id} was not found")


def connect_error(error: BaseException) -> ConnectError:
    if isinstance(error, ConnectError):
        return error
    if isinstance(error, NotFound):
        return ConnectError("not_found", error.message)
    if isinstance(error, InvalidInput):
        return ConnectError("invalid_argument", error.message)
    if isinstance(error, CommandTimeout):
        return ConnectError("deadline_exceeded", error.message)
    if isinstance(error, Conflict):
        return ConnectError("failed_precondition", error.message)
    if isinstance(error, ForkpointError):
        return ConnectError("internal", error.message)
    return ConnectError("internal", f"{type(error).__name__}: {error}")
