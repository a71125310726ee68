"""A guest that replaces its agent with one that lies: garbage, giant frames, silence.

Host calls must fail with one clear line within their timeouts, the host process's memory
must stay bounded, another session must not notice, and a rollback must bring the real
agent back."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from forkpoint.errors import ForkpointError
from forkpoint.runtime import Runtime
from forkpoint.runtime.sessions.machines import AGENT_READY_TIMEOUT_S

pytestmark = pytest.mark.vm

# Runs in the guest (as root there, like any hostile code would): kill the agent, take the
# virtio-serial port it served on, and answer the host with ``mode``.
IMPOSTOR = r"""
import os, signal, sys, time
mode = sys.argv[1]
base = "/sys/class/virtio-ports"
port = next("/dev/" + n for n in os.listdir(base)
            if open(f"{base}/{n}/name").read().strip() == "agent")
time.sleep(0.5)  # let the spawn call that started us return


def kill_agents():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if "forkpoint.guest.agent".encode() in argv:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


while True:  # init respawns the agent: kill it until the port (one opener) is ours
    kill_agents()
    try:
        fd = os.open(port, os.O_RDWR)
        break
    except OSError:
        time.sleep(0.01)
junk = os.urandom(65536)
giant = (0xFFFFFFF0).to_bytes(4, "big") + b"{" * 65532
while True:
    if mode == "garbage":
        os.write(fd, junk)
    elif mode == "giant":
        os.write(fd, giant)
    else:
        time.sleep(3600)  # silent: holds the port, never answers
"""


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# Each variant costs about a handshake timeout (a minute): silence and giant frames are
# long variants, run by make security (in CI); garbage runs in make test too.
LONG = os.environ.get("FORKPOINT_LONG_ATTACKS") == "1"
SILENT, GIANT = (
    pytest.param(mode, marks=pytest.mark.skipif(not LONG, reason="long variant: make security"))
    for mode in ("silent", "giant")
)


@pytest.mark.parametrize("mode", ["garbage", GIANT, SILENT])
def test_an_impostor_agent_gets_clear_errors_and_hurts_nobody(mode: str) -> None:
    async def scenario() -> None:
        rt = Runtime.open()
        hostile = await rt.create()
        innocent = await rt.create()
        try:
            checkpoint = await rt.checkpoint(hostile.id)
            await rt.spawn(hostile.id, ["python3", "-c", IMPOSTOR, mode], cwd="/")
            await asyncio.sleep(2)  # the impostor holds the port now
            rss_before = _rss_mib()
            began = time.monotonic()
            with pytest.raises(ForkpointError) as failed:
                await asyncio.wait_for(
                    rt.exec(hostile.id, ["true"], timeout=10), AGENT_READY_TIMEOUT_S + 30
                )
            elapsed = time.monotonic() - began
            message = failed.value.message
            assert "\n" not in message and "agent" in message.lower(), message
            assert elapsed < AGENT_READY_TIMEOUT_S + 15, elapsed
            # Junk is dropped as it arrives, never buffered whole.
            assert _rss_mib() - rss_before < 64, (rss_before, _rss_mib())

            # The other session never noticed.
            assert (await rt.exec(innocent.id, ["echo", "fine"])).stdout == "fine\n"

            # Rolling back brings the real agent back.
            await rt.rollback(hostile.id, checkpoint.id)
            assert (await rt.exec(hostile.id, ["echo", "back"])).stdout == "back\n"
        finally:
            for session in (hostile, innocent):
                await rt.remove(session.id)
            rt.close()

    asyncio.run(scenario())
