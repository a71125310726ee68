"""The SDK against a real ``forkpoint serve`` (unix socket): the flagship scenario, plus
embedded mode, the generated sync twin, and error mapping.

The server runs on the default ``$FORKPOINT_HOME`` (the guest image lives there).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from forkpoint.errors import CommandTimeout, ForkpointError, InvalidInput, NotFound, QemuError
from forkpoint.requests import ImageBuildRequest
from forkpoint.sdk import (
    AsyncCheckpoint,
    AsyncSandbox,
    AsyncTerminal,
    BackgroundProcess,
    Checkpoint,
    CommandResult,
    Sandbox,
)
from forkpoint.sdk._client import error_from_response

FORKPOINT = Path(sys.executable).with_name("forkpoint")
PAGE = "<h1>forkpoint flagship</h1>\n"
SERVER_START_S = 120.0  # python's http.server takes 10-20 s to start under TCG (more if busy)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    sock = tmp_path_factory.mktemp("sdk") / "api.sock"
    proc = subprocess.Popen(
        [str(FORKPOINT), "serve", "--socket", str(sock)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"forkpoint serve did not start: {proc.communicate()}")
            time.sleep(0.1)
        yield f"unix:{sock}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def vm_ready() -> None:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    from forkpoint.images import get_image

    try:
        get_image("default")
    except NotFound:
        pytest.skip("no default image: run `forkpoint image build`")


async def _fetch(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.get(url + "/", timeout=5)
    except httpx.TransportError:
        return None
    return response.text if response.status_code == 200 else None


async def _wait_serving(client: httpx.AsyncClient, url: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = await _fetch(client, url)
        if body is not None:
            return body
        await asyncio.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s:.0f} s")


async def _wait_silent(client: httpx.AsyncClient, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await _fetch(client, url) is None:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{url} still answers after {timeout_s:.0f} s")


async def _server_pids(sb: AsyncSandbox) -> list[int]:
    """Pids of the server (and of the ``sh -c`` that started it, if it still waits)."""
    return sorted(p.pid for p in await sb.commands.ps() if "http.server" in p.cmd)


@pytest.mark.vm
@pytest.mark.timeout(900)
def test_flagship_scenario(api: str, vm_ready: None) -> None:
    asyncio.run(_flagship(api))


async def _flagship(api: str) -> None:
    sb = await AsyncSandbox.create(ports=[8000], base_url=api)
    forks: list[AsyncSandbox | ForkpointError] = []
    ck: AsyncCheckpoint | None = None
    async with httpx.AsyncClient() as http:
        try:
            await sb.files.write("/app/index.html", PAGE)
            assert await sb.files.read_text("/app/index.html") == PAGE
            assert [e.name for e in await sb.files.list("/app")] == ["index.html"]
            started = await sb.commands.run(
                "python3 -m http.server 8000", background=True, cwd="/app"
            )
            assert isinstance(started, BackgroundProcess)
            url = sb.ports.url(8000)
            assert url is not None and url.startswith("http://127.0.0.1:")
            assert await sb.ports.forward(8000) == url  # idempotent
            assert await _wait_serving(http, url, SERVER_START_S) == PAGE
            pids = await _server_pids(sb)
            assert pids

            ck = await sb.checkpoint("serving")
            assert ck.info.session_id == sb.id
            forks = await ck.fork(3)
            assert all(isinstance(f, AsyncSandbox) for f in forks), forks
            fork_urls = set()
            for fork in forks:
                assert isinstance(fork, AsyncSandbox)
                fork_url = fork.ports.url(8000)
                assert fork_url is not None and fork_url != url
                fork_urls.add(fork_url)
                # Nobody started the server in the fork: it woke up serving.
                assert await _wait_serving(http, fork_url, 30) == PAGE
                assert await _server_pids(fork) == pids
            assert len(fork_urls) == 3

            for pid in pids:
                await sb.commands.kill(pid)
            await sb.files.remove("/app")
            await _wait_silent(http, url, 30)
            with pytest.raises(NotFound):
                await sb.files.read("/app/index.html")

            await sb.rollback(ck)
            assert sb.ports.url(8000) == url  # same session, same host port
            assert await _wait_serving(http, url, 30) == PAGE
            assert await _server_pids(sb) == pids  # restored from memory, not restarted
            assert await sb.files.read_text("/app/index.html") == PAGE
        finally:
            for fork in forks:
                if isinstance(fork, AsyncSandbox):
                    await fork.kill()
            await sb.kill()
            if ck is not None:
                await ck.remove()


@pytest.mark.vm
@pytest.mark.timeout(600)
def test_embedded_mode(vm_ready: None) -> None:
    async def scenario() -> None:
        async with await AsyncSandbox.create() as sb:  # killed on exit
            assert "embedded" in repr(sb)
            result = await sb.commands.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
            assert isinstance(result, CommandResult)
            assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
            await sb.files.write("/tmp/x.bin", b"\x00\xff")
            assert await sb.files.read("/tmp/x.bin") == b"\x00\xff"
            assert (await sb.commands.run("cat", stdin="piped")).stdout == "piped"
            raw = await sb.commands.run(["printf", "\\377ok"])
            assert (raw.stdout, raw.stdout_bytes) == ("\ufffdok", b"\xffok")  # exact bytes kept
            assert sb.commands is sb.commands  # namespaces are made once
            # A structured error keeps its class and fields through the REST layer.
            with pytest.raises(CommandTimeout) as timed_out:
                await sb.commands.run("sleep 30", timeout=1)
            assert timed_out.value.timeout_s == 1 and "sleep 30" in timed_out.value.command
            session_id = sb.id
        with pytest.raises(NotFound):
            await AsyncSandbox.connect(session_id)

    asyncio.run(scenario())


@pytest.mark.vm
def test_verify_and_recover_come_from_the_operation_table(vm_ready: None) -> None:
    """Two operations the CLI had alone, reached through the SDK over REST once the table
    declared them: a checkpoint's files verified, a crashed session brought back."""

    async def scenario() -> None:
        async with await AsyncSandbox.create() as sb:
            async with await sb.checkpoint() as ck:
                verdicts = await ck.verify()
                assert verdicts and all(v.ok and v.size >= 0 for v in verdicts), verdicts
                from forkpoint.runtime import Runtime  # the QEMU's pid is the store's

                runtime = Runtime.open()
                try:
                    pid = runtime.store.get_session(sb.id).qemu_pid
                finally:
                    runtime.close()
                assert pid
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while (await sb.refresh()).state != "crashed":
                    assert time.monotonic() < deadline, "never crashed"
                    await asyncio.sleep(0.2)
                slots = await AsyncSandbox.recover()  # every crashed session of the home
                [back] = [s for s in slots if not isinstance(s, ForkpointError) and s.id == sb.id]
                assert back.info.state == "running"
                assert (await sb.commands.run("true")).exit_code == 0

    asyncio.run(scenario())


@pytest.mark.vm
@pytest.mark.timeout(600)
def test_sync_twin_runs(api: str, vm_ready: None) -> None:
    with Sandbox.create(base_url=api) as sb:
        assert isinstance(sb, Sandbox)
        result = sb.commands.run("echo sync")
        assert isinstance(result, CommandResult)
        assert result.stdout == "sync\n"
        sb.files.write("/tmp/s.txt", "twin")
        assert sb.files.read_text("/tmp/s.txt") == "twin"
        again = Sandbox.connect(sb.id, base_url=api)
        assert again.id == sb.id and again.info.state == "running"
        again.close()
        session_id = sb.id
    with pytest.raises(NotFound):
        Sandbox.connect(session_id, base_url=api)


def test_sync_twin_is_derived_from_the_async_core() -> None:
    for sync_cls, async_cls in [(Sandbox, AsyncSandbox), (Checkpoint, AsyncCheckpoint)]:
        public = {
            name
            for name, member in vars(async_cls).items()
            if not name.startswith("_")
            and (
                inspect.iscoroutinefunction(getattr(async_cls, name))
                or isinstance(member, property)
            )
        }
        assert public, async_cls
        for name in public:
            assert hasattr(sync_cls, name), f"{sync_cls.__name__}.{name} missing"
            async_doc = inspect.getdoc(getattr(async_cls, name))
            assert inspect.getdoc(getattr(sync_cls, name)) == async_doc, name
            assert not inspect.iscoroutinefunction(getattr(sync_cls, name)), name
    assert hasattr(Sandbox, "__enter__") and hasattr(Sandbox, "__exit__")


def test_errors_come_back_as_their_classes(api: str) -> None:
    async def scenario() -> None:
        with pytest.raises(NotFound):
            await AsyncSandbox.connect("s-0000000000", base_url=api)
        with pytest.raises(NotFound):
            await AsyncCheckpoint.get("c-0000000000", base_url=api)
        with pytest.raises(InvalidInput):
            await AsyncSandbox.create(memory_mib=1, base_url=api)
        with pytest.raises(InvalidInput):
            await AsyncSandbox.create(base_url="ftp://nowhere")

    asyncio.run(scenario())
    with pytest.raises(NotFound):
        Sandbox.connect("s-0000000000", base_url=api)  # the same class through the twin
    timeout = error_from_response(408, {"error": CommandTimeout("sleep 9", 2.5).to_dict()})
    assert isinstance(timeout, CommandTimeout)
    assert (timeout.command, timeout.timeout_s) == ("sleep 9", 2.5)
    assert timeout.message == "command timed out after 2.5 s and was killed: sleep 9"
    failed = error_from_response(500, {"error": QemuError("boom", log_tail="qemu: x").to_dict()})
    assert isinstance(failed, QemuError) and failed.log_tail == "qemu: x"
    assert type(error_from_response(404, None)) is NotFound
    assert isinstance(error_from_response(502, "<html>"), ForkpointError)


def test_importing_the_sdk_loads_no_runtime() -> None:
    """The SDK is an HTTP client: the runtime, VM and store load only for embedded mode."""
    code = (
        "import sys, forkpoint.sdk\n"
        "heavy = ('forkpoint.runtime', 'forkpoint.vm', 'forkpoint.store', 'forkpoint.server')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        with pytest.raises(ForkpointError, match="cannot reach"):
            await AsyncSandbox.connect("x", base_url=f"unix:{tmp_path / 'none.sock'}")

    asyncio.run(scenario())


async def _read_until(terminal: AsyncTerminal, needle: bytes) -> bytes:
    seen = b""
    while needle not in seen:
        chunk = await terminal.read()
        assert chunk is not None, f"the terminal ended before {needle!r}: {seen!r}"
        seen += chunk
    return seen


@pytest.mark.vm
@pytest.mark.timeout(600)
def test_a_terminal_is_resized_and_lives_on_in_a_fork_at_the_same_pid(vm_ready: None) -> None:
    """A shell on a PTY (embedded SDK: the output streams in-process): typed into,
    resized; checkpointed and forked, the fork's copy is the same shell at the same PID,
    re-attached and ended there, while the original runs on."""

    async def scenario() -> None:
        async with await AsyncSandbox.create() as sb:
            term = await sb.terminals.open(80, 24, command=["/bin/sh"], env={"PS1": "$ "})
            await term.send("stty size; echo $((40+2))done\n")  # the echo shows $((40+2))
            assert b"24 80" in await _read_until(term, b"42done")
            await term.resize(120, 40)
            await term.send("stty size; echo $((1+1))resized\n")
            assert b"40 120" in await _read_until(term, b"2resized")
            checkpoint = await sb.checkpoint()
            (fork,) = await checkpoint.fork(1)
            assert isinstance(fork, AsyncSandbox)
            try:
                copy = await fork.terminals.connect(term.pid)
                await copy.send("echo in-fork-$((3+4)); exit 3\n")
                output: list[bytes] = []
                assert await copy.wait(output.append) == 3
                assert b"in-fork-7" in b"".join(output) and copy.exit_code == 3
                await term.send("echo still-$((5+5))\n")  # the original is untouched
                await _read_until(term, b"still-10")
                await term.kill()
                assert await term.wait() == 128 + signal.SIGKILL
                with pytest.raises(NotFound):
                    await sb.terminals.connect(4_000_000)
            finally:
                await fork.kill()
                await checkpoint.remove()

    asyncio.run(scenario())


@pytest.mark.vm
@pytest.mark.timeout(600)
def test_a_terminal_file_metadata_and_a_watcher_over_the_rest_api(api: str, vm_ready: None) -> None:
    """Through a real server: a terminal's NDJSON stream arrives as the guest writes; a
    file's metadata is stored with it and listed; a watcher reports every change made
    before it is asked (no sleeping), new subdirectories included."""
    with Sandbox.create(base_url=api) as sb:
        watcher = sb.files.watch("/srv", recursive=True, entries=True)
        sb.files.write("/srv/sub/n.txt", "hi")  # its directory is made on the way
        events = watcher.events()
        assert [(e.type, e.name) for e in events] == [
            ("create", "sub"), ("create", "sub/n.txt"), ("chmod", "sub/n.txt"),
            ("write", "sub/n.txt"),
        ]  # fmt: skip
        entry = events[-1].entry
        assert entry is not None and (entry.path, entry.size) == ("/srv/sub/n.txt", 2)
        assert sb.commands.run("rm -r /srv/sub").exit_code == 0
        assert [(e.type, e.name) for e in watcher.events()] == [
            ("remove", "sub/n.txt"), ("remove", "sub"),
        ]  # fmt: skip
        assert watcher.events() == []
        watcher.stop()
        with pytest.raises(NotFound, match="watcher"):
            watcher.events()
        with pytest.raises(NotFound):
            sb.files.watch("/no/such/dir")
        with pytest.raises(InvalidInput, match="not a directory"):
            sb.files.watch("/etc/hostname")
        sb.files.write("/srv/m.txt", "x", metadata={"Author": "mish"})
        (entry,) = [e for e in sb.files.list("/srv") if e.name == "m.txt"]
        assert entry.metadata == {"author": "mish"}
        with pytest.raises(InvalidInput, match="metadata key"):
            sb.files.write("/srv/m.txt", "x", metadata={"no spaces": "v"})
        term = sb.terminals.open(command=["/bin/sh", "-c", "read line; echo got-$line; exit 4"])
        term.send("forkpoint\n")
        output: list[bytes] = []
        assert term.wait(output.append) == 4
        assert b"got-forkpoint" in b"".join(output)
        with pytest.raises(InvalidInput):
            sb.terminals.open(cols=0)


def test_a_running_server_samples_metrics(api: str, vm_ready: None) -> None:
    """`forkpoint serve` samples its running sessions every 5 s: CPU as a share of the
    vCPUs (a spinning guest shows it), memory and disk as the guest counts them; a time
    range bounds them; the CLI shows the same samples."""
    from datetime import UTC, datetime, timedelta

    with Sandbox.create(base_url=api) as sb:
        started = datetime.now(UTC)
        sb.commands.run("timeout 12 sh -c 'while :; do :; done'", background=True)
        deadline = time.monotonic() + 60
        while not [m for m in sb.metrics(start=started) if m.cpu_used_pct > 50]:
            assert time.monotonic() < deadline, sb.metrics()
            time.sleep(1)
        sample = sb.metrics()[-1]
        assert sample.cpu_count == 1 and 0 <= sample.cpu_used_pct <= 100
        assert 400 * 2**20 < sample.mem_total <= 512 * 2**20
        assert 0 < sample.mem_used < sample.mem_total and 0 < sample.mem_cache < sample.mem_total
        assert 0 < sample.disk_used < sample.disk_total
        assert sb.metrics(end=started - timedelta(hours=1)) == []
        assert sb.metrics(start=started, end=started - timedelta(hours=1)) == []  # none between
        shown = subprocess.run(
            [str(FORKPOINT), "metrics", sb.id, "--json"], capture_output=True, text=True,
            check=True,
        )  # fmt: skip
        assert sample.at in [m["at"] for m in json.loads(shown.stdout)]
        # The host's room: this session runs, its guest RAM counted; the CLI agrees.
        host = asyncio.run(AsyncSandbox.host_status(base_url=api))
        assert host.sessions_running >= 1 and host.memory_sessions_mib >= 512
        assert host.disk_free_bytes > host.disk_reserve_bytes > 0 and host.cpus >= 1
        cli_host = subprocess.run(
            [str(FORKPOINT), "host", "--json"], capture_output=True, text=True, check=True
        )
        assert json.loads(cli_host.stdout)["sessions_max"] == host.sessions_max
        # The guest's own view of its restore (a create restores the image's template).
        restored = sb.restore_status()
        assert (restored.event, restored.session, restored.notified) == ("create", sb.id, [])


def test_images_are_listed_built_and_removed_through_the_api(api: str) -> None:
    """The image operations of the table (REST here; MCP has the same tools): a Dockerfile
    with its build context sent along — a busybox-only image, no libc — built, listed with
    its service and ready check, removed; bad builds refused before anything runs."""
    name = f"sdk-{uuid.uuid4().hex[:8]}"
    dockerfile = (
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY busybox /bin/sh\n"
        'CMD ["/bin/busybox", "httpd", "-f", "-p", "8000"]\n'
        'LABEL dev.forkpoint.ready-cmd="busybox wget -q -O- 127.0.0.1:8000"\n'
    )
    busybox = Path("/bin/busybox").read_bytes()

    async def scenario() -> None:
        listed = {i.name: i for i in await AsyncSandbox.list_images(base_url=api)}
        assert listed["default"].source["kind"] == "debian" and listed["default"].suite
        built = await AsyncSandbox.build_image(
            name, dockerfile=dockerfile, files={"busybox": busybox}, base_url=api
        )
        assert built.name == name and built.source["kind"] == "dockerfile"
        assert built.start == ["/bin/busybox", "httpd", "-f", "-p", "8000"]
        assert built.ready == "busybox wget -q -O- 127.0.0.1:8000"
        assert name in {i.name for i in await AsyncSandbox.list_images(base_url=api)}
        assert await AsyncSandbox.remove_image(name, base_url=api) == [built.hash]
        assert name not in {i.name for i in await AsyncSandbox.list_images(base_url=api)}
        with pytest.raises(NotFound):
            await AsyncSandbox.remove_image(name, base_url=api)
        for bad in (
            {"dockerfile": "FROM scratch\n", "files": {"../x": b""}},
            {"dockerfile": "FROM scratch\n", "packages": ["git"]},
            {"packages": ["No Such Package"]},
        ):
            with pytest.raises(InvalidInput):
                await AsyncSandbox.build_image(name, base_url=api, **bad)

    asyncio.run(scenario())
    not_base64 = ImageBuildRequest(name="x", dockerfile="FROM scratch\n", files={"x": "!!"})
    with pytest.raises(InvalidInput, match="base64"):
        not_base64.context_files()
