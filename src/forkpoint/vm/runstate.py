"""QEMU's run states (``query-status``), and guards for operations that need one.

The names are QEMU's own (QAPI ``RunState``). As in ``qemu.qmp``'s ``Runstate`` +
``@require``: an operation states which run states it works in, and a VM in any other
raises :class:`StateError` naming both, instead of failing somewhere inside QEMU.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from forkpoint.errors import QemuError

__all__ = ["LOADING", "PAUSED", "RESUMABLE", "RunState", "StateError", "require"]


class RunState(enum.StrEnum):
    DEBUG = "debug"
    INMIGRATE = "inmigrate"
    INTERNAL_ERROR = "internal-error"
    IO_ERROR = "io-error"
    PAUSED = "paused"
    POSTMIGRATE = "postmigrate"
    PRELAUNCH = "prelaunch"
    FINISH_MIGRATE = "finish-migrate"
    RESTORE_VM = "restore-vm"
    RUNNING = "running"
    SAVE_VM = "save-vm"
    SHUTDOWN = "shutdown"
    SUSPENDED = "suspended"
    WATCHDOG = "watchdog"
    GUEST_PANICKED = "guest-panicked"
    COLO = "colo"


PAUSED = frozenset({RunState.PAUSED, RunState.POSTMIGRATE})
"""Stopped by a monitor command (a checkpoint, a migration): ``cont`` resumes it."""

RESUMABLE = PAUSED | {RunState.IO_ERROR}
"""What ``cont`` brings back: a monitor stop, or a stop on a failed disk write (a full
disk: ``cont`` retries the write, and stops again if there is still no room)."""

LOADING = frozenset({RunState.INMIGRATE, RunState.PRELAUNCH, *PAUSED})
"""Launched with ``-incoming``: loading, or loaded and waiting to run."""


class StateError(QemuError):
    """The VM is in a run state the operation does not work in."""

    def __init__(self, describe: str, state: RunState, required: frozenset[RunState]) -> None:
        wanted = " or ".join(sorted(required))
        super().__init__(f"{describe}: the VM is {state}, this needs it {wanted}")
        self.state = state
        self.required = required


class _Monitored(Protocol):
    @property
    def describe(self) -> str: ...

    async def status(self) -> RunState: ...


_M = TypeVar("_M", bound=_Monitored)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def require(
    *states: RunState,
) -> Callable[
    [Callable[Concatenate[_M, _P], Awaitable[_R]]], Callable[Concatenate[_M, _P], Awaitable[_R]]
]:
    """Guard an async method: it runs only while QEMU reports one of ``states``.

    :raises StateError: QEMU is in another run state.
    """
    required = frozenset(states)

    def decorate(
        method: Callable[Concatenate[_M, _P], Awaitable[_R]],
    ) -> Callable[Concatenate[_M, _P], Awaitable[_R]]:
        @functools.wraps(method)
        async def guarded(self: _M, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            state = await self.status()
            if state not in required:
                raise StateError(self.describe, state, required)
            return await method(self, *args, **kwargs)

        return guarded

    return decorate
