"""The history scenario on a real VM: five steps with ``history``; ``diff`` and ``rollback
--dry-run`` name exactly the deleted file and the killed server; ``undo --steps 2`` brings
both back (the server at the same PID); ``history`` lists the steps. Through the SDK
(REST, embedded) and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from forkpoint.errors import Conflict, NotFound
from forkpoint.runtime import Runtime
from forkpoint.sdk import AsyncSandbox

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

PORT = 8000
SERVER = (
    "import socket\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {PORT}))\n"
    "s.listen(8)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    c.recv(1024)\n"
    "    c.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: 3\\r\\n\\r\\nok\\n')\n"
    "    c.close()\n"
)


def forkpoint(*args: str) -> Any:
    """``forkpoint ARGS --json`` as a separate process, parsed."""
    exe = str(Path(sys.executable).with_name("forkpoint"))
    done = subprocess.run([exe, *args, "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def get(rt: Runtime, session: str, timeout: float = 120) -> bytes:
    """GET / through a tunnel (no exec: that would be a step), once the server listens."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with rt.tcp_tunnel(session, PORT) as (reader, writer):
                writer.write(b"GET / HTTP/1.0\r\n\r\n")
                await writer.drain()
                response = bytearray()
                while data := await reader.read(65536):
                    response += data
                return bytes(response)
        except NotFound:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def remove_checkpoints(rt: Runtime, session_id: str) -> None:
    """The session's checkpoints (they outlive it), newest first: later ones may depend
    on earlier ones."""
    for checkpoint in reversed(rt.store.list_checkpoints(session_id=session_id)):
        await rt.remove_checkpoint(checkpoint.id)


def test_five_steps_diff_preview_undo_and_history() -> None:
    async def main() -> None:
        rt = Runtime.open()
        sb = await AsyncSandbox.create(history=True, runtime=rt)
        try:
            await sb.files.write("/root/app/notes.txt", "keep me\n")  # 1
            await sb.files.write("/root/app/server.py", SERVER)  # 2
            server = await sb.commands.run(  # 3
                ["python3", "-S", "/root/app/server.py"], background=True
            )
            assert (await get(rt, sb.id)).endswith(b"ok\n")
            await sb.commands.run("mkdir -p /root/app/logs && echo up > /root/app/logs/run")  # 4
            done = await sb.commands.run(f"rm /root/app/notes.txt && kill {server.pid}")  # 5
            assert done.exit_code == 0, done.stderr

            # What the last step did: exactly the file and the server (and its port).
            diff = await sb.diff()
            assert [(f.path, f.change) for f in diff.files] == [("/root/app/notes.txt", "removed")]
            command = "python3 -S /root/app/server.py"
            assert [(p.change, p.pid, p.command) for p in diff.processes] == [
                ("gone", server.pid, command)
            ]
            assert [(p.change, p.port, p.pid) for p in diff.ports] == [("closed", PORT, server.pid)]

            # The CLI's preview says the same, and changes nothing.
            preview = await asyncio.to_thread(forkpoint, "rollback", sb.id, "--dry-run")
            assert [(f["path"], f["change"]) for f in preview["files"]] == [
                ("/root/app/notes.txt", "removed")
            ]
            assert [(p["change"], p["pid"]) for p in preview["processes"]] == [("gone", server.pid)]
            assert not any(p.pid == server.pid for p in await sb.commands.ps())

            steps = await sb.history()
            assert [s.label for s in steps] == [
                "write /root/app/notes.txt",
                "write /root/app/server.py",
                command,
                "mkdir -p /root/app/logs && echo up > /root/app/logs/run",
                f"rm /root/app/notes.txt && kill {server.pid}",
            ]
            assert all(s.automatic and s.size_bytes > 0 for s in steps)
            listed = await asyncio.to_thread(forkpoint, "history", sb.id)
            assert [s["checkpoint"] for s in listed] == [s.checkpoint for s in steps]

            # Undo the last two steps: the file and the server (same PID) are back,
            # what step 4 made is gone.
            await sb.undo(steps=2)
            assert await sb.files.read_text("/root/app/notes.txt") == "keep me\n"
            running = {p.pid: p.cmd for p in await sb.commands.ps()}
            assert running.get(server.pid) == command
            assert (await get(rt, sb.id)).endswith(b"ok\n")
            with pytest.raises(NotFound):
                await sb.files.read("/root/app/logs/run")
            after = await sb.history()
            assert [s.checkpoint for s in after] == [s.checkpoint for s in steps[:3]]

            # Undo is bounded by the steps there are; a session without history has none.
            with pytest.raises(Conflict):
                await sb.undo(steps=9)
        finally:
            await sb.kill()
            await remove_checkpoints(rt, sb.id)
            rt.close()

    asyncio.run(main())


def test_retention_keeps_the_last_k_and_what_forks_use() -> None:
    async def main() -> None:
        rt = Runtime.open()
        session = await rt.create(history=True, history_keep=2)
        forks: list[str] = []
        try:
            await rt.exec(session.id, "echo 1 > /root/one")
            first = (await rt.history(session.id))[0]
            fork = (await rt.fork(first.checkpoint))[0]
            assert not isinstance(fork, Exception)
            forks.append(fork.id)
            for n in range(2, 5):
                await rt.exec(session.id, f"echo {n} > /root/n")
            steps = await rt.history(session.id)
            # The last two automatic checkpoints, plus the first: a fork runs from it.
            assert [s.label for s in steps] == [
                "echo 1 > /root/one", "echo 3 > /root/n", "echo 4 > /root/n"
            ]  # fmt: skip
            assert steps[0].forks == (fork.id,) and steps[1].forks == ()
            kept = {c.id for c in rt.store.list_checkpoints(session_id=session.id)}
            assert kept == {s.checkpoint for s in steps}  # the others are deleted
            assert all(rt.checkpoint_files(c).dir.is_dir() for c in kept)
            # A named checkpoint is listed too, and is not a step to undo.
            named = await rt.checkpoint(session.id, name=f"named-{session.id}")
            assert (await rt.history(session.id))[-1].label == f"checkpoint {named.name}"
            await rt.undo(session.id)
            assert (await rt.exec(session.id, "cat /root/n")).stdout == "3\n"
        finally:
            for sid in (*forks, session.id):
                await rt.remove(sid)
            await remove_checkpoints(rt, session.id)
            rt.close()

    asyncio.run(main())
