"""The real in-guest agent, run on the host over a unix socket, driven by AgentClient.

The agent runs from a copy of just ``forkpoint/{protocol,guest}`` with ``python -S``, as
in the guest rootfs, which also proves it needs nothing beyond the stdlib.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import resource
import secrets
import shutil
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest

import forkpoint
from forkpoint.agent_client import AgentClient, fresh_identity
from forkpoint.config import Home
from forkpoint.errors import AgentError, CommandTimeout, Conflict, InvalidInput, NotFound
from forkpoint.protocol import (
    CHUNK_BYTES,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    SYNC,
    SYNC_MAGIC,
    FrameDecoder,
    encode_frame,
    parse_reply,
    request_message,
)
from forkpoint.runtime.guest.agents import AgentPool
from forkpoint.store import global_lock, global_lock_async

pytestmark = pytest.mark.timeout(120)  # generous: CI shares 2 cores with VMs


@pytest.fixture(scope="session")
def guest_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``/opt/forkpoint`` as the image builder lays it out."""
    root = tmp_path_factory.mktemp("opt-forkpoint")
    src = Path(forkpoint.__file__).parent
    pkg = root / "forkpoint"
    pkg.mkdir()
    shutil.copy(src / "__init__.py", pkg)
    for sub in ("protocol", "guest"):
        (pkg / sub).mkdir()
        for f in (src / sub).glob("*.py"):
            shutil.copy(f, pkg / sub)
    return root


class LocalAgent:
    """The agent subprocess plus the socket it connects to (one connection per 'host')."""

    def __init__(self, workdir: Path, guest_root: Path) -> None:
        self.workdir = workdir
        self.guest_root = guest_root
        self.sock = str(workdir / "agent.sock")
        self.conns: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        self.writers: list[asyncio.StreamWriter] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.conns = asyncio.Queue()

        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.writers.append(w)
            await self.conns.put((r, w))

        self.server = await asyncio.start_unix_server(on_conn, self.sock)
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-m", "forkpoint.guest.agent", "--connect-unix", self.sock]
            + ["--log-dir", str(self.workdir / "logs"), "--identity-dry-run"],
            env={"PYTHONPATH": str(self.guest_root), "PATH": os.environ.get("PATH", "")},
            cwd=self.workdir,
        )

    async def accept(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(self.conns.get(), 10)

    async def client(
        self, *, timeout: float = 10.0, request_timeout: float | None = 60.0
    ) -> AgentClient:
        reader, writer = await self.accept()
        return await AgentClient.over_streams(
            reader, writer, label="test-agent", timeout=timeout, request_timeout=request_timeout
        )

    async def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        # A connection the agent made just before it died may still be mid-accept (asyncio
        # accepts in a task of its own, which fails without closing the socket if the server
        # closed meanwhile): let those finish first, or the socket leaks and its ResourceWarning
        # fails whichever test happens to run next.
        await asyncio.sleep(0)  # accepts what is still in the listen backlog
        in_flight = asyncio.all_tasks() - {asyncio.current_task()}
        if in_flight:
            await asyncio.wait(in_flight, timeout=1)
        if self.server is not None:
            self.server.close()
        for w in self.writers:
            w.close()
        for w in self.writers:  # closed for real before the loop ends (no ResourceWarning)
            with contextlib.suppress(OSError):
                await w.wait_closed()
        if self.server is not None:
            await self.server.wait_closed()


def run(
    tmp_path: Path, guest_root: Path, body: Callable[[LocalAgent, AgentClient], Awaitable[None]]
) -> None:
    async def main() -> None:
        agent = LocalAgent(tmp_path, guest_root)
        await agent.start()
        try:
            client = await agent.client()
            try:
                await body(agent, client)
            finally:
                await client.close()
        finally:
            await agent.stop()

    asyncio.run(main())


def process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # gone between open and read
        return True


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.02)
    return cond()


# -- exec ----------------------------------------------------------------------------------


def test_hello_and_exec_exit_codes(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        assert c.info is not None and agent.proc is not None
        assert c.info.pid == agent.proc.pid and c.info.protocol_version == PROTOCOL_VERSION
        assert (await c.hello()).pid == agent.proc.pid
        for code in (0, 1, 42):
            r = await c.exec(f"exit {code}")
            assert (r.exit_code, r.signal) == (code, None)
        r = await c.exec("kill -9 $$")
        assert (r.exit_code, r.signal) == (137, 9)
        r = await c.exec("echo out; echo err >&2; echo more", cwd=str(tmp_path))
        assert (r.stdout, r.stderr) == (b"out\nmore\n", b"err\n")
        r = await c.exec(["/bin/echo", "a b", "$HOME"])
        assert r.stdout == b"a b $HOME\n" and r.duration_ms >= 0 and r.pid > 0
        r = await c.exec("pwd; echo $FOO; echo $PATH", cwd=str(tmp_path), env={"FOO": "bar"})
        lines = r.stdout_text.splitlines()
        assert lines[0] == str(tmp_path) and lines[1] == "bar" and "/usr/bin" in lines[2]
        assert "PYTHONPATH" not in (await c.exec("env")).stdout_text  # the agent's env stays
        data = os.urandom(300_000)
        assert (await c.exec(["cat"], stdin=data)).stdout == data

    run(tmp_path, guest_root, body)


def test_exec_streams_and_caps_output(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        out: list[bytes] = []
        err: list[bytes] = []

        async def on_out(b: bytes) -> None:
            out.append(b)

        async def on_err(b: bytes) -> None:
            err.append(b)

        r = await c.exec(
            "echo one; echo two >&2; sleep 0.1; echo three",
            on_stdout=on_out,
            on_stderr=on_err,
        )
        assert b"".join(out) == r.stdout == b"one\nthree\n"
        assert b"".join(err) == r.stderr == b"two\n"
        out.clear()
        r = await c.exec("head -c 3000000 /dev/zero", on_stdout=on_out)
        assert r.truncated and len(r.stdout) == 1024 * 1024
        assert sum(map(len, out)) == 3_000_000
        # A background child holding the pipes open does not hang exec.
        t0 = time.monotonic()
        r = await c.exec(f"sleep 30 & echo $! > {tmp_path}/bg.pid; echo done")
        assert r.stdout == b"done\n" and time.monotonic() - t0 < 5
        os.kill(int((tmp_path / "bg.pid").read_text()), 9)

    run(tmp_path, guest_root, body)


def test_exec_timeout_kills_the_process_group(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        t0 = time.monotonic()
        with pytest.raises(CommandTimeout, match="timed out after 1 s") as exc:
            await c.exec(
                f"sleep 300 & echo $! > {tmp_path}/bg.pid; echo $$ > {tmp_path}/fg.pid; wait",
                timeout=1,
            )
        assert exc.value.timeout_s == 1 and "sleep 300" in exc.value.command
        assert time.monotonic() - t0 < 5
        for name in ("fg.pid", "bg.pid"):
            pid = int((tmp_path / name).read_text())
            assert await wait_until(partial(process_gone, pid)), f"{name} survived"
        assert (await c.exec("echo still here")).stdout == b"still here\n"

    run(tmp_path, guest_root, body)


def test_bad_commands_get_clear_errors(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        with pytest.raises(NotFound, match="command not found: no-such-cmd-xyz"):
            await c.exec(["no-such-cmd-xyz", "arg"])
        assert (await c.exec(["true"])).exit_code == 0
        with pytest.raises(NotFound, match="command not found"):
            await c.exec(["/no/such/binary"])
        with pytest.raises(NotFound, match="working directory not found"):
            await c.exec(["true"], cwd=str(tmp_path / "missing"))
        (tmp_path / "f").write_text("x")
        with pytest.raises(InvalidInput, match="not a directory"):
            await c.exec(["true"], cwd=str(tmp_path / "f"))
        with pytest.raises(InvalidInput, match="permission denied"):
            await c.exec([str(tmp_path / "f")])
        assert (await c.exec("no-such-cmd-xyz")).exit_code == 127  # the shell's answer
        with pytest.raises(InvalidInput, match="absolute"):
            await c.exec("true", cwd="relative")
        with pytest.raises(InvalidInput, match="argv must not be empty"):
            await c.exec([])
        with pytest.raises(InvalidInput, match="timeout"):
            await c.exec("true", timeout=-1)
        assert (await c.exec(["echo", "ok"])).stdout == b"ok\n"

    run(tmp_path, guest_root, body)


def test_many_concurrent_execs_on_one_connection(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        t0 = time.monotonic()
        results = await asyncio.gather(
            *(c.exec(f"sleep 0.3; echo {i}; echo e{i} >&2") for i in range(40))
        )
        assert time.monotonic() - t0 < 6  # 40 x 0.3 s one after the other would be 12 s
        for i, r in enumerate(results):
            assert (r.stdout, r.stderr, r.exit_code) == (f"{i}\n".encode(), f"e{i}\n".encode(), 0)
        data = await asyncio.gather(c.ps(), c.stat(str(tmp_path)), c.exec("echo x"))
        assert data[2].stdout == b"x\n"

    run(tmp_path, guest_root, body)


# -- files ---------------------------------------------------------------------------------


def test_100mib_file_round_trip_with_bounded_memory(tmp_path: Path, guest_root: Path) -> None:
    size = 100 * 1024 * 1024
    src, back = tmp_path / "src.bin", tmp_path / "back.bin"
    digest = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(size // (1024 * 1024)):
            block = os.urandom(1024 * 1024)
            digest.update(block)
            f.write(block)

    async def body(agent: LocalAgent, c: AgentClient) -> None:
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        tracemalloc.start()
        try:
            t0 = time.monotonic()
            with open(src, "rb") as f:
                n = await c.write_file(str(tmp_path / "guest" / "dir" / "copy.bin"), f, mode=0o600)
            assert n == size
            with open(back, "wb") as out:
                assert (
                    await c.read_file_to(str(tmp_path / "guest" / "dir" / "copy.bin"), out) == size
                )
            elapsed = time.monotonic() - t0
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
        assert peak < 16 * 1024 * 1024, f"client peak {peak} bytes"
        assert rss_growth < 32 * 1024, f"client max RSS grew by {rss_growth} KiB"
        with open(f"/proc/{c.info.pid if c.info else 0}/status") as status:
            hwm_kib = int(next(ln for ln in status if ln.startswith("VmHWM")).split()[1])
        assert hwm_kib < 80 * 1024, f"agent peak RSS {hwm_kib} KiB"
        st = await c.stat(str(tmp_path / "guest" / "dir" / "copy.bin"))
        assert (st.size, st.mode, st.type) == (size, 0o600, "file")
        print(f"100 MiB up+down in {elapsed:.2f} s, agent peak RSS {hwm_kib // 1024} MiB")

    run(tmp_path, guest_root, body)
    check = hashlib.sha256()
    with open(back, "rb") as fin:
        while block := fin.read(1024 * 1024):
            check.update(block)
    assert check.hexdigest() == digest.hexdigest()
    leftovers = [p.name for p in (tmp_path / "guest" / "dir").iterdir()]
    assert leftovers == ["copy.bin"]


def test_file_ops_and_errors(tmp_path: Path, guest_root: Path) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        base = tmp_path / "g"
        assert await c.write_file(str(base / "a" / "b.txt"), b"hello") == 5
        assert await c.read_file(str(base / "a" / "b.txt")) == b"hello"
        assert await c.write_file(str(base / "a" / "b.txt"), b"") == 0  # replace, empty
        assert await c.read_file(str(base / "a" / "b.txt")) == b""
        await c.write_file(str(base / "x.sh"), b"#!/bin/sh\necho hi\n", mode=0o755)
        assert (await c.exec([str(base / "x.sh")])).stdout == b"hi\n"
        entries = await c.list_dir(str(base))
        assert [(e.name, e.type) for e in entries] == [("a", "dir"), ("x.sh", "file")]
        assert entries[1].mode == 0o755 and entries[1].size == 18
        os.symlink(base / "x.sh", base / "link")
        assert (await c.stat(str(base / "link"), follow_symlinks=False)).type == "symlink"
        assert (await c.stat(str(base / "link"))).type == "file"
        missing = str(base / "missing")
        for call in (
            c.read_file(missing),
            c.list_dir(missing),
            c.stat(missing),
            c.remove(missing),
        ):
            with pytest.raises(NotFound, match="no such file or directory"):
                await call
        with pytest.raises(InvalidInput, match="is a directory"):
            await c.read_file(str(base))
        with pytest.raises(InvalidInput, match="is a directory"):
            await c.write_file(str(base / "a"), b"x")
        with pytest.raises(InvalidInput, match="not a directory"):
            await c.list_dir(str(base / "x.sh"))
        with pytest.raises(InvalidInput, match="not a regular file"):
            await c.read_file("/dev/zero")
        with pytest.raises(NotFound):
            await c.write_file(str(base / "nodir" / "f"), b"x", make_parents=False)
        with pytest.raises(InvalidInput, match="absolute"):
            await c.read_file("relative/path")
        with pytest.raises(InvalidInput, match="directory not empty"):
            await c.remove(str(base / "a"), recursive=False)
        assert (await c.remove(str(base / "link"))).type == "symlink"
        assert (await c.remove(str(base / "a"))).type == "dir"
        assert not (base / "a").exists() and (base / "x.sh").exists()
        with pytest.raises(InvalidInput, match="refusing to remove /"):
            await c.remove("/")
        assert await c.read_file(str(base / "x.sh")) == b"#!/bin/sh\necho hi\n"
        assert [p.name for p in base.iterdir()] == ["x.sh"]  # no temp files left

    run(tmp_path, guest_root, body)


# -- processes -----------------------------------------------------------------------------


def test_spawn_survives_the_client_and_ps_kill(tmp_path: Path, guest_root: Path) -> None:
    async def main() -> None:
        agent = LocalAgent(tmp_path, guest_root)
        await agent.start()
        try:
            c1 = await agent.client()
            sp = await c1.spawn("echo started; echo oops >&2; exec sleep 60", cwd=str(tmp_path))
            assert sp.log_path == str(tmp_path / "logs" / f"{sp.pid}.log")
            await c1.close()  # the host goes away; the agent reconnects
            async with await agent.client() as c2:
                assert c2.info is not None and agent.proc is not None
                assert c2.info.pid == agent.proc.pid  # the same agent process
                for _ in range(250):  # the shell execs sleep when it gets to run
                    procs = {p.pid: p for p in await c2.ps()}
                    if procs[sp.pid].cmd == "sleep 60":
                        break
                    await asyncio.sleep(0.02)
                assert procs[sp.pid].cmd == "sleep 60"
                assert procs[sp.pid].ppid == agent.proc.pid
                assert "forkpoint.guest.agent" in procs[agent.proc.pid].cmd
                assert os.getsid(sp.pid) == sp.pid  # its own session
                assert await wait_until(lambda: b"oops" in Path(sp.log_path).read_bytes())
                assert await c2.read_file(sp.log_path) == b"started\noops\n"
                with pytest.raises(NotFound, match="command not found"):
                    await c2.spawn(["no-such-cmd-xyz"])
                await c2.kill(sp.pid, "KILL")
                assert await wait_until(lambda: process_gone(sp.pid))

                async def gone_from_ps() -> bool:
                    return sp.pid not in {p.pid for p in await c2.ps()}

                for _ in range(100):
                    if await gone_from_ps():  # reaped by the agent: no zombie
                        break
                    await asyncio.sleep(0.02)
                assert await gone_from_ps()
                with pytest.raises(NotFound, match="no such process"):
                    await c2.kill(sp.pid)
                with pytest.raises(InvalidInput, match="pid must be > 1"):
                    await c2.kill(1)
                with pytest.raises(InvalidInput, match="agent itself"):
                    await c2.kill(agent.proc.pid)
                with pytest.raises(InvalidInput, match="unknown signal"):
                    await c2.kill(sp.pid, "NOPE")
        finally:
            await agent.stop()

    asyncio.run(main())


def test_restore_identity_validates_without_touching_the_host(
    tmp_path: Path, guest_root: Path
) -> None:
    # The local agent runs with --identity-dry-run: never change this host's clock.
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        now = time.time_ns()
        r = await c.restore_identity(now, os.urandom(64), "fork-1")
        assert r.dry_run and not r.clock_set and r.entropy_bytes == 64
        assert r.hostname == "fork-1" and abs(r.clock_delta_ns) < 10 * 10**9
        with pytest.raises(InvalidInput, match="entropy"):
            await c.restore_identity(now, b"short")
        with pytest.raises(InvalidInput, match="time_ns"):
            await c.restore_identity(12, os.urandom(64))
        with pytest.raises(InvalidInput, match="hostname"):
            await c.restore_identity(now, os.urandom(64), "not a hostname")

    run(tmp_path, guest_root, body)


def test_hello_applies_the_identity_it_carries_and_reports_its_token(
    tmp_path: Path, guest_root: Path
) -> None:
    async def body(agent: LocalAgent, c: AgentClient) -> None:
        assert c.info is not None and c.info.identity_token is None
        await c.close()
        for token in ("s-1:0", "s-1:0", "s-1:1"):
            reader, writer = await agent.accept()
            identity = fresh_identity(token, "fork-1")
            async with await AgentClient.over_streams(reader, writer, identity=identity) as c2:
                assert c2.info is not None and c2.info.identity_token == token
        reader, writer = await agent.accept()
        async with await AgentClient.over_streams(reader, writer) as plain:
            assert plain.info is not None and plain.info.identity_token == "s-1:1"

    run(tmp_path, guest_root, body)


# -- the channel ---------------------------------------------------------------------------


async def read_replies(
    reader: asyncio.StreamReader, dec: FrameDecoder, n: int
) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    while len(out) < n:
        item = dec.next()
        if item is None:
            data = await asyncio.wait_for(reader.read(65536), 10)
            assert data, "agent closed the connection"
            dec.feed(data)
        elif item is not SYNC:
            assert isinstance(item, dict)
            out.append(item)
    return out


def test_malformed_and_oversized_frames_get_errors(tmp_path: Path, guest_root: Path) -> None:
    async def main() -> None:
        agent = LocalAgent(tmp_path, guest_root)
        await agent.start()
        try:
            reader, writer = await agent.accept()
            dec = FrameDecoder(require_sync=True)

            def frame(payload: bytes) -> bytes:
                return struct.pack(">I", len(payload)) + payload

            writer.write(b"junk before sync" + SYNC_MAGIC)
            writer.write(frame(b"not json at all"))
            writer.write(frame(b'["a list"]'))
            writer.write(struct.pack(">I", MAX_FRAME_BYTES + 1) + b"x" * (MAX_FRAME_BYTES + 1))
            writer.write(frame(b'{"id": 5, "op": 3}'))
            writer.write(encode_frame(request_message(6, "no_such_op", {})))
            writer.write(encode_frame(request_message(7, "exec", {"shell": 1})))
            writer.write(encode_frame(request_message(8, "exec", {"bogus": True})))
            writer.write(
                encode_frame(request_message(9, "restore_identity", {"time_ns": 1, "entropy": ""}))
            )
            writer.write(encode_frame(request_message(10, "exec", {"argv": ["echo", "alive"]})))
            await writer.drain()
            replies = await read_replies(reader, dec, 9)
            by_id = {r["id"]: parse_reply(r) for r in replies if r["id"] is not None}
            anonymous = [parse_reply(r) for r in replies if r["id"] is None]
            messages = [str(getattr(a, "error", None)) for a in anonymous]
            assert len(anonymous) == 3, messages
            assert "not valid JSON" in messages[0]
            assert "JSON object" in messages[1]
            assert "exceeds the maximum" in messages[2]
            codes = {i: getattr(getattr(r, "error", None), "code", None) for i, r in by_id.items()}
            assert codes == {
                5: "protocol_error",
                6: "unknown_op",
                7: "invalid_input",
                8: "invalid_input",
                9: "invalid_input",
                10: None,
            }
            ok = by_id[10]
            assert getattr(ok, "result", {})["stdout"] == "YWxpdmUK"  # "alive\n"
            writer.close()
            # A host that vanished mid-frame: the next connection starts clean.
            reader2, writer2 = await agent.accept()
            writer2.write(b"\x00\x00\x10\x00{partial")
            await writer2.drain()
            async with await AgentClient.over_streams(reader2, writer2, timeout=5) as c:
                assert (await c.exec("echo fine")).stdout == b"fine\n"
        finally:
            await agent.stop()

    asyncio.run(main())


def test_reconnects_start_clean(tmp_path: Path, guest_root: Path) -> None:
    async def main() -> None:
        agent = LocalAgent(tmp_path, guest_root)
        await agent.start()
        try:
            c1 = await agent.client()
            slow = asyncio.create_task(c1.exec("sleep 0.5; echo late"))
            await asyncio.sleep(0.1)
            await c1.close()
            with pytest.raises(AgentError, match="closed"):
                await slow
            with pytest.raises(AgentError, match="closed"):
                await c1.exec("true")
            for _ in range(3):
                async with await agent.client() as c:
                    r = await c.exec("echo $$")
                    assert r.exit_code == 0
            await asyncio.sleep(0.6)  # the stale 'late' answer must not leak anywhere
            async with await agent.client() as c:
                assert (await c.exec(["echo", "new"])).stdout == b"new\n"
        finally:
            await agent.stop()

    asyncio.run(main())


def test_connect_by_path_retries_and_times_out(tmp_path: Path, guest_root: Path) -> None:
    """``connect`` retries until QEMU's socket shows up; relays to the local agent."""

    async def main() -> None:
        path = str(tmp_path / "qemu-agent.sock")
        t0 = time.monotonic()
        with pytest.raises(AgentError, match="cannot connect"):
            await AgentClient.connect(path, timeout=0.3)
        assert time.monotonic() - t0 < 2

        accepted: list[asyncio.StreamWriter] = []

        async def say_nothing(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            accepted.append(w)

        silent = await asyncio.start_unix_server(say_nothing, path)
        with pytest.raises(AgentError, match="handshake"):
            await AgentClient.connect(path, timeout=0.5)
        for w in accepted:
            w.close()
        silent.close()
        await silent.wait_closed()
        # Python 3.13's asyncio removes the socket file when the server closes; 3.11 leaves it.
        Path(path).unlink(missing_ok=True)

        agent = LocalAgent(tmp_path, guest_root)
        await agent.start()
        relays: list[asyncio.StreamWriter] = []

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()

        async def on_host(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            ar, aw = await agent.accept()
            relays.extend([w, aw])
            await asyncio.gather(pipe(r, aw), pipe(ar, w), return_exceptions=True)

        async def late_server() -> asyncio.Server:
            await asyncio.sleep(0.3)  # like QEMU creating its socket after a restore
            return await asyncio.start_unix_server(on_host, path)

        server_task = asyncio.create_task(late_server())
        try:
            async with await AgentClient.connect(path, timeout=10) as c:
                assert (await c.exec("echo via qemu")).stdout == b"via qemu\n"
        finally:
            server = await server_task
            for w in relays:
                w.close()
            server.close()
            await server.wait_closed()
            await agent.stop()

    asyncio.run(main())


# -- the runtime's agent pool: one connection per session ---------------------------------


def test_agent_pool_shares_one_connection_per_session(tmp_path: Path, guest_root: Path) -> None:
    home = Home(tmp_path / "home")
    lock = "agent-s-1"

    def lock_is_free() -> bool:
        try:
            with global_lock(home, "agent-s-1", timeout_s=0):
                return True
        except Conflict:
            return False

    async def main() -> None:
        agent = LocalAgent(tmp_path, guest_root)
        await agent.start()
        pool = AgentPool(lambda sid: global_lock_async(home, f"agent-{sid}", timeout_s=5))
        connects = 0

        async def connect() -> AgentClient:
            nonlocal connects
            connects += 1
            return await agent.client()

        async def long_exec() -> bytes:
            async with pool.use("s-1", 0, connect) as c:
                return (await c.exec("sleep 3; echo slept")).stdout

        try:
            (tmp_path / "f.txt").write_bytes(b"hello")
            running = asyncio.create_task(long_exec())
            await asyncio.sleep(0.5)  # the exec is under way
            async with pool.use("s-1", 0, connect) as c:
                started = time.monotonic()
                assert await c.read_file(str(tmp_path / "f.txt")) == b"hello"
                assert time.monotonic() - started < 1 and not running.done()
            assert connects == 1  # the read used the exec's connection
            assert pool.connected() == ["s-1"] and not lock_is_free()  # others wait
            assert await running == b"slept\n"
            # The last user left: hung up, and another process may connect.
            assert pool.connected() == [] and lock_is_free(), lock
            async with pool.use("s-1", 0, connect) as c:
                await c.hello()
            assert connects == 2

            async with pool.use("s-1", 0, connect) as broken:
                await broken.close()  # e.g. the VM went away
                async with pool.use("s-1", 0, connect) as fresh:
                    assert not fresh.closed and connects == 4
                    # rolled back (next generation): a new connection, the old one is closed
                    async with pool.use("s-1", 1, connect) as newer:
                        assert fresh.closed and connects == 5
                        await newer.hello()
                        # a caller that read the session before the rollback joins it
                        async with pool.use("s-1", 0, connect) as joined:
                            assert joined is newer and connects == 5
            assert pool.connected() == [] and lock_is_free()
        finally:
            await agent.stop()

    asyncio.run(main())


def test_scan_streams_a_tree_larger_than_a_chunk(tmp_path: Path, guest_root: Path) -> None:
    from forkpoint.runtime.inspection.diffs import parse_scan

    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(6000):  # random names: ≈ 0.5 MB compressed, several chunks
        (tree / f"{i}-{secrets.token_hex(60)}").write_bytes(b"")

    async def body(agent: LocalAgent, c: AgentClient) -> None:
        result = await c.scan([str(tree)], [])
        assert result.paths_bytes + result.numbers_bytes > CHUNK_BYTES  # several chunks
        assert result.count == 6001 and result.processes
        files = parse_scan(result).files
        assert len(files) == 6001 and files[str(tree)].kind == "dir"
        assert all(
            meta.kind == "file" and meta.size == 0 for p, meta in files.items() if p != str(tree)
        )

    run(tmp_path, guest_root, body)
