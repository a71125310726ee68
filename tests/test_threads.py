"""Blocking calls of a CLI operation run side by side on forkpoint's own pool: a fan-out
queued behind asyncio's default ``cpu_count + 4`` threads waited on the queue."""

from __future__ import annotations

import asyncio
import threading
import time

from forkpoint.cli.core import run
from forkpoint.runtime import Runtime
from forkpoint.threads import WORKERS


def _blocking_call() -> str:
    time.sleep(0.2)  # a wait on a child process or a lock, not a core
    return threading.current_thread().name


def test_a_cli_operation_runs_its_blocking_calls_on_the_fan_out_pool() -> None:
    calls = 20  # more than the default pool's 6 threads on a 2-core host

    async def operation(runtime: Runtime) -> list[str]:
        return await asyncio.gather(*(asyncio.to_thread(_blocking_call) for _ in range(calls)))

    names = run(operation)
    assert len(set(names)) == calls  # all at once, each on its own thread
    assert all(name.startswith("forkpoint") for name in names)
    assert calls <= WORKERS
