"""The process model, tunnels and the ``user`` account on real VMs, across fork and rollback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from forkpoint.errors import NotFound
from forkpoint.models import ProcessEvent
from forkpoint.runtime import Runtime

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

TICKER = "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.3; done"


async def first_events(events: AsyncIterator[ProcessEvent], n: int) -> list[ProcessEvent]:
    """The first ``n`` events, then detach (the process runs on)."""
    got: list[ProcessEvent] = []
    async for event in events:
        got.append(event)
        if len(got) == n:
            break
    await events.aclose()  # type: ignore[attr-defined]
    return got


async def run_to_end(events: AsyncIterator[ProcessEvent]) -> tuple[bytes, ProcessEvent]:
    out = bytearray()
    async for event in events:
        if event.kind == "stdout":
            out += event.data
        elif event.kind == "end":
            return bytes(out), event
    raise AssertionError("no end event")


async def http_get(rt: Runtime, session: str, port: int, timeout: float = 60) -> bytes:
    """GET / through a tunnel, waiting for the guest server to listen."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with rt.tcp_tunnel(session, port) as (reader, writer):
                writer.write(b"GET / HTTP/1.0\r\nHost: guest\r\n\r\n")
                await writer.drain()
                response = bytearray()
                while data := await reader.read(65536):
                    response += data
                return bytes(response)
        except NotFound:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def attach_sees_ticks(rt: Runtime, session: str, pid: int) -> None:
    events = await first_events(rt.attach_process(session, pid), 2)
    assert events[0].kind == "start" and events[0].pid == pid
    assert events[1].kind == "stdout" and events[1].data.startswith(b"tick ")
    running = {p.pid: p for p in await rt.list_processes(session)}
    assert running[pid].running and running[pid].tag == "ticker"


def test_processes_tunnel_and_user_survive_fork_and_rollback() -> None:
    async def main() -> None:
        rt = Runtime.open()
        sessions: list[str] = []
        try:
            session = (await rt.create()).id
            sessions.append(session)
            started = time.perf_counter()
            events = await first_events(
                rt.start_process(session, "/bin/sh", ["-c", TICKER], tag="ticker"), 2
            )
            print(f"start -> first stdout: {(time.perf_counter() - started) * 1000:.0f} ms")
            pid = events[0].pid
            assert events[0].kind == "start" and events[1].data == b"tick 0\n"

            # the user account: name, home, sudo, file ownership
            out, end = await run_to_end(
                rt.start_process(
                    session,
                    "/bin/bash",
                    ["-l", "-c", "id -un; echo $HOME; pwd; sudo -n true"],
                    user="user",
                )  # fmt: skip
            )
            assert out.decode().split() == ["user", "/home/user", "/home/user"]
            assert (end.exit_code, end.error) == (0, None)
            await rt.write_file(session, "/home/user/app/index.html", b"<h1>hi</h1>", user="user")
            st = await rt.stat(session, "/home/user/app/index.html")
            assert (st.owner, st.group) == ("user", "user")
            assert await rt.make_dir(session, "/home/user/app/sub", user="user") is True
            entries = {e.name: e for e in await rt.list_files(session, "/home/user/app")}
            assert entries["sub"].owner == "user" and entries["index.html"].type == "file"

            # a guest HTTP server (as user) reached through a tunnel: no forward needed
            server = await first_events(
                rt.start_process(
                    session,
                    "python3",
                    ["-m", "http.server", "8123", "--bind", "127.0.0.1"],
                    cwd="/home/user/app",
                    user="user",
                    tag="web",
                ),  # fmt: skip
                1,
            )
            response = await http_get(rt, session, 8123)
            assert response.startswith(b"HTTP/1.0 200") and b"<h1>hi</h1>" in response
            with pytest.raises(NotFound, match="nothing listens on guest port 8124"):
                async with rt.tcp_tunnel(session, 8124):
                    pass

            checkpoint = await rt.checkpoint(session)
            (fork,) = await rt.fork(checkpoint.id)
            assert not isinstance(fork, Exception)
            sessions.append(fork.id)
            await attach_sees_ticks(rt, fork.id, pid)  # same pid, started before the checkpoint
            assert b"<h1>hi</h1>" in await http_get(rt, fork.id, 8123)

            await rt.signal_process(session, pid, "KILL")
            _, end = await run_to_end(rt.attach_process(session, pid))
            assert (end.exit_code, end.signal, end.error) == (137, 9, "signal: killed")
            await rt.rollback(session, checkpoint.id)
            await attach_sees_ticks(rt, session, pid)  # alive again, the same pid
            assert server[0].pid in {p.pid for p in await rt.list_processes(session)}
        finally:
            for sid in sessions:
                await rt.remove(sid)
            rt.close()

    asyncio.run(main())
