"""The reduced fault campaign (``make faults`` runs the full one; docs/reliability.md),
and the pieces it stands on: crash points, the orphan sweep, the integrity check."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from forkpoint.config import Home, home
from forkpoint.errors import DamagedCheckpoint, InternalError
from forkpoint.runtime import Runtime
from forkpoint.runtime.checkpoints.integrity import (
    SUM_KEY,
    check_before_restore,
    describe_files,
    page_sum,
)
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles
from forkpoint.runtime.housekeeping.invariants import check_home
from forkpoint.runtime.housekeeping.orphans import GRACE_ENV, sweep_orphans
from forkpoint.runtime.sessions.ports import HostPorts
from forkpoint.store import PortForward, SessionRecord, SessionState, Store, session_lock

sys.path.insert(0, str(Path(__file__).parent))
import faults_campaign  # noqa: E402


def test_crash_point_is_a_no_op_unless_named() -> None:
    code = "from forkpoint import faults; faults.point('a'); faults.point('b'); print('ran')"
    env = {**os.environ, "FORKPOINT_CRASH_AT": "b"}
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).stdout == b"ran\n"
    killed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL and killed.stdout == b""
    env["FORKPOINT_CRASH_AT"] = "3"  # only two points are passed
    assert (
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0
    )


def test_crash_point_costs_nothing_when_off() -> None:
    from forkpoint import faults

    started = time.perf_counter()
    for _ in range(100_000):
        faults.point("x")
    assert (time.perf_counter() - started) / 100_000 < 2e-6  # ≈ 50 ns here


def test_orphans_are_swept_and_work_in_progress_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a forkpoint killed between making a file and recording it (a restore's
    layer, a checkpoint's staging directory, a removed session's directory) leaked it."""
    h = home().ensure()
    layer = h.layers / "0123456789abcdef.qcow2"
    staging = h.checkpoints / ".tmp-c-00000000ff"
    session = h.sessions / "s-00000000ff"
    for d in (staging, session):
        d.mkdir(parents=True, exist_ok=True)
    layer.write_bytes(b"x")
    held = (h.layers / "fedcba9876543210.qcow2").open("wb")  # open: a VM's unrecorded layer
    # A VM whose checkpoint was killed keeps the staging's device state open: no excuse.
    state = (staging / "state").open("wb")
    store = Store.open(h)
    try:
        monkeypatch.setenv(GRACE_ENV, "3600")
        assert sweep_orphans(h, store) == []  # young: maybe work in progress
        monkeypatch.setenv(GRACE_ENV, "0")
        removed = set(sweep_orphans(h, store))
        assert {layer.name, staging.name, session.name} <= removed
        assert "fedcba9876543210.qcow2" not in removed
        assert not layer.exists() and not staging.exists() and not session.exists()
    finally:
        held.close()
        state.close()
        (h.layers / "fedcba9876543210.qcow2").unlink()
        store.close()


def _sparse_ram(path: Path, pages: dict[int, bytes]) -> None:
    with open(path, "wb") as ram:
        ram.truncate(64 << 20)
        for index, data in pages.items():
            ram.seek(index * 4096)
            ram.write(data)


def test_page_sum_follows_written_pages(tmp_path: Path) -> None:
    """A checkpoint's RAM sum is its base's updated for the pages written: equal to the
    sum of the whole file, and moved by any page changed."""
    base = CheckpointFiles(tmp_path / "c-0000000001")
    base.dir.mkdir()
    # Pages 3 and 5 share a block with a hole between them: two extents, one block.
    _sparse_ram(base.ram, {i: os.urandom(4096) for i in (3, 5, 900, 5000)})
    base.state.write_bytes(b"s")
    base.manifest.write_text(json.dumps({"files": describe_files(base, tmp_path / "none", ())}))
    new = CheckpointFiles(tmp_path / "c-0000000002")
    new.dir.mkdir()
    shutil.copyfile(base.ram, new.ram)
    with open(new.ram, "r+b") as f:  # pages 4 and 7 written (7 was a hole)
        for index in (4, 7):
            f.seek(index * 4096)
            f.write(os.urandom(4096))
    new.state.write_bytes(b"s")
    described = describe_files(new, base.ram, ((4 * 4096, 4096), (7 * 4096, 4096)))
    assert described["ram"][SUM_KEY] == f"{page_sum(new.ram):032x}"
    assert described["ram"][SUM_KEY] != f"{page_sum(base.ram):032x}"


def test_damaged_files_are_refused(tmp_path: Path) -> None:
    files = CheckpointFiles(tmp_path / "c-0000000001")
    files.dir.mkdir()
    files.state.write_bytes(os.urandom(300_000))
    _sparse_ram(files.ram, {2048: os.urandom(1 << 20)})
    manifest = {"format": 1, "files": describe_files(files, tmp_path / "none", ())}
    files.manifest.write_text(json.dumps(manifest))
    check_before_restore(files, manifest)
    with open(files.ram, "r+b") as f:  # a byte flipped: the change time moves
        f.seek((2048 << 12) + 5000)
        f.write(b"\xff")
    with pytest.raises(DamagedCheckpoint, match="damaged checkpoint .*ram's content differs"):
        check_before_restore(files, manifest)
    (files.dir / "ram.verified").unlink(missing_ok=True)
    files.manifest.write_text(json.dumps({**manifest, "format": 2}))
    with pytest.raises(DamagedCheckpoint, match="differs from the store's copy"):
        check_before_restore(files, manifest)


def test_a_full_disk_is_a_clear_store_error(tmp_path: Path) -> None:
    """Regression: a disk filling up during a checkpoint surfaced as ``OperationalError:
    database or disk is full``; the transaction rolls back and says what happened."""
    store = Store.open(Home(tmp_path))
    try:
        conn = store._connection()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own SQLITE_FULL
        with pytest.raises(InternalError, match="metadata database .* the disk is full"):
            for n in range(1000):
                store.insert_layer(f"{n:016x}.qcow2")
        conn.execute("PRAGMA max_page_count = 1073741823")
        store.insert_layer("ffffffffffffffff.qcow2")  # the store still works
    finally:
        store.close()


def _session_row(store: Store, **kw: object) -> SessionRecord:
    store.insert_layer("base.qcow2")
    record = SessionRecord.new(
        image="default", image_hash="ih1", disk_layer="base.qcow2", memory_mib=512, cpus=1
    )
    return store.insert_session(replace(record, **kw))  # type: ignore[arg-type]


def test_a_session_left_creating_by_a_killed_creator_is_crashed(tmp_path: Path) -> None:
    """Regression: a create or fork killed after inserting its row left the session
    ``creating`` for ever (not crashed, so not recoverable; its QEMU unowned)."""
    h = Home(tmp_path).ensure()
    rt = Runtime(h, Store.open(h))
    try:
        record = _session_row(rt.store)
        with session_lock(h, record.id):  # its creator, alive
            assert rt.get(record.id).state == SessionState.CREATING
        assert rt.get(record.id).state == SessionState.CRASHED  # the creator is gone
        assert not [p for p in check_home(h, rt.store) if "creating" in p]
    finally:
        rt.close()


def test_ports_are_kept_where_free_and_moved_where_taken(tmp_path: Path) -> None:
    """Regression: reviving a session after a host restart failed when another program
    had taken one of its host ports meanwhile (passt cannot bind it)."""
    h = Home(tmp_path).ensure()
    store = Store.open(h)
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        ports = (PortForward(80, taken), PortForward(8000, free))
        record = _session_row(store, ports=ports)
        moved = HostPorts(h, store).keep_or_move(record.id)
        assert list(moved) == [taken] and moved[taken] not in (taken, free)
        after = {p.guest_port: p.host_port for p in store.get_session(record.id).ports}
        assert after == {80: moved[taken], 8000: free}
        assert HostPorts(h, store).keep_or_move(record.id) == {}  # all free now: kept
    finally:
        squatter.close()
        store.close()


@pytest.mark.vm
def test_reduced_fault_campaign(tmp_path: Path) -> None:
    result = faults_campaign.main(["--quick", "--out", str(tmp_path)])
    violations = [
        v for r in result["crash_points"] + result["other_faults"] for v in r["violations"]
    ]
    assert violations == [] and result["restore_violations"] == []
    assert sum(r["injected"] for r in result["crash_points"]) >= 12
