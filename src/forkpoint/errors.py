"""The one exception tree of forkpoint, grouped by what the caller can do about it.

::

    ForkpointError                  exit 5, HTTP 500 (base: something went wrong)
    ├── InvalidInput                exit 2, HTTP 400  fix the request and retry
    │   ├── UnknownPackage          an image recipe names a package Debian lacks
    │   ├── UnusableImage           an OCI image lacks what a guest needs (a shell, a libc)
    │   ├── GuestRefused            HTTP 409: the guest said no (a directory where a file
    │   │                           was meant, permission denied, directory not empty, …)
    │   └── Unsatisfiable           HTTP 409: what exists cannot do it (disk below the image's)
    ├── NotFound                    exit 3, HTTP 404  the id does not exist
    │   ├── CommandNotFound         HTTP 409: the session exists, the command (or cwd) not
    │   └── UnknownCheckpoint       HTTP 409: the session exists, the checkpoint its request
    │                               names (to roll back to) not
    ├── Conflict                    exit 4, HTTP 409  wrong state for this operation
    │   ├── InUse                   something still depends on it
    │   ├── Busy                    HTTP 429: a limit of the server; retry after ``retry_after_s``
    │   │   └── LimitExceeded       a host limit (free disk reserve, session count) says no
    │   ├── IncompatibleCheckpoint  made by another QEMU build / machine shape / accel
    │   └── DamagedCheckpoint       its files (or a pulled object) are not what was written
    ├── CommandTimeout              exit 1, HTTP 408  a guest command ran too long (killed)
    └── InternalError               exit 5, HTTP 500  a bug or a host/QEMU failure
        ├── QemuError               carries ``log_tail`` from QEMU's own log
        ├── AgentError              the in-guest agent misbehaved or went away
        └── ImageBuildError         building an image failed (``log_tail``)

An error that waiting may cure answers HTTP 429 with a ``Retry-After`` header: any class
with ``http_status = 429`` (``retry_after_s`` seconds, 1 unless the class or the error
says otherwise).

Every error has a stable ``code`` string (used in ``{"error": {"code", "message", …}}``),
a CLI ``exit_code`` and an ``http_status``. Messages are one line. The structured fields
a class carries (``log_tail``, ``command``, ``timeout_s``, ``package``) travel in the
error JSON too, and :meth:`ForkpointError.from_dict` rebuilds the same class with the
same fields on the other side (the SDK over REST raises what the runtime raised).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "AgentError",
    "Busy",
    "CommandTimeout",
    "CommandNotFound",
    "Conflict",
    "DamagedCheckpoint",
    "ForkpointError",
    "GuestRefused",
    "ImageBuildError",
    "InUse",
    "IncompatibleCheckpoint",
    "InternalError",
    "InvalidInput",
    "LimitExceeded",
    "NotConfigured",
    "NotFound",
    "QemuError",
    "UnknownCheckpoint",
    "UnknownPackage",
    "Unsatisfiable",
    "UnusableImage",
    "code_for_status",
]


class ForkpointError(Exception):
    """Root of every error forkpoint raises on purpose."""

    code = "internal"
    exit_code = 5
    http_status = 500
    #: Structured fields of this class, beyond ``message`` and ``log_tail``.
    fields: tuple[str, ...] = ()
    #: For a 429: when a retry may succeed (HTTP ``Retry-After``); None: 1 s.
    retry_after_s: float | None = None

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.log_tail = log_tail

    def to_dict(self) -> dict[str, Any]:
        """``{"code", "message"}`` plus the structured fields that have a value."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.log_tail:
            out["log_tail"] = self.log_tail
        for name in self.fields:
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ForkpointError:
        """The error of the class with ``data["code"]`` (else ``cls``), fields restored."""
        klass = _by_code().get(str(data.get("code", "")), cls)
        error = klass.__new__(klass)
        # Some classes build their message from their fields; the message says it all.
        ForkpointError.__init__(
            error, str(data.get("message", "")), log_tail=str(data.get("log_tail") or "")
        )
        for name in klass.fields:
            setattr(error, name, data.get(name))
        return error

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        # Pickled as its wire form: classes whose __init__ takes fields, not a message,
        # cross a process boundary (a cluster node's answer) as themselves.
        return ForkpointError.from_dict, (self.to_dict(),)


class InvalidInput(ForkpointError):
    code = "invalid_input"
    exit_code = 2
    http_status = 400


class UnknownPackage(InvalidInput):
    code = "unknown_package"
    fields = ("package",)

    def __init__(self, package: str) -> None:
        super().__init__(f"unknown Debian package: {package}")
        self.package = package


class GuestRefused(InvalidInput):
    """A well-formed request the guest refused with its files and processes as they are:
    a directory where a file was meant, permission denied, a directory not empty. HTTP
    409 (the target's state, not the request's form, is the problem); still an
    InvalidInput to callers, who fix the request."""

    code = "guest_refused"
    http_status = 409


class Unsatisfiable(InvalidInput):
    """A well-formed request that what exists cannot satisfy (a disk smaller than its
    image's). HTTP 409, like :class:`GuestRefused`: no schema can state it."""

    code = "unsatisfiable"
    http_status = 409


class UnusableImage(InvalidInput):
    """An OCI image forkpoint cannot boot as a guest (no shell, no libc); nothing cached."""

    code = "unusable_image"


class NotFound(ForkpointError):
    code = "not_found"
    exit_code = 3
    http_status = 404


class CommandNotFound(NotFound):
    """A command's program or working directory is not in the guest. HTTP 409, not 404:
    the request's target (the session) exists; a 404 would say it did not."""

    code = "command_not_found"
    http_status = 409


class UnknownCheckpoint(NotFound):
    """The checkpoint a request on a session names in its body (a rollback's target) does
    not exist. HTTP 409 like :class:`CommandNotFound`: the URL's session does."""

    code = "unknown_checkpoint"
    http_status = 409


class Conflict(ForkpointError):
    code = "conflict"
    exit_code = 4
    http_status = 409


class InUse(Conflict):
    code = "in_use"


class Busy(Conflict):
    """A limit of the API server (running sessions, operations at once) says not now;
    nothing was started. Retry after ``retry_after_s`` seconds (HTTP 429, Retry-After)."""

    code = "busy"
    http_status = 429
    fields = ("retry_after_s",)

    retry_after_s: float | None = 1.0

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class LimitExceeded(Busy):
    """The operation would cross a limit of the host (``config.HostLimits``); nothing was made."""

    code = "limit_exceeded"
    retry_after_s = 5.0  # a session has to go, or disk be freed


class IncompatibleCheckpoint(Conflict):
    code = "incompatible_checkpoint"


class DamagedCheckpoint(Conflict):
    """A checkpoint's bytes are not what was written: its files here truncated, changed or
    missing, or an object pulled from a store not matching its digest."""

    code = "damaged_checkpoint"


class NotConfigured(Conflict):
    """A valid request this host is not set up for (no S3 credentials for a push or pull):
    409, not 400 — nothing in the request could make it pass."""

    code = "not_configured"


class CommandTimeout(ForkpointError):
    code = "timeout"
    exit_code = 1
    http_status = 408
    fields = ("command", "timeout_s")

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


@functools.cache
def _by_code() -> dict[str, type[ForkpointError]]:
    """Each code's class; where several share one (``internal``), the most general."""
    table: dict[str, type[ForkpointError]] = {}
    for name in __all__:
        cls = globals()[name]
        if isinstance(cls, type) and issubclass(cls, ForkpointError):
            table.setdefault(cls.code, cls)
    table["internal"] = InternalError
    return table


def code_for_status(status: int) -> str:
    """The code of the most general error answered with HTTP ``status`` (for a body that
    names none): ``invalid_input`` for another 4xx, ``internal`` otherwise."""
    answering = [cls for cls in _by_code().values() if cls.http_status == status]
    if answering:
        return min(answering, key=lambda cls: len(cls.__mro__)).code
    return "invalid_input" if 400 <= status < 500 else "internal"
