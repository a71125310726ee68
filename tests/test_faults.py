"""The reduced fault campaign (``make faults`` runs the full one; docs/reliability.md),
and the pieces it stands on: crash points, the orphan sweep, the integrity check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forkpoint.config import home
from forkpoint.errors import DamagedCheckpoint
from forkpoint.runtime.integrity import check_before_restore, describe_files
from forkpoint.runtime.manifest import CheckpointFiles
from forkpoint.runtime.orphans import GRACE_ENV, sweep_orphans
from forkpoint.store import Store

sys.path.insert(0, str(Path(__file__).parent))
import faults_campaign  # noqa: E402


def test_crash_point_is_a_no_op_unless_named() -> None:
    code = "from forkpoint import faults; faults.point('a'); faults.point('b'); print('ran')"
    env = {**os.environ, "FORKPOINT_CRASH_AT": "b"}
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).stdout == b"ran\n"
    killed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL and killed.stdout == b""
    env["FORKPOINT_CRASH_AT"] = "3"  # only two points are passed
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0


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
        (h.layers / "fedcba9876543210.qcow2").unlink()
        store.close()


def test_damaged_files_are_refused(tmp_path: Path) -> None:
    files = CheckpointFiles(tmp_path / "c-0000000001")
    files.dir.mkdir()
    files.state.write_bytes(os.urandom(300_000))
    with open(files.ram, "wb") as ram:  # sparse, like a real one
        ram.truncate(64 << 20)
        ram.seek(8 << 20)
        ram.write(os.urandom(1 << 20))
    manifest = {"format": 1, "files": describe_files(files)}
    files.manifest.write_text(__import__("json").dumps(manifest))
    check_before_restore(files, manifest)
    with open(files.state, "r+b") as f:
        f.seek(1000)
        f.write(b"\0\1\2")
    with pytest.raises(DamagedCheckpoint, match="damaged checkpoint .*state's content differs"):
        check_before_restore(files, manifest)


@pytest.mark.vm
def test_reduced_fault_campaign(tmp_path: Path) -> None:
    result = faults_campaign.main(["--quick", "--out", str(tmp_path)])
    violations = [v for r in result["crash_points"] + result["other_faults"] for v in r["violations"]]
    assert violations == [] and result["restore_violations"] == []
    assert sum(r["injected"] for r in result["crash_points"]) >= 12
