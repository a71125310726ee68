"""Warm VMs: QEMU started ahead becomes a created session; the wrong kind, a dead one or a
removed checkpoint's is never handed out (real VMs)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forkpoint.models import Session
from forkpoint.runtime import Runtime
from forkpoint.runtime.housekeeping.invariants import check_home
from forkpoint.runtime.sessions.warm import WarmTarget
from forkpoint.store.warm import WarmRecord
from forkpoint.vm.process import is_running, kill_and_wait
from vm_checks import new_problems, read_port

pytestmark = pytest.mark.vm

FORKPOINT = Path(sys.executable).with_name("forkpoint")


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    monkeypatch.setenv("FORKPOINT_WARM_VMS", "2")
    runtime = Runtime.open()
    yield runtime
    runtime.warm.drain()
    runtime.close()


def _alive(rt: Runtime, session_id: str, pid: int | None) -> bool:
    return is_running(pid, rt.files(session_id).name)


LISTENER = """
import socket
s = socket.create_server(("", 8000))
while True:
    c, _ = s.accept()
    c.recv(100)
    c.sendall(b"from the warm VM")
    c.close()
"""


def test_a_create_becomes_a_warm_vm(rt: Runtime) -> None:
    before = check_home(rt.home, rt.store)
    assert asyncio.run(rt.fill_warm(ports=[8000])) == 2
    warm = {w.id: w for w in rt.warm.rows.all()}
    assert len(warm) == 2 and all(_alive(rt, w.id, w.qemu_pid) for w in warm.values())
    assert all(_alive(rt, w.id, w.passt_pid) for w in warm.values())
    reserved = {w.forwards[0][0] for w in warm.values()}  # a host port each, for 8000
    assert len(reserved) == 2 and reserved <= rt.store.allocated_host_ports()
    assert new_problems(rt, before) == []  # owned by their rows, files recorded

    session = asyncio.run(rt.create(ports=[8000]))
    try:
        assert session.id in warm  # the session is the warm VM: its id, uid, QEMU, passt
        record = rt.store.get_session(session.id)
        assert record.qemu_pid == warm[session.id].qemu_pid
        assert record.aux_pids == (warm[session.id].passt_pid,)
        assert record.uid == warm[session.id].uid
        assert record.disk_layer == warm[session.id].disk_layer
        assert [(p.host_port, p.guest_port) for p in session.ports] == list(
            warm[session.id].forwards
        )
        assert asyncio.run(rt.exec(session.id, ["hostname"])).stdout.strip() == session.id
        assert len(rt.warm.rows.all()) == 1  # taken once
        assert new_problems(rt, before) == []
        asyncio.run(rt.spawn(session.id, ["python3", "-c", LISTENER]))  # its ports do forward
        assert read_port(session.ports[0].host_port) == b"from the warm VM"

        # Other ports, another shape: other keys. They start cold and leave the pool alone.
        for kind in ({}, {"ports": [8001]}, {"memory_mib": 384, "network": "none"}):
            other = asyncio.run(rt.create(**kind))
            assert other.id not in warm
            asyncio.run(rt.remove(other.id))
        [left] = rt.warm.rows.all()

        # A warm VM whose QEMU died is dropped, with its files, and the create starts cold.
        assert left.qemu_pid is not None
        kill_and_wait(left.qemu_pid, rt.files(left.id).name)  # gone before the create
        cold = asyncio.run(rt.create(ports=[8000]))
        assert cold.id != left.id
        assert rt.warm.rows.all() == []
        assert not rt.files(left.id).dir.exists()
        assert not (rt.home.layers / left.disk_layer).exists()
        asyncio.run(rt.remove(cold.id))
    finally:
        asyncio.run(rt.remove(session.id))
    assert new_problems(rt, before) == []


def test_a_warm_vm_that_dies_once_taken_is_restored_cold_in_its_place(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = check_home(rt.home, rt.store)
    assert asyncio.run(rt.fill_warm(ports=[8000], count=1)) == 1
    [warm] = rt.warm.rows.all()
    take = rt.warm.take

    def take_then_die(target: WarmTarget) -> WarmRecord | None:
        record = take(target)
        assert record is not None and record.qemu_pid is not None
        kill_and_wait(record.qemu_pid, rt.files(record.id).name)  # after the pool's check
        return record

    monkeypatch.setattr(rt.warm, "take", take_then_die)
    session = asyncio.run(rt.create(ports=[8000]))
    try:
        record = rt.store.get_session(session.id)
        assert session.id == warm.id and record.qemu_pid != warm.qemu_pid  # a new QEMU
        assert record.disk_layer != warm.disk_layer
        assert not (rt.home.layers / warm.disk_layer).exists()
        assert [(p.host_port, p.guest_port) for p in session.ports] == list(warm.forwards)
        asyncio.run(rt.spawn(session.id, ["python3", "-c", LISTENER]))  # its ports, a new passt
        assert read_port(session.ports[0].host_port) == b"from the warm VM"
        assert new_problems(rt, before) == []
    finally:
        asyncio.run(rt.remove(session.id))
    assert new_problems(rt, before) == []


def test_forks_take_warm_vms_of_their_checkpoint_and_its_removal_stops_them(
    rt: Runtime,
) -> None:
    before = check_home(rt.home, rt.store)
    session = asyncio.run(rt.create())
    try:
        asyncio.run(rt.write_file(session.id, "/data/marker", b"from the checkpoint"))
        checkpoint = asyncio.run(rt.checkpoint(session.id))
    finally:
        asyncio.run(rt.remove(session.id))
    assert asyncio.run(rt.fill_warm(checkpoint=checkpoint.id, count=3)) == 3
    warm = {w.id for w in rt.warm.rows.all()}
    forks = asyncio.run(rt.fork(checkpoint.id, 2))
    try:
        assert all(isinstance(f, Session) for f in forks), forks
        assert {f.id for f in forks if isinstance(f, Session)} <= warm
        for fork in forks:
            assert isinstance(fork, Session)
            marker = asyncio.run(rt.read_file(fork.id, "/data/marker"))
            assert marker == b"from the checkpoint"
    finally:
        for fork in forks:
            if isinstance(fork, Session):
                asyncio.run(rt.remove(fork.id))
    [left] = rt.warm.rows.all()
    asyncio.run(rt.remove_checkpoint(checkpoint.id))  # its RAM file goes: so does its warm VM
    assert rt.warm.rows.all() == []
    assert not _alive(rt, left.id, left.qemu_pid)
    assert new_problems(rt, before) == []


def test_the_cli_refills_after_create_and_drains() -> None:
    env = {**os.environ, "FORKPOINT_WARM_VMS": "1"}

    def cli(*args: str) -> Any:
        done = subprocess.run(
            [str(FORKPOINT), *args, "--json"], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = cli("create")
    try:
        refilled = cli("warm")  # the create left one warm VM behind: nothing to start
        assert refilled["started"] == 0 and len(refilled["warm"]) == 1
        second = cli("create")
        try:
            assert second["id"] == refilled["warm"][0]["id"]
        finally:
            cli("rm", second["id"])
    finally:
        cli("rm", first["id"])
    drained = cli("warm", "--drain")
    assert drained["drained"] == 1 and drained["warm"] == []
