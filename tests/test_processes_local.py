"""The envd-like process model, tunnels and the new file ops, against the real agent run
locally (the harness of test_agent_local: the agent is a subprocess on a unix socket)."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import time
from pathlib import Path

import pytest

from forkpoint.agent_client import AgentClient
from forkpoint.agent_client.processes import ProcessStream
from forkpoint.errors import Conflict, InvalidInput, NotFound
from forkpoint.protocol import EventKind, PtySize
from test_agent_local import LocalAgent, guest_root, process_gone, run, wait_until

__all__ = ["guest_root"]  # the fixture, shared with test_agent_local

pytestmark = pytest.mark.timeout(120)

SH = "/bin/sh"


async def collect(stream: ProcessStream) -> tuple[bytes, bytes]:
    out, err = bytearray(), bytearray()
    while (item := await stream.next()) is not None:
        kind, data = item
        (out if kind == EventKind.STDOUT else err).extend(data)
    return bytes(out), bytes(err)


def test_start_streams_pid_first_then_output_then_exit(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        started = time.perf_counter()
        s = await c.start_process([SH, "-c", "echo $$; echo err >&2; sleep 0.2; echo two; exit 3"])
        pid = await s.started()
        first_ms = (time.perf_counter() - started) * 1000
        kind, data = await s.next() or (None, b"")
        assert (kind, data) == (EventKind.STDOUT, f"{pid}\n".encode())  # pid is the process
        out, err = await collect(s)
        assert (out, err) == (b"two\n", b"err\n")
        end = s.end()
        assert (end.pid, end.ended, end.exit_code, end.signal) == (pid, True, 3, None)
        print(f"start -> first event: {first_ms:.1f} ms")
        # env, cwd and tag are kept for list
        s = await c.start_process(
            [SH, "-c", "pwd; echo $FOO $HOME"], cwd=str(tmp_path), env={"FOO": "bar"}, tag="t1"
        )
        pid2 = await s.started()
        assert (await collect(s))[0] == f"{tmp_path}\nbar /root\n".encode()
        listed = {p.pid: p for p in await c.list_processes()}
        assert listed[pid2].tag == "t1" and listed[pid2].env == {"FOO": "bar"}
        assert not listed[pid2].running and listed[pid].exit_code == 3
        with pytest.raises(NotFound, match="command not found"):
            await (await c.start_process(["/no/such/binary"])).started()

    run(tmp_path, guest_root, body)


def test_stdin_send_and_close(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        s = await c.start_process(["cat"], stdin=True)
        pid = await s.started()
        await c.send_stdin(pid, b"hello ")
        assert await s.next() == (EventKind.STDOUT, b"hello ")
        await c.send_stdin(pid, b"world")
        await c.close_stdin(pid)
        assert (await collect(s))[0] == b"world" and s.end().exit_code == 0
        with pytest.raises(Conflict):
            await c.send_stdin(pid, b"late")
        s = await c.start_process(["sleep", "5"])
        pid = await s.started()
        with pytest.raises(Conflict, match="without stdin"):
            await c.send_stdin(pid, b"x")
        await c.signal_process(pid, "KILL")
        await collect(s)
        with pytest.raises(NotFound):
            await c.send_stdin(12345678, b"x")

    run(tmp_path, guest_root, body)


def test_detach_keeps_it_running_and_attach_resumes(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        marker = tmp_path / "go"
        script = f"echo before; while [ ! -e {marker} ]; do sleep 0.05; done; echo after; exit 7"
        s = await c.start_process([SH, "-c", script])
        pid = await s.started()
        assert await s.next() == (EventKind.STDOUT, b"before\n")
        await s.detach()
        assert not process_gone(pid)
        # A second host connection: the process and its table outlive the first.
        await c.close()
        c2 = await agent.client()
        try:
            a = await c2.attach_process(pid)
            assert await a.started() == pid
            marker.touch()
            assert (await collect(a))[0] == b"after\n" and a.end().exit_code == 7
            late = await c2.attach_process(pid)  # ended: start + end at once
            assert await late.started() == pid and await late.next() is None
            assert (late.end().ended, late.end().exit_code) == (True, 7)
            with pytest.raises(NotFound):
                await (await c2.attach_process(99999999)).started()
        finally:
            await c2.close()

    run(tmp_path, guest_root, body)


def test_timeout_and_signal_kill_the_group(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        s = await c.start_process([SH, "-c", "sleep 30 & echo $!; wait"], timeout=0.5)
        pid = await s.started()
        await s.detach()  # nobody attached: the deadline still applies
        child = 0
        a = await c.attach_process(pid)
        await a.started()
        await collect(a)
        end = a.end()
        assert (end.exit_code, end.signal) == (137, 9)
        listed = {p.pid: p for p in await c.list_processes()}
        assert not listed[pid].running
        s = await c.start_process([SH, "-c", "echo $$; exec sleep 30"])
        pid = await s.started()
        child = pid
        await c.signal_process(pid, signal.SIGTERM)
        await collect(s)
        assert (s.end().exit_code, s.end().signal) == (128 + 15, 15)
        assert await wait_until(lambda: process_gone(child))
        with pytest.raises(NotFound):
            await c.signal_process(pid, "KILL")

    run(tmp_path, guest_root, body)


def test_slow_reader_gets_everything_with_bounded_queue(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        size = 8 * 1024 * 1024
        s = await c.start_process([SH, "-c", f"head -c {size} /dev/zero"])
        await s.started()
        got = 0
        while (item := await s.next()) is not None:
            got += len(item[1])
            if got < 2 * 1024 * 1024:
                await asyncio.sleep(0.001)  # slow consumer: the agent waits for credit
        assert got == size and s.end().exit_code == 0
        # Meanwhile, other requests on the connection were not blocked.
        assert (await c.exec("echo ok")).stdout == b"ok\n"

    run(tmp_path, guest_root, body)


def test_tunnel_echo_both_ways_and_eof(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.write_eof()
            await w.drain()
            w.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            payload = os.urandom(6 * 1024 * 1024)
            started = time.perf_counter()
            async with c.tunnel(port) as (reader, writer):

                async def send() -> None:
                    for i in range(0, len(payload), 100_000):
                        writer.write(payload[i : i + 100_000])
                        await writer.drain()
                    writer.write_eof()

                async def receive() -> bytes:
                    got = bytearray()
                    while data := await reader.read(1 << 20):
                        got += data
                    return bytes(got)

                _, echoed = await asyncio.gather(send(), receive())
            seconds = time.perf_counter() - started
            assert echoed == payload
            print(f"tunnel echo: {2 * len(payload) / seconds / 1e6:.1f} MB/s both ways")

            # several at once on one connection
            async def one(i: int) -> bytes:
                async with c.tunnel(port) as (reader, writer):
                    writer.write(b"x%d" % i)
                    writer.write_eof()
                    return await reader.read()

            assert await asyncio.gather(*(one(i) for i in range(5))) == [
                b"x%d" % i for i in range(5)
            ]
        finally:
            server.close()
            await server.wait_closed()
        with pytest.raises(NotFound, match=f"nothing listens on guest port {port}"):
            async with c.tunnel(port):
                pass

    run(tmp_path, guest_root, body)


def test_file_ops_owner_depth_make_dir_rename(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        root = tmp_path / "tree"
        assert await c.make_dir(str(root / "a" / "b")) is True
        assert await c.make_dir(str(root / "a" / "b")) is False
        await c.write_file(str(root / "a" / "f.txt"), b"hi")
        os.symlink("f.txt", root / "a" / "link")
        entries = await c.list_dir(str(root), depth=3)
        by_path = {e.path: e for e in entries}
        me = pwd.getpwuid(os.getuid()).pw_name
        assert set(by_path) == {f"{root}/a", f"{root}/a/b", f"{root}/a/f.txt", f"{root}/a/link"}
        assert by_path[f"{root}/a/f.txt"].owner == me
        assert by_path[f"{root}/a/link"].target == "f.txt"
        assert [e.name for e in await c.list_dir(str(root))] == ["a"]
        st = await c.stat(str(root / "a" / "link"), follow_symlinks=False)
        assert st.type == "symlink" and st.target == "f.txt" and st.owner == me
        await c.rename(str(root / "a" / "f.txt"), str(root / "g.txt"))
        assert (root / "g.txt").read_bytes() == b"hi"
        with pytest.raises(NotFound):
            await c.rename(str(root / "missing"), str(root / "x"))
        with pytest.raises(NotFound, match="no such user"):
            await c.make_dir(str(root / "c"), user="nosuchuser")

    run(tmp_path, guest_root, body)


def test_file_metadata_is_kept_listed_renamed_and_replaced_by_a_write(
    tmp_path: Path, guest_root: Path
) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        path = str(tmp_path / "m.txt")
        await c.write_file(path, b"one", metadata={"Author": "mish", "purpose": "up load"})
        assert os.getxattr(path, "user.e2b.author") == b"mish"  # E2B's attribute names
        expected = {"author": "mish", "purpose": "up load"}
        assert (await c.stat(path)).metadata == expected
        listed = {e.name: e for e in await c.list_dir(str(tmp_path))}
        assert listed["m.txt"].metadata == expected
        await c.rename(path, str(tmp_path / "n.txt"))
        assert (await c.stat(str(tmp_path / "n.txt"))).metadata == expected
        await c.write_file(str(tmp_path / "n.txt"), b"two")  # a new file: no old metadata
        assert (await c.stat(str(tmp_path / "n.txt"))).metadata is None
        with pytest.raises(InvalidInput, match="metadata key"):
            await c.write_file(path, b"x", metadata={"bad key": "v"})
        with pytest.raises(InvalidInput, match="printable"):
            await c.write_file(path, b"x", metadata={"k": "caf\u00e9"})

    run(tmp_path, guest_root, body)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_user_runs_as_that_user_and_owns_its_files(tmp_path: Path, guest_root: Path) -> None:
    try:
        acct = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' account on this host")

    async def body(agent: LocalAgent, c: AgentClient) -> None:
        s = await c.start_process(  # its home, the default cwd, does not exist here
            ["/bin/sh", "-c", "id -un; echo $HOME $USER"], user="nobody", cwd="/"
        )
        await s.started()
        out, _ = await collect(s)
        assert out.decode().split() == ["nobody", acct.pw_dir, "nobody"]
        target = tmp_path / "new" / "dir" / "f"
        await c.write_file(str(target), b"x", user="nobody")
        assert os.stat(target).st_uid == acct.pw_uid
        assert os.stat(target.parent).st_uid == acct.pw_uid and os.stat(tmp_path).st_uid == 0
        os.chmod(tmp_path, 0o755)
        with pytest.raises(Exception, match="may not write"):
            await c.rename(str(target), str(tmp_path / "moved"), user="nobody")

    run(tmp_path, guest_root, body)


async def _pty_output_until(s: ProcessStream, needle: bytes) -> bytes:
    seen = b""
    while needle not in seen:
        item = await s.next()
        assert item is not None, f"ended before {needle!r}: {seen!r}"
        assert item[0] == EventKind.PTY
        seen += item[1]
    return seen


def test_a_pty_is_the_controlling_terminal_types_in_and_resizes(
    tmp_path: Path, guest_root: Path
) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        # A shell reading commands from its terminal, which it owns (job control).
        s = await c.start_process(["/bin/sh"], pty=PtySize(80, 24), env={"PS1": "$ "})
        pid = await s.started()
        await c.send_stdin(pid, b"stty size; echo tty=$(tty) term=$TERM; echo $((40+2))done\n")
        seen = await _pty_output_until(s, b"42done")  # the echo of the line says $((40+2))
        assert b"24 80" in seen and b"term=xterm-256color" in seen
        assert b"tty=/dev/pts/" in seen
        # A resize reaches the program: the kernel has the size, and sends SIGWINCH.
        await c.send_stdin(pid, b"trap 'echo winched' WINCH\n")
        await c.resize_process(pid, PtySize(100, 30))
        await c.send_stdin(pid, b"stty size\n")
        assert b"winched" in await _pty_output_until(s, b"30 100")
        with pytest.raises(Conflict, match="terminal"):
            await c.close_stdin(pid)
        listed = {p.pid: p for p in await c.list_processes()}
        assert listed[pid].pty
        # ^C goes to the foreground job, not to the shell; exit ends it with its code.
        await c.send_stdin(pid, b"sleep 30\n")
        await asyncio.sleep(0.3)
        await c.send_stdin(pid, b"\x03")
        await c.send_stdin(pid, b"exit 5\n")
        while await s.next() is not None:
            pass
        assert s.end().exit_code == 5
        with pytest.raises(Conflict, match="ended"):
            await c.resize_process(pid, PtySize(80, 24))
        with pytest.raises(Conflict, match="ended"):
            await c.send_stdin(pid, b"x")
        # A process without a PTY cannot be resized.
        plain = await c.start_process(["sleep", "5"])
        plain_pid = await plain.started()
        with pytest.raises(Conflict, match="without a PTY"):
            await c.resize_process(plain_pid, PtySize(80, 24))
        await c.signal_process(plain_pid, "KILL")
        await collect(plain)

    run(tmp_path, guest_root, body)
