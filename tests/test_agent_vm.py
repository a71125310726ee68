"""The guest agent inside real VMs: a cold-booted one and one restored from a checkpoint."""

from __future__ import annotations

import asyncio
import hashlib
import os
import resource
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from forkpoint.agent_client import AgentClient
from forkpoint.config import home
from forkpoint.errors import CommandTimeout, InvalidInput, NotFound
from forkpoint.images import get_image
from forkpoint.models import Session
from forkpoint.runtime import Runtime
from forkpoint.runtime.sessions.machines import SESSIONLESS
from forkpoint.vm import (
    BootFiles,
    Machine,
    MachineShape,
    VmFiles,
    create_overlay,
    detect_accel,
    guest_cmdline,
    host_tsc_khz,
    qemu_build,
)
from forkpoint.vm.process import kill_and_wait

pytestmark = pytest.mark.vm

Connect = Callable[[], Awaitable[AgentClient]]


class BootedVm:
    """A VM cold-booted straight from the image (no template, no restore)."""

    def __init__(self, directory: Path) -> None:
        self.files = VmFiles(directory, f"forkpoint-test-{directory.name}")
        self.machine: Machine | None = None

    async def start(self) -> None:
        image = get_image()
        build = qemu_build()
        accel = detect_accel(build, home().cache, image.kernel)
        shape = MachineShape.for_build(build, accel, 512, 1)
        boot = BootFiles(image.kernel, image.initrd, guest_cmdline(accel, host_tsc_khz()))
        self.files.ensure()
        disk = self.files.dir / "disk.qcow2"
        create_overlay(image.rootfs, disk)
        self.machine = await Machine.start(build, shape, boot, self.files, disk, jail=SESSIONLESS)
        await self.machine.close()  # the monitor belongs to this event loop; QEMU runs on

    def kill(self) -> None:
        if self.machine is not None:
            kill_and_wait(self.machine.pid, self.files.name)

    async def connect(self) -> AgentClient:
        return await AgentClient.connect(self.files.agent_socket, timeout=180)


@pytest.fixture(scope="module", params=["booted", "restored"])
def vm(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """A way to connect to the agent of each kind of VM (one VM per kind per module)."""
    if request.param == "booted":
        with tempfile.TemporaryDirectory(prefix="fp-booted-") as tmp:
            booted = BootedVm(Path(tmp))
            asyncio.run(booted.start())
            try:
                yield booted.connect
            finally:
                booted.kill()
    else:
        rt = Runtime.open()
        session: Session = asyncio.run(rt.create())
        files = rt.files(session.id)

        async def connect() -> AgentClient:
            return await AgentClient.connect(files.agent_socket, timeout=60)

        try:
            yield connect
        finally:
            asyncio.run(rt.remove(session.id))
            rt.close()


def with_agent(connect: Connect, body: Callable[[AgentClient], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        async with await connect() as agent:
            return await body(agent)

    return asyncio.run(run())


@pytest.mark.smoke
def test_exec_passes_exit_codes_and_separates_output(vm: Connect) -> None:
    async def body(agent: AgentClient) -> None:
        for code in (0, 1, 42):
            assert (await agent.exec(f"exit {code}")).exit_code == code
        killed = await agent.exec("kill -9 $$")
        assert killed.signal == 9 and killed.exit_code == 128 + 9
        both = await agent.exec("echo out; echo err >&2")
        assert both.stdout == b"out\n" and both.stderr == b"err\n"
        argv = await agent.exec(["printf", "%s|", "a b", "c"])
        assert argv.stdout == b"a b|c|"

    with_agent(vm, body)


def test_exec_timeout_kills_the_command(vm: Connect) -> None:
    async def body(agent: AgentClient) -> None:
        with pytest.raises(CommandTimeout):
            await agent.exec("echo started > /tmp/t; sleep 300", timeout=2)
        ps = await agent.ps()
        assert not [p for p in ps if p.cmd.startswith("sleep 300")]
        assert (await agent.exec("true")).exit_code == 0  # the agent still answers

    with_agent(vm, body)


def test_bad_input_gets_clear_errors_and_the_agent_keeps_working(vm: Connect) -> None:
    async def body(agent: AgentClient) -> None:
        with pytest.raises(NotFound):
            await agent.exec(["definitely-not-a-command"])
        with pytest.raises(NotFound):
            await agent.read_file("/no/such/file")
        with pytest.raises(InvalidInput):
            await agent.read_file("/etc")
        with pytest.raises((NotFound, InvalidInput)):
            await agent.list_dir("/etc/hostname")
        assert (await agent.exec("echo ok")).stdout == b"ok\n"

    with_agent(vm, body)


def test_100_mib_file_round_trip_with_bounded_host_memory(vm: Connect, tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    with source.open("wb") as f:
        for _ in range(100):
            f.write(os.urandom(1 << 20))
    back = tmp_path / "out.bin"
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB

    async def body(agent: AgentClient) -> None:
        with source.open("rb") as f:
            await agent.write_file("/tmp/big.bin", f)
        with back.open("wb") as f:
            await agent.read_file_to("/tmp/big.bin", f)
        await agent.remove("/tmp/big.bin")

    started = time.perf_counter()
    with_agent(vm, body)
    elapsed = time.perf_counter() - started
    growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    print(f"\n100 MiB there and back in {elapsed:.1f} s; host peak RSS grew {growth_mib:.0f} MiB")
    assert _sha256(back) == _sha256(source)
    assert growth_mib < 50, f"host memory grew by {growth_mib:.0f} MiB for a 100 MiB file"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def rt() -> Iterator[Runtime]:
    runtime = Runtime.open()
    yield runtime
    runtime.close()


def test_fork_taken_later_shows_the_current_wall_clock(rt: Runtime) -> None:
    async def scenario() -> None:
        session = await rt.create()
        ck = await rt.checkpoint(session.id)
        forks: list[Session] = []
        try:
            await asyncio.sleep(10)
            result = await rt.fork(ck.id, 2)
            forks = [f for f in result if isinstance(f, Session)]
            assert len(forks) == 2, result
            for fork in forks:
                # The identity posted at the restore is applied with no help from later
                # connections (this hello carries none).
                deadline = time.monotonic() + 60
                while True:
                    agent = await AgentClient.connect(rt.files(fork.id).agent_socket, timeout=60)
                    await agent.close()
                    assert agent.info is not None
                    if agent.info.identity_token == f"{fork.id}:0":
                        break
                    assert time.monotonic() < deadline, agent.info
                    await asyncio.sleep(0.2)
                before = time.time()
                guest = float((await rt.exec(fork.id, "date +%s.%N")).stdout)
                after = time.time()
                # within 1 s of the host (the checkpoint's clock is 10 s behind)
                assert before - 1 <= guest <= after + 1, (before, guest, after)
                hostname = (await rt.exec(fork.id, "hostname")).stdout.strip()
                assert hostname == fork.id
            rand = [(await rt.exec(f.id, "head -c 16 /dev/urandom | od -x")).stdout for f in forks]
            assert rand[0] != rand[1]
        finally:
            for fork in forks:
                await rt.remove(fork.id)
            await rt.remove(session.id)
            await rt.remove_checkpoint(ck.id)

    asyncio.run(scenario())
