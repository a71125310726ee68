"""Long operations over the API: a request waits a bounded time, then becomes an operation.

Create, fork, checkpoint and rollback usually take well under a second, but a fork of 64
VMs, a first create of a new machine shape (it boots a template) or a checkpoint of a
large guest can take minutes under TCG — longer than a client can tell from a hung
server. So each runs as a task of this server; the request waits for it at most ``wait``
seconds (``?wait=``, default 5, at most 8), then answers the result as always, or **202 Accepted**
with an :class:`~forkpoint.models.Operation` (``Location: /v1/operations/{id}``) that the
client polls with ``GET /v1/operations/{id}`` until its ``state`` is ``succeeded``
(``result``: what the request would have answered) or ``failed`` (``error``). The task
runs on when the client goes away; finished operations are kept for :data:`KEEP_S`
seconds (the newest :data:`KEEP_MAX`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from forkpoint.errors import ForkpointError, InternalError, NotFound
from forkpoint.models import ErrorDetail, Operation, OperationKind, OperationState

__all__ = ["KEEP_MAX", "KEEP_S", "Operations"]

KEEP_S = 600.0
KEEP_MAX = 256


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Operations:
    """The operations of one server, by id."""

    def __init__(self) -> None:
        self._ops: dict[str, Operation] = {}
        self._finished_at: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def get(self, operation_id: str) -> Operation:
        """:raises NotFound:"""
        self._forget_old()
        try:
            return self._ops[operation_id]
        except KeyError:
            raise NotFound(f"no such operation: {operation_id}") from None

    def list(self) -> list[Operation]:
        """Running operations and recently finished ones, oldest first."""
        self._forget_old()
        return list(self._ops.values())

    async def run(
        self,
        kind: OperationKind,
        target: str | None,
        work: Callable[[], Awaitable[Any]],
        wait_s: float,
        *,
        on_done: Callable[[], None] = lambda: None,
        to_result: Callable[[Any], Any] = lambda value: value,
    ) -> tuple[Any, Operation | None]:
        """Start ``work()``; wait for it at most ``wait_s`` seconds.

        Returns ``(value, None)`` when it finished in time (its exception is raised), else
        ``(None, operation)`` — the operation to answer with 202. ``on_done`` runs when
        the work ends, however it ends; ``to_result`` makes its value JSON-able for the
        operation's ``result``.
        """
        operation = Operation(
            operation_id=f"op-{secrets.token_hex(5)}",
            kind=kind,
            state=OperationState.RUNNING,
            target=target,
            created_at=_now(),
        )
        self._forget_old()
        self._ops[operation.operation_id] = operation

        async def runner() -> Any:
            try:
                value = await work()
            except ForkpointError as error:
                self._finish(operation.operation_id, error=ErrorDetail(**error.to_dict()))
                raise
            except Exception as error:  # recorded, then re-raised to the waiting request
                detail = InternalError(f"internal error: {type(error).__name__}: {error}")
                self._finish(operation.operation_id, error=ErrorDetail(**detail.to_dict()))
                raise
            finally:
                on_done()
            self._finish(operation.operation_id, result=to_result(value))
            return value

        try:
            task = asyncio.create_task(runner(), name=f"forkpoint-{operation.operation_id}")
        except BaseException:
            on_done()
            raise
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if done:
            # Answered directly: the request's own response says how it ended.
            self._ops.pop(operation.operation_id, None)
            self._finished_at.pop(operation.operation_id, None)
            return task.result(), None
        return None, self._ops[operation.operation_id]

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failure is in its operation, not a log warning

    def _finish(
        self, operation_id: str, *, result: Any = None, error: ErrorDetail | None = None
    ) -> None:
        operation = self._ops.get(operation_id)
        if operation is None:
            return
        state = OperationState.FAILED if error is not None else OperationState.SUCCEEDED
        self._ops[operation_id] = replace(
            operation, state=state, finished_at=_now(), result=result, error=error
        )
        self._finished_at[operation_id] = time.monotonic()

    def _forget_old(self) -> None:
        horizon = time.monotonic() - KEEP_S
        finished = sorted(self._finished_at.items(), key=lambda item: item[1])
        excess = len(finished) - KEEP_MAX
        for index, (operation_id, at) in enumerate(finished):
            if at < horizon or index < excess:
                self._ops.pop(operation_id, None)
                self._finished_at.pop(operation_id, None)

    async def cancel_all(self) -> None:
        """On shutdown: stop waiting for the tasks (the runtime cleans up what they left)."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=30)
