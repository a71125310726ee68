"""Rollback standbys: a QEMU started ahead becomes the rolled-back VM, processes and ports
and all; a stale, dead or surplus one is never loaded and leaves nothing (real VMs)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkpoint.runtime import Runtime
from forkpoint.runtime.housekeeping.invariants import check_home
from forkpoint.runtime.housekeeping.orphans import GRACE_ENV
from forkpoint.store.standby import StandbyRecord
from forkpoint.vm.process import is_running, kill_and_wait, pids_with_arg
from vm_checks import new_problems, read_port

pytestmark = pytest.mark.vm

FORKPOINT = Path(sys.executable).with_name("forkpoint")

LISTENER = """
import socket
s = socket.create_server(("", 8000))
while True:
    c, _ = s.accept()
    c.recv(100)
    c.sendall(b"from before the rollback")
    c.close()
"""


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    monkeypatch.setenv("FORKPOINT_ROLLBACK_STANDBYS", "2")
    runtime = Runtime.open()
    yield runtime
    runtime.close()


def _standby(rt: Runtime, session_id: str) -> StandbyRecord:
    record = rt.standbys.rows.get(session_id)
    assert record is not None and record.qemu_pid is not None, record
    assert is_running(record.qemu_pid, rt.standbys.files(record).name)
    return record


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``forkpoint ARGS --json`` with one rollback standby allowed, and ``env`` set."""
    return subprocess.run(
        [str(FORKPOINT), *args, "--json"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "FORKPOINT_ROLLBACK_STANDBYS": "1", "NO_COLOR": "1", **env},
    )  # fmt: skip


def _cli_json(*args: str) -> Any:
    """What ``forkpoint ARGS --json`` printed (it must succeed)."""
    done = _cli(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def _processes_of(rt: Runtime, session_id: str) -> set[int]:
    """Every QEMU named after the session (its VM and any standby)."""
    name = rt.files(session_id).name
    return {pid for pid, _ in pids_with_arg(lambda a: a == name or a.startswith(f"{name}."))}


def test_a_rollback_loads_its_standby(rt: Runtime) -> None:
    before = check_home(rt.home, rt.store)
    session = asyncio.run(rt.create(ports=[8000]))
    try:
        listener = asyncio.run(rt.spawn(session.id, ["python3", "-c", LISTENER]))
        port = session.ports[0].host_port
        assert read_port(port) == b"from before the rollback"

        async def checkpoint_in_a_server() -> None:  # the server prepares in the background
            rt.refill_in_background = True
            try:
                await rt.checkpoint(session.id)
                await asyncio.gather(*rt.background)
            finally:
                rt.refill_in_background = False

        asyncio.run(checkpoint_in_a_server())
        standby = _standby(rt, session.id)
        assert new_problems(rt, before) == []  # owned by its row, its layer recorded
        asyncio.run(rt.exec(session.id, ["kill", "-9", str(listener.pid)]))
        old_qemu = rt.store.get_session(session.id).qemu_pid

        rolled = asyncio.run(rt.rollback(session.id))
        record = rt.store.get_session(session.id)
        assert record.qemu_pid == standby.qemu_pid  # loaded, not started
        assert record.disk_layer == standby.disk_layer
        assert rt.standbys.rows.get(session.id) is None  # taken once
        assert not is_running(old_qemu, rt.files(session.id).name)
        assert [p.host_port for p in rolled.ports] == [port]  # same ports, a new passt
        assert read_port(port) == b"from before the rollback"  # the killed process is back
        processes = asyncio.run(rt.ps(session.id))
        assert any(p.pid == listener.pid for p in processes)  # at the same PID
        assert asyncio.run(rt.exec(session.id, ["hostname"])).stdout.strip() == session.id
        assert new_problems(rt, before) == []

        # Without a standby it starts QEMU, as always; the promoted standby goes.
        asyncio.run(rt.rollback(session.id))
        assert rt.store.get_session(session.id).qemu_pid not in (standby.qemu_pid, None)
        assert _processes_of(rt, session.id) == {rt.store.get_session(session.id).qemu_pid}
        assert read_port(port) == b"from before the rollback"
    finally:
        asyncio.run(rt.remove(session.id))
    assert _processes_of(rt, session.id) == set()
    assert new_problems(rt, before) == []


def test_a_standby_for_another_target_or_dead_is_never_loaded(rt: Runtime) -> None:
    before = check_home(rt.home, rt.store)
    session = asyncio.run(rt.create())
    try:
        asyncio.run(rt.write_file(session.id, "/data/marker", b"first"))
        first = asyncio.run(rt.checkpoint(session.id))
        assert asyncio.run(rt.prepare_rollback(session.id))
        assert not asyncio.run(rt.prepare_rollback(session.id))  # it has a live one already
        stale = _standby(rt, session.id)
        assert stale.checkpoint_id == first.id

        asyncio.run(rt.write_file(session.id, "/data/marker", b"second"))
        second = asyncio.run(rt.checkpoint(session.id))
        assert asyncio.run(rt.prepare_rollback(session.id))  # the target moved: replaced
        fresh = _standby(rt, session.id)
        assert fresh.checkpoint_id == second.id and fresh.tag != stale.tag
        assert not is_running(stale.qemu_pid, rt.standbys.files(stale).name)
        assert not (rt.home.layers / stale.disk_layer).exists()

        # A rollback elsewhere (the first checkpoint) discards it and starts QEMU.
        asyncio.run(rt.rollback(session.id, first.id))
        assert rt.store.get_session(session.id).qemu_pid != fresh.qemu_pid
        assert rt.standbys.rows.get(session.id) is None
        assert asyncio.run(rt.read_file(session.id, "/data/marker")) == b"first"

        # A standby that died is replaced by a QEMU started in its place.
        assert asyncio.run(rt.prepare_rollback(session.id, second.id))
        dead = _standby(rt, session.id)
        assert dead.qemu_pid is not None
        kill_and_wait(dead.qemu_pid, rt.standbys.files(dead).name)
        asyncio.run(rt.rollback(session.id, second.id))
        assert asyncio.run(rt.read_file(session.id, "/data/marker")) == b"second"
        assert not (rt.home.layers / dead.disk_layer).exists()
        assert new_problems(rt, before) == []
    finally:
        asyncio.run(rt.remove(session.id))
    assert new_problems(rt, before) == []


def test_a_crashed_session_comes_back_on_its_standby(rt: Runtime) -> None:
    before = check_home(rt.home, rt.store)
    session = asyncio.run(rt.create())
    try:
        asyncio.run(rt.checkpoint(session.id))
        assert asyncio.run(rt.prepare_rollback(session.id))
        standby = _standby(rt, session.id)
        crashed = rt.store.get_session(session.id).qemu_pid
        assert crashed is not None
        kill_and_wait(crashed, rt.files(session.id).name)
        assert rt.get(session.id).state == "crashed"  # found crashed: its standby stays
        assert _standby(rt, session.id) == standby
        [recovered] = asyncio.run(rt.recover())
        assert not isinstance(recovered, Exception), recovered
        assert rt.store.get_session(session.id).qemu_pid == standby.qemu_pid
        assert new_problems(rt, before) == []
    finally:
        asyncio.run(rt.remove(session.id))
    assert new_problems(rt, before) == []


def test_standbys_are_bounded_and_go_with_their_session_or_checkpoint(rt: Runtime) -> None:
    before = check_home(rt.home, rt.store)
    a, b = asyncio.run(rt.create()), asyncio.run(rt.create())
    try:
        own = asyncio.run(rt.checkpoint(a.id))
        asyncio.run(rt.checkpoint(b.id))
        assert asyncio.run(rt.prepare_rollback(a.id, limit=1))
        first = _standby(rt, a.id)
        assert asyncio.run(rt.prepare_rollback(b.id, limit=1))  # the oldest other one makes room
        assert rt.standbys.rows.get(a.id) is None
        assert not is_running(first.qemu_pid, rt.standbys.files(first).name)
        assert asyncio.run(rt.prepare_rollback(a.id, limit=0)) is False  # none wanted: none made
        assert rt.standbys.rows.get(a.id) is None

        assert asyncio.run(rt.prepare_rollback(a.id))
        mapped = _standby(rt, a.id)
        asyncio.run(rt.remove_checkpoint(own.id))  # its RAM file goes: so does the standby
        assert rt.standbys.rows.get(a.id) is None
        assert not is_running(mapped.qemu_pid, rt.standbys.files(mapped).name)

        in_b = _standby(rt, b.id)
        asyncio.run(rt.stop(b.id))  # a stopped session holds no QEMU
        assert rt.standbys.rows.get(b.id) is None and _processes_of(rt, b.id) == set()
        assert not (rt.home.layers / in_b.disk_layer).exists()
        assert new_problems(rt, before) == []
        assert asyncio.run(rt.prepare_rollback(a.id))
    finally:
        asyncio.run(rt.remove(a.id))
        asyncio.run(rt.remove(b.id))
    assert _processes_of(rt, a.id) == set() and rt.standbys.rows.all() == []
    assert new_problems(rt, before) == []


def test_the_cli_prepares_after_checkpoint_and_rollback() -> None:
    session = _cli_json("create")["id"]
    runtime = Runtime.open()
    try:
        _cli_json("checkpoint", session)
        standby = _standby(runtime, session)
        _cli_json("rollback", session)
        assert runtime.store.get_session(session).qemu_pid == standby.qemu_pid
        again = _standby(runtime, session)  # and the next one is ready
        assert again.tag != standby.tag
    finally:
        _cli_json("rm", session)
        runtime.close()


@pytest.mark.parametrize(
    "crash_at", ["rollback.old-vm-killed", "restore.layer-made", "restore.state-loaded"]
)
def test_a_rollback_killed_while_it_loads_its_standby_leaves_nothing_behind(
    crash_at: str,
) -> None:
    """forkpoint SIGKILLed mid-rollback (the standby taken, maybe renamed in, unrecorded):
    the next rollback finds the session, kills what was left and restores it."""
    # Orphans (the taken standby's layer) are swept at once, as in the fault campaign.
    sweep = {GRACE_ENV: "0"}

    def cli(*args: str, crash: str = "") -> subprocess.CompletedProcess[str]:
        return _cli(*args, **sweep, **({"FORKPOINT_CRASH_AT": crash} if crash else {}))

    runtime = Runtime.open()
    before = check_home(runtime.home, runtime.store)
    session = _cli_json("create")["id"]
    try:
        asyncio.run(runtime.write_file(session, "/data/m", b"kept\n"))
        assert cli("checkpoint", session).returncode == 0  # and prepares a standby
        standby = _standby(runtime, session)
        assert cli("rollback", session, crash=crash_at).returncode == -signal.SIGKILL
        assert runtime.standbys.rows.get(session) is None  # it was taken
        again = cli("rollback", session)
        assert again.returncode == 0, again.stderr
        record = runtime.store.get_session(session)
        assert record.qemu_pid != standby.qemu_pid  # the half-loaded one was not trusted
        assert _processes_of(runtime, session) == {
            record.qemu_pid,
            _standby(runtime, session).qemu_pid,
        }
        assert asyncio.run(runtime.read_file(session, "/data/m")) == b"kept\n"
        assert new_problems(runtime, before) == []
    finally:
        cli("rm", session)
        runtime.close()


@pytest.mark.parametrize("crash_at", ["standby.reserved", "standby.qemu-started"])
def test_a_standby_whose_start_was_killed_is_discarded_by_the_next_command(
    crash_at: str,
) -> None:
    """forkpoint SIGKILLed while it starts a standby, after the checkpoint was printed:
    the checkpoint stands, and the next command's upkeep kills the unrecorded QEMU."""
    sweep = {GRACE_ENV: "0"}  # the half-made standby's layer is swept at once
    runtime = Runtime.open()
    before = check_home(runtime.home, runtime.store)
    session = _cli_json("create")["id"]
    try:
        crashed = _cli("checkpoint", session, FORKPOINT_CRASH_AT=crash_at, **sweep)
        assert crashed.returncode == -signal.SIGKILL
        checkpoint = json.loads(crashed.stdout)["id"]  # printed before the standby started
        assert runtime.store.get_checkpoint(checkpoint).session_id == session
        row = runtime.standbys.rows.get(session)
        assert row is not None and row.qemu_pid is None  # started (maybe), never recorded
        assert _cli("ls", **sweep).returncode == 0
        assert runtime.standbys.rows.get(session) is None
        assert _processes_of(runtime, session) == {runtime.store.get_session(session).qemu_pid}
        assert new_problems(runtime, before) == []
        rolled = _cli("rollback", session, checkpoint, **sweep)
        assert rolled.returncode == 0, rolled.stderr
        assert _standby(runtime, session).checkpoint_id == checkpoint  # prepared again
    finally:
        _cli("rm", session)
        runtime.close()
