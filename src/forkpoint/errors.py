"""The one exception tree of forkpoint, grouped by what the caller can do about it.

::

    ForkpointError                  exit 5, HTTP 500 (base: something went wrong)
    ├── InvalidInput                exit 2, HTTP 400  fix the request and retry
    │   └── UnknownPackage          an image recipe names a package Debian lacks
    ├── NotFound                    exit 3, HTTP 404  the id does not exist
    ├── Conflict                    exit 4, HTTP 409  wrong state for this operation
    │   ├── InUse                   something still depends on it
    │   └── IncompatibleCheckpoint  made by another QEMU build / machine shape / accel
    ├── CommandTimeout              exit 1, HTTP 408  a guest command ran too long (killed)
    └── InternalError               exit 5, HTTP 500  a bug or a host/QEMU failure
        ├── QemuError               carries ``log_tail`` from QEMU's own log
        ├── AgentError              the in-guest agent misbehaved or went away
        └── ImageBuildError         building an image failed (``log_tail``)

Every error has a stable ``code`` string (used in ``{"error": {"code", "message"}}``),
a CLI ``exit_code`` and an ``http_status``. Messages are one line.
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "CommandTimeout",
    "Conflict",
    "ForkpointError",
    "ImageBuildError",
    "InUse",
    "IncompatibleCheckpoint",
    "InternalError",
    "InvalidInput",
    "NotFound",
    "QemuError",
    "UnknownPackage",
]


class ForkpointError(Exception):
    """Root of every error forkpoint raises on purpose."""

    code = "internal"
    exit_code = 5
    http_status = 500

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.log_tail = log_tail

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class InvalidInput(ForkpointError):
    code = "invalid_input"
    exit_code = 2
    http_status = 400


class UnknownPackage(InvalidInput):
    code = "unknown_package"

    def __init__(self, package: str) -> None:
        super().__init__(f"unknown Debian package: {package}")
        self.package = package


class NotFound(ForkpointError):
    code = "not_found"
    exit_code = 3
    http_status = 404


class Conflict(ForkpointError):
    code = "conflict"
    exit_code = 4
    http_status = 409


class InUse(Conflict):
    code = "in_use"


class IncompatibleCheckpoint(Conflict):
    code = "incompatible_checkpoint"


class CommandTimeout(ForkpointError):
    code = "timeout"
    exit_code = 1
    http_status = 408

    def __init__(self, command: str, timeout_s: float) -> None:
        super().__init__(f"command timed out after {timeout_s:g} s and was killed: {command}")
        self.command = command
        self.timeout_s = timeout_s


class InternalError(ForkpointError):
    code = "internal"


class QemuError(InternalError):
    code = "qemu_error"


class AgentError(InternalError):
    code = "agent_error"


class ImageBuildError(InternalError):
    code = "image_build_failed"
