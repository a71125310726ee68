"""The restore contract without a VM: the agent's side (``guest/restore.py``) on host
directories, the Python library and the shell helper, the wire, the manifest flag, the
event names and the image layout that puts the library in reach of an image's Python."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from forkpoint.guest.restore import RestoreOps, process_start_time
from forkpoint.images.rootfs import install_guest_files
from forkpoint.models import CheckpointKind
from forkpoint.protocol import (
    RestoreFacts,
    RestoreIdentityArgs,
    RestoreStatusArgs,
    from_wire,
    to_wire,
)
from forkpoint.runtime.checkpoints.manifest import Manifest
from forkpoint.runtime.sessions.machines import has_restore_listeners, restore_facts
from forkpoint.store import CheckpointRecord

LIB = Path(__file__).parent.parent / "src/forkpoint/guest/lib"
HELPER = LIB / "forkpoint-guest"
FACTS = RestoreFacts("fork", "s-1", "c-1", hook_timeout_s=1.0)

# Counts the SIGUSR1s it gets into argv[1]; prints "ready" once its handler is in place.
COUNTING_CHILD = """
import signal, sys, time
count = 0
def got(*_):
    global count
    count += 1
    open(sys.argv[1], "w").write(str(count))
signal.signal(signal.SIGUSR1, got)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


class _Ctx:
    """The request context a handler gets (unused by ``status``)."""


def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def ops(tmp_path: Path) -> RestoreOps:
    return RestoreOps(
        str(tmp_path / "run"), str(tmp_path / "restore.d"), str(tmp_path / "restore.log")
    )


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(name: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", COUNTING_CHILD, str(tmp_path / name)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _register(ops: RestoreOps, pid: int, signum: int = signal.SIGUSR1, start: int = 0) -> Path:
    ops.notify_dir.mkdir(parents=True, exist_ok=True)
    path = ops.notify_dir / str(pid)
    path.write_text(f"{signum} {start or process_start_time(pid)}\n")
    return path


def _status(ops: RestoreOps, wait_s: float = 0.0) -> Any:
    return ops.status(_Ctx(), RestoreStatusArgs(wait_s))  # type: ignore[arg-type]


# -- the agent's side ----------------------------------------------------------------------


def test_each_restore_is_published_with_a_new_generation(ops: RestoreOps) -> None:
    assert _status(ops).generation == 0
    ops.restored(FACTS, "fork-1")
    ops.restored(RestoreFacts("rollback", "s-1", "c-2"), None)
    status = _status(ops)
    assert (status.generation, status.event, status.checkpoint) == (2, "rollback", "c-2")
    assert (ops.run_dir / "generation").read_text() == "2\n"
    assert status.at and status.notified == [] and status.hook_runs == []
    assert ops.notify_dir.stat().st_mode & 0o7777 == 0o1777


def test_only_registered_live_processes_get_their_signal_once(
    ops: RestoreOps, child: Callable[[str], subprocess.Popen[str]], tmp_path: Path
) -> None:
    asked, silent, reused, foreign = child("asked"), child("silent"), child("reused"), child("x")
    _register(ops, asked.pid)
    stale = _register(ops, reused.pid, start=(process_start_time(reused.pid) or 0) + 1)
    not_theirs = _register(ops, foreign.pid)
    os.chown(not_theirs, 65534, 65534)  # another user's file naming root's process
    gone = _register(ops, 999_999, start=1)
    (ops.notify_dir / ".123.tmp").write_text("being written")
    ops.restored(FACTS, None)
    _wait_for(lambda: (tmp_path / "asked").exists())
    assert _status(ops).notified == [asked.pid]
    time.sleep(0.3)
    assert (tmp_path / "asked").read_text() == "1"
    assert not any((tmp_path / n).exists() for n in ("silent", "reused", "x"))
    assert silent.poll() is None
    assert not stale.exists() and not not_theirs.exists() and not gone.exists()
    assert _status(ops).listeners == 1

    ops.restored(FACTS, None)  # the next restore: one more
    _wait_for(lambda: (tmp_path / "asked").read_text() == "2")


def test_a_registration_must_be_a_plain_file(ops: RestoreOps, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text(f"{signal.SIGUSR1} {process_start_time(os.getpid())}\n")
    ops.notify_dir.mkdir(parents=True)
    (ops.notify_dir / str(os.getpid())).symlink_to(target)
    ops.restored(FACTS, None)
    assert _status(ops).notified == []
    assert target.exists()  # only the link went


def test_hooks_run_in_order_with_the_event_and_are_killed_at_their_limit(
    ops: RestoreOps, tmp_path: Path
) -> None:
    ops.hook_dir.mkdir()
    scripts = {
        "10-env": f"env | grep ^FORKPOINT_ | sort > {tmp_path}/env\n",
        "20-hang": f"sleep 60 & echo $! > {tmp_path}/hang-child\nwait\n",
        "30-fail": "echo failing\nexit 3\n",
        ".hidden": "exit 9\n",
        "40-not-executable": "exit 9\n",
    }
    for name, body in scripts.items():
        (ops.hook_dir / name).write_text("#!/bin/sh\n" + body)
        (ops.hook_dir / name).chmod(0o644 if name == "40-not-executable" else 0o755)
    ops.restored(FACTS, "fork-1")
    assert _status(ops).hooks_running
    status = _status(ops, wait_s=10)
    assert not status.hooks_running and status.hooks == 3
    runs = {run.name: run for run in status.hook_runs}
    assert list(runs) == ["10-env", "20-hang", "30-fail"]
    assert runs["10-env"].ok and runs["30-fail"].exit_code == 3
    assert runs["20-hang"].timed_out and runs["20-hang"].exit_code is None
    assert 900 <= runs["20-hang"].duration_ms < 5000
    env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines())
    assert env == {
        "FORKPOINT_CHECKPOINT": "c-1", "FORKPOINT_EVENT": "fork", "FORKPOINT_GENERATION": "1",
        "FORKPOINT_HOSTNAME": "fork-1", "FORKPOINT_SESSION": "s-1",
    }  # fmt: skip
    hang_child = int((tmp_path / "hang-child").read_text())
    _wait_for(lambda: process_start_time(hang_child) is None)  # its group was killed
    log = ops.log_file.read_text()
    assert "failing" in log and "30-fail: exit 3" in log and "killed at its limit" in log


# -- the library and the shell helper ------------------------------------------------------


@pytest.fixture
def lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("forkpoint_guest", LIB / "forkpoint_guest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RUN_DIR", str(tmp_path))
    (tmp_path / "notify").mkdir()
    before = signal.getsignal(module.DEFAULT_SIGNAL)
    yield module
    signal.signal(module.DEFAULT_SIGNAL, before)


def test_on_restore_registers_and_calls_back_once_per_generation(
    lib: ModuleType, tmp_path: Path
) -> None:
    seen: list[dict[str, Any]] = []
    lib.on_restore(seen.append)
    registration = (tmp_path / "notify" / str(os.getpid())).read_text().split()
    assert registration == [str(lib.DEFAULT_SIGNAL), str(process_start_time(os.getpid()))]
    os.kill(os.getpid(), lib.DEFAULT_SIGNAL)  # nothing was restored: a stray signal
    assert seen == []
    (tmp_path / "restore.json").write_text('{"generation": 1, "event": "fork"}')
    (tmp_path / "generation").write_text("1\n")
    os.kill(os.getpid(), lib.DEFAULT_SIGNAL)
    os.kill(os.getpid(), lib.DEFAULT_SIGNAL)
    assert seen == [{"generation": 1, "event": "fork"}]
    lib.unregister()
    assert not (tmp_path / "notify" / str(os.getpid())).exists()


def test_reseed_gives_random_a_fresh_state(lib: ModuleType) -> None:
    mine = random.Random(7)
    random.seed(7)
    first = (random.random(), mine.random())
    random.seed(7)
    mine.seed(7)
    lib.reseed(mine)
    assert random.random() != first[0] and mine.random() != first[1]


def test_wait_restore_returns_the_next_state(lib: ModuleType, tmp_path: Path) -> None:
    assert lib.wait_restore(timeout=0.2) is None

    def restore() -> None:
        time.sleep(0.2)
        (tmp_path / "restore.json").write_text('{"generation": 5}')
        (tmp_path / "generation").write_text("5\n")

    threading.Thread(target=restore).start()
    assert lib.wait_restore(timeout=10) == {"generation": 5}


def _helper(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(HELPER), *args], capture_output=True, text=True, timeout=30,
        env={**os.environ, "FORKPOINT_RUN_DIR": str(run_dir)},
    )  # fmt: skip


def test_the_shell_helper_registers_and_waits(tmp_path: Path) -> None:
    (tmp_path / "notify").mkdir()
    assert _helper(tmp_path, "generation").stdout == "0\n"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert _helper(tmp_path, "register", "USR2", str(sleeper.pid)).returncode == 0
        written = (tmp_path / "notify" / str(sleeper.pid)).read_text()
        assert written == f"{signal.SIGUSR2} {process_start_time(sleeper.pid)}\n"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert _helper(tmp_path, "register", "BOGUS").returncode == 2
    assert _helper(tmp_path, "wait-restore", "--timeout", "1").returncode == 1

    def restore() -> None:
        time.sleep(0.5)
        (tmp_path / "restore.json").write_text('{"generation": 1}\n')
        (tmp_path / "generation").write_text("1\n")

    threading.Thread(target=restore).start()
    waited = _helper(tmp_path, "wait-restore", "--timeout", "20")
    assert waited.returncode == 0 and waited.stdout == '{"generation": 1}\n'


# -- the host's side -----------------------------------------------------------------------


def test_the_vm_has_the_port_the_guest_opens() -> None:
    from forkpoint.protocol import RESTORE_LISTENERS_PORT
    from forkpoint.vm import argv

    assert argv.RESTORE_LISTENERS_PORT == RESTORE_LISTENERS_PORT


def test_the_restore_travels_in_the_identity() -> None:
    args = RestoreIdentityArgs(time.time_ns(), os.urandom(16), "h", "s-1:0", FACTS)
    assert from_wire(RestoreIdentityArgs, to_wire(args)) == args
    assert "restore" not in to_wire(RestoreIdentityArgs(time.time_ns(), os.urandom(16)))
    with pytest.raises(ValueError, match="event must be one of"):
        RestoreFacts("reboot", "s", "c")
    with pytest.raises(ValueError, match="hook_timeout_s"):
        RestoreFacts("fork", "s", "c", hook_timeout_s=0)


def _checkpoint(kind: CheckpointKind, manifest: dict[str, Any]) -> CheckpointRecord:
    return CheckpointRecord(
        id="c-1", session_id="s-0", name=None, kind=kind, created_at="2026-01-01T00:00:00Z",
        disk_layer="l.qcow2", parent_checkpoint=None, image="default", image_hash="h",
        manifest=manifest,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "generation", "event"),
    [
        (CheckpointKind.TEMPLATE, 0, "create"),
        (CheckpointKind.USER, 0, "fork"),
        (CheckpointKind.FORK, 0, "fork"),
        (CheckpointKind.USER, 3, "rollback"),
        (CheckpointKind.HISTORY, 1, "rollback"),
        (CheckpointKind.PAUSE, 2, "resume"),
    ],
)
def test_what_a_restore_is_called(kind: CheckpointKind, generation: int, event: str) -> None:
    facts = restore_facts("s-1", generation, _checkpoint(kind, {}))
    assert (facts.event, facts.session, facts.checkpoint) == (event, "s-1", "c-1")


def test_the_manifest_says_whether_a_restore_waits_for_the_guest() -> None:
    data: dict[str, Any] = {
        "format": 1, "id": "c-1", "session_id": "s-0", "name": None, "kind": "user",
        "machine": {"memory_mib": 512, "cpus": 1, "accel": "tcg", "qemu": "q",
                    "argv_layout": 8},
        "image": "default", "image_hash": "h", "disk_layer": "l.qcow2",
    }  # fmt: skip
    plain = Manifest.from_dict(data)
    assert not plain.restore_listeners and "restore_listeners" not in plain.to_dict()
    told = Manifest.from_dict({**data, "restore_listeners": True})
    assert told.restore_listeners and told.to_dict()["restore_listeners"] is True
    assert has_restore_listeners(_checkpoint(CheckpointKind.USER, told.to_dict()))
    assert not has_restore_listeners(_checkpoint(CheckpointKind.USER, plain.to_dict()))


def test_images_carry_the_library_and_the_helper(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    debian = tree / "usr/lib/python3/dist-packages"
    official = tree / "usr/local/lib/python3.12/site-packages"
    for site in (debian, official):
        site.mkdir(parents=True)
    (tree / "etc").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "usr/lib/python3.11").mkdir(parents=True)
    (tree / "usr/lib/python3.11/site-packages").symlink_to(outside)  # leads out: skipped
    written = install_guest_files(tree)
    line = "/opt/forkpoint/forkpoint/guest/lib\n"
    assert (debian / "forkpoint.pth").read_text() == line
    assert (official / "forkpoint.pth").read_text() == line
    assert not (outside / "forkpoint.pth").exists()
    helper = tree / "usr/local/bin/forkpoint-guest"
    assert helper.stat().st_mode & 0o777 == 0o755 and "/usr/local/bin/forkpoint-guest" in written
    assert (tree / "opt/forkpoint/forkpoint/guest/lib/forkpoint_guest.py").is_file()
    found = subprocess.run(
        [sys.executable, "-S", "-c", "import forkpoint_guest; print(forkpoint_guest.generation())"],
        capture_output=True, text=True,
        env={"PYTHONPATH": str(tree / "opt/forkpoint/forkpoint/guest/lib")},
    )  # fmt: skip
    assert found.stdout == "0\n", found.stderr
