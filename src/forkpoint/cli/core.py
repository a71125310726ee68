"""What the session commands need that costs no start-up time: run one operation on a
runtime, print JSON, parse ``--env``, and the bodies of ``ls``/``show``/``exec``.

No typer, rich or pydantic here: the quick path (:mod:`forkpoint.cli.quick`) runs these
commands with nothing else loaded, and the typer commands call the same functions.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from forkpoint.errors import InvalidInput
from forkpoint.models import to_json_data

if TYPE_CHECKING:
    from forkpoint.models import BackgroundProcess, CommandResult, Session
    from forkpoint.runtime import Runtime
    from forkpoint.runtime.queries import Queries

__all__ = [
    "emit_json",
    "exec_command",
    "get_session",
    "list_sessions",
    "parse_env",
    "queries",
    "run",
]

T = TypeVar("T")


def run(operation: Callable[[Runtime], Awaitable[T]]) -> T:
    """Open the runtime, await ``operation(runtime)``, close it; returns its result.
    With ``FORKPOINT_CLUSTER`` set, the runtime is the cluster's (the same operations)."""
    import asyncio

    from forkpoint.config import cluster_address
    from forkpoint.runtime import Runtime
    from forkpoint.threads import use_fan_out_pool

    if cluster_address() is not None:
        from forkpoint.cluster.doors import open_runtime

        on_cluster = open_runtime()

        async def remotely() -> T:
            return await operation(on_cluster)

        return asyncio.run(remotely())

    async def main() -> T:
        use_fan_out_pool()
        runtime = await asyncio.to_thread(Runtime.open)
        try:
            await runtime.expire()  # every CLI call ends lifetimes that are over first
            return await operation(runtime)
        finally:
            await runtime.context.settled()  # a history step's checkpoint being written
            await asyncio.to_thread(runtime.close)

    return asyncio.run(main())


def emit_json(value: Any) -> None:
    """Print ``value`` (plain data, :mod:`forkpoint.models` values, lists of them) as one
    JSON document on stdout."""
    sys.stdout.write(json.dumps(to_json_data(value), indent=2, default=str) + "\n")
    sys.stdout.flush()


def parse_env(pairs: Sequence[str] | None) -> dict[str, str]:
    """``["K=V", …]`` → dict. :raises InvalidInput: an item without ``=`` or an empty key."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--env must be KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


@contextmanager
def queries() -> Iterator[Queries]:
    """The runtime's reads alone: no VM engine, no asyncio (``ls``/``show`` stay fast)."""
    from forkpoint.config import cluster_address, home

    if cluster_address() is not None:
        from forkpoint.cluster.doors import open_runtime

        yield open_runtime()  # the cluster's: Ray is loaded only then
        return
    from forkpoint.runtime.housekeeping.upkeep import due_to_pause
    from forkpoint.runtime.queries import Queries
    from forkpoint.store import Store

    root = home().ensure()
    store = Store.open(root)
    try:
        reads = Queries(root, store)
        reads.upkeep()  # every CLI call ends expired sessions first
        if due_to_pause(reads):  # rare: pausing needs the VM engine
            run(lambda runtime: runtime.expire())
        yield reads
    finally:
        store.close()


def list_sessions() -> list[Session]:
    with queries() as q:
        return q.list_sessions()


def get_session(session: str) -> Session:
    with queries() as q:
        return q.get(session)


def exec_command(
    session: str,
    command: Sequence[str],
    *,
    background: bool,
    cwd: str | None,
    env_pairs: Sequence[str],
    timeout: float | None,
    as_json: bool,
) -> int:
    """``forkpoint exec``: run ``command`` (its output streamed live to ours, or collected
    into JSON) or start it in the background; returns the exit code to exit with (the
    guest's own, passed through)."""
    env = parse_env(env_pairs)

    async def start(runtime: Runtime) -> BackgroundProcess:
        return await runtime.spawn(session, command, cwd=cwd, env=env)

    async def to_stdout(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    async def to_stderr(data: bytes) -> None:
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()

    async def execute(runtime: Runtime) -> CommandResult:
        return await runtime.exec(
            session, command, cwd=cwd, env=env, timeout=timeout,
            on_stdout=None if as_json else to_stdout, on_stderr=None if as_json else to_stderr,
        )  # fmt: skip

    if background:
        started = run(start)
        if as_json:
            emit_json(started)
        else:
            print(f"started pid {started.pid} (log: {started.log_path})", flush=True)
        return 0
    result = run(execute)
    if as_json:
        emit_json(result)
    return result.exit_code
