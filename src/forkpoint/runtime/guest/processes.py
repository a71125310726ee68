"""Processes the guest agent owns (E2B's envd model), tunnels and the extra file ops.

Functions of any object with ``agent(session)`` (the :class:`Runtime`): ``Runtime``
delegates to them. A process stream holds its session's agent connection while it is
iterated; closing the iterator early detaches (the process runs on in the guest).
"""

from __future__ import annotations

import contextlib
import signal as signal_mod
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from forkpoint.agent_client import AgentClient
from forkpoint.agent_client.processes import ProcessStream
from forkpoint.agent_client.tunnel import TunnelReader, TunnelWriter
from forkpoint.models import ProcessEvent, ProcessEventKind, TrackedProcess
from forkpoint.protocol import EventKind, ProcEndResult, TrackedProcessInfo

__all__ = [
    "AgentSource",
    "end_error",
    "process_events",
    "tcp_tunnel",
    "tracked_process",
]


class AgentSource(Protocol):
    def agent(self, session: str) -> AbstractAsyncContextManager[AgentClient]: ...


def end_error(exit_code: int | None, signal: int | None) -> str | None:
    """How Go's ``exec.ExitError`` words an end (envd sends it): "exit status 3",
    "signal: killed"; None for a clean exit."""
    if signal is not None:
        try:
            words = signal_mod.strsignal(signal) or f"signal {signal}"
        except ValueError:
            words = f"signal {signal}"
        return f"signal: {words.lower()}"
    if exit_code:
        return f"exit status {exit_code}"
    return None


_OUTPUT: dict[EventKind, ProcessEventKind] = {
    EventKind.STDOUT: "stdout",
    EventKind.STDERR: "stderr",
    EventKind.PTY: "pty",
}


async def _events(stream: ProcessStream) -> AsyncIterator[ProcessEvent]:
    """start, output, end; detaches if the consumer stops early."""
    try:
        pid = await stream.started()
        yield ProcessEvent("start", pid)
        while (item := await stream.next()) is not None:
            kind, data = item
            if kind in _OUTPUT:
                yield ProcessEvent(_OUTPUT[kind], pid, data)
        end: ProcEndResult = stream.end()
        if end.ended:
            yield ProcessEvent(
                "end", pid, exit_code=end.exit_code, signal=end.signal,
                error=end_error(end.exit_code, end.signal),
            )  # fmt: skip
    finally:
        await stream.detach()


async def process_events(
    agent: AbstractAsyncContextManager[AgentClient],
    open_stream: Callable[[AgentClient], Awaitable[ProcessStream]],
) -> AsyncIterator[ProcessEvent]:
    """The events of the stream ``open_stream`` opens, holding ``agent`` meanwhile."""
    async with agent as client:
        async for event in _events(await open_stream(client)):
            yield event


def tracked_process(info: TrackedProcessInfo) -> TrackedProcess:
    return TrackedProcess(
        pid=info.pid, cmd=info.argv[0], args=tuple(info.argv[1:]), cwd=info.cwd,
        env=tuple(sorted(info.env.items())), tag=info.tag, running=info.running,
        exit_code=info.exit_code, pty=info.pty,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def tcp_tunnel(
    source: AgentSource, session: str, guest_port: int
) -> AsyncIterator[tuple[TunnelReader, TunnelWriter]]:
    """A tunnel to ``guest_port``, holding ``source``'s agent connection meanwhile."""
    async with source.agent(session) as agent, agent.tunnel(guest_port) as streams:
        yield streams
