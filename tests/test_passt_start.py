"""A passt that cannot start fails the operation at once, with passt's own reason.

Before, a dead passt went unnoticed: every forward silently stopped answering and callers
timed out after 90-120 s.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from forkpoint.errors import QemuError
from forkpoint.runtime import Runtime
from forkpoint.runtime.sessions.machines import SESSIONLESS
from forkpoint.vm import VmFiles
from forkpoint.vm.jail import jails_processes
from forkpoint.vm.net import (
    passt_log,
    passt_ready,
    remove_passt_log,
    start_passt,
    wait_passt_ready,
)
from forkpoint.vm.process import is_running, pids_with_arg

needs_passt = pytest.mark.skipif(shutil.which("passt") is None, reason="needs passt")


def _wait_on_loop(files: VmFiles, pid: int) -> None:
    asyncio.run(passt_ready(files, pid))


# The blocking wait (port changes, from a worker thread) and the event loop's (restores).
WAITS = pytest.mark.parametrize(
    "wait", [wait_passt_ready, _wait_on_loop], ids=["blocking", "event-loop"]
)


@pytest.fixture
def vm_files(tmp_path: Path) -> Iterator[VmFiles]:
    """A VM's files whose network socket is a plain listener standing in for QEMU's."""
    files = VmFiles(tmp_path / "vm", f"forkpoint-test-{os.getpid()}-{time.monotonic_ns()}")
    files.ensure()
    qemu_side = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    qemu_side.bind(str(files.net_socket))
    qemu_side.listen(4)
    yield files
    qemu_side.close()
    remove_passt_log(files)


@pytest.mark.smoke
@needs_passt
@WAITS
def test_passt_whose_forward_port_is_taken_fails_fast_with_its_reason(
    vm_files: VmFiles, wait: Callable[[VmFiles, int], None]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        pid = start_passt(vm_files, [(port, 8000)], SESSIONLESS)
        with pytest.raises(QemuError) as raised:
            wait(vm_files, pid)
        elapsed = time.monotonic() - started
    assert elapsed < 5
    message = raised.value.message
    assert "passt exited at start-up (exit code 1)" in message
    assert f"127.0.0.1/{port}:8000" in message  # passt's own line names the forward
    assert "\n" not in message
    assert not is_running(pid, vm_files.name)


@pytest.mark.smoke
@needs_passt
@WAITS
def test_passt_that_starts_is_ready_and_logs_outside_forkpoint_home(
    vm_files: VmFiles, wait: Callable[[VmFiles, int], None]
) -> None:
    pid = start_passt(vm_files, [], SESSIONLESS)
    try:
        wait(vm_files, pid)
        assert is_running(pid, vm_files.name)
        if jails_processes():  # as the VM's own uid, not root (nor nobody)
            assert f"\nUid:\t{SESSIONLESS.uid}\t" in Path(f"/proc/{pid}/status").read_text()
    finally:
        os.kill(pid, 9)
        wait_passt_gone(pid, vm_files)
    # Debian's AppArmor profile lets passt write only under /tmp and home directories.
    log = passt_log(vm_files)
    assert log.is_relative_to("/tmp")
    assert log.exists()
    mode = log.parent.stat().st_mode
    assert stat.S_IMODE(mode) == 0o700


def wait_passt_gone(pid: int, files: VmFiles) -> None:
    deadline = time.monotonic() + 5
    while is_running(pid, files.name) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def passt_that_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``passt`` first on PATH that fails the way passt does without a user namespace."""
    reason = "Couldn't create user namespace: Operation not permitted"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "passt"
    fake.write_text(f'#!/bin/sh\necho "{reason}" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return reason


@pytest.mark.vm
@pytest.mark.smoke
@pytest.mark.timeout(300)
def test_create_fails_in_under_5_s_when_passt_cannot_start(passt_that_cannot_start: str) -> None:
    rt = Runtime.open()
    try:
        asyncio.run(rt.prepare())  # the one-time template boot is not what is timed
        sessions_before = {s.id for s in rt.list_sessions()}
        layers_before = sorted(rt.home.layers.glob("*.qcow2"))  # not the cached blanks
        started = time.monotonic()
        with pytest.raises(QemuError) as raised:
            asyncio.run(rt.create(ports=[8000]))
        elapsed = time.monotonic() - started
        assert elapsed < 5
        assert passt_that_cannot_start in raised.value.message
        assert "\n" not in raised.value.message
        # Nothing left: no session, no VM, no disk layer, no log.
        assert {s.id for s in rt.list_sessions()} == sessions_before
        # (an unused layer of the template boot may be collected meanwhile: fewer is fine)
        assert not set(rt.home.layers.glob("*.qcow2")) - set(layers_before)
        new_ids = {p.name for p in rt.home.sessions.iterdir()} - sessions_before
        assert not [d for d in new_ids if not d.startswith("template-")]
        vm_name = raised.value.message.split(":", 1)[0]
        assert vm_name.startswith("forkpoint-")
        assert pids_with_arg(lambda arg: arg == vm_name) == []
        assert not passt_log(VmFiles(rt.home.sessions / "x", vm_name)).exists()
    finally:
        rt.close()
