"""Host limits: the free-space reserve and the count of running sessions.

The fast tests check the arithmetic on a real, small filesystem (a tmpfs this test
mounts) and the store's count under racing processes; the VM test drives the CLI with
limits that cannot be met and checks the exit code and that nothing was left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from forkpoint.config import Home, HostLimits, home, parse_size
from forkpoint.errors import InvalidInput, LimitExceeded
from forkpoint.runtime.capacity import checkpoint_bytes, require_space
from forkpoint.store import SessionRecord, SessionState, Store

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_sizes_parse() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("512M") == 512 << 20
    assert parse_size("1G") == parse_size("1GiB") == parse_size("1gb") == 1 << 30
    assert parse_size("1.5K") == 1536
    for bad in ("", "G", "-1G", "ten"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_reserve_is_a_size_or_a_share(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HostLimits().reserve_bytes(100 << 30) == 1 << 30  # default: 1 GiB
    assert HostLimits(disk_reserve="5%").reserve_bytes(100 << 30) == 5 << 30
    monkeypatch.setenv("FORKPOINT_DISK_RESERVE", "2G")
    monkeypatch.setenv("FORKPOINT_MAX_SESSIONS", "3")
    assert HostLimits.from_env() == HostLimits("2G", 3)
    for name, bad in (
        ("FORKPOINT_DISK_RESERVE", "lots"),
        ("FORKPOINT_DISK_RESERVE", "120%"),
        ("FORKPOINT_MAX_SESSIONS", "0"),
        ("FORKPOINT_MAX_SESSIONS", "many"),
    ):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            HostLimits.from_env()
        monkeypatch.delenv(name)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Home]:
    """A 64 MiB tmpfs of this test's own, as a home."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield Home(mount)
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_space_guard_on_a_small_filesystem(small_fs: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKPOINT_DISK_RESERVE", "16M")
    require_space(small_fs, 40 << 20, "a test")  # 64 - 40 leaves 24 MiB > 16 MiB
    with pytest.raises(LimitExceeded, match=r"not enough disk space for a checkpoint.*16\.0 MiB"):
        require_space(small_fs, checkpoint_bytes(128), "a checkpoint")
    # Filling the filesystem makes a small need fail too.
    (small_fs.root / "filler").write_bytes(b"\0" * (40 << 20))
    with pytest.raises(LimitExceeded):
        require_space(small_fs, 10 << 20, "a test")
    monkeypatch.setenv("FORKPOINT_DISK_RESERVE", "50%")
    with pytest.raises(LimitExceeded, match=r"32\.0 MiB must stay free"):
        require_space(small_fs, 0, "a test")
    monkeypatch.setenv("FORKPOINT_DISK_RESERVE", "many")
    with pytest.raises(InvalidInput, match="FORKPOINT_DISK_RESERVE"):
        require_space(small_fs, 0, "a test")


_INSERT = """
import sys
from pathlib import Path
from forkpoint.config import Home
from forkpoint.errors import LimitExceeded
from forkpoint.store import SessionRecord, Store
with Store.open(Home(Path(sys.argv[1]))) as store:
    for i in range(5):
        try:
            store.insert_session(
                SessionRecord.new(image="default", image_hash="h", disk_layer="base.qcow2",
                                  memory_mib=512, cpus=1),
                max_active=int(sys.argv[2]),
            )
            print("ok")
        except LimitExceeded:
            print("refused")
"""


def test_session_count_holds_under_racing_processes(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    with Store.open(home) as store:
        store.insert_layer("base.qcow2")
        stopped = SessionRecord.new(
            image="default", image_hash="h", disk_layer="base.qcow2", memory_mib=512, cpus=1,
            state=SessionState.STOPPED,
        )  # fmt: skip
        store.insert_session(stopped, max_active=1)  # a stopped session does not count
    env = {"PYTHONPATH": SRC, "PATH": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _INSERT, str(home.root), "6"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(o.count("ok") for o in outputs) == 6  # 15 tries, room for exactly 6
    with Store.open(home) as store:
        assert len(store.list_sessions()) == 7
        with pytest.raises(LimitExceeded, match="FORKPOINT_MAX_SESSIONS=6"):
            store.insert_session(replace(stopped, id="s-0000000001"), max_active=6)


# -- through the CLI, with real VMs --------------------------------------------------------


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", *args],
        capture_output=True,
        env={**os.environ, "NO_COLOR": "1", **env},
        timeout=300,
    )


def _ok(*args: str) -> Any:
    import json

    done = _cli(*args, "--json")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return json.loads(done.stdout)


def _ids(*args: str) -> list[str]:
    return [item["id"] for item in _ok(*args)]


def _home_files() -> set[str]:
    root = home().root
    return {
        str(p.relative_to(root))
        for d in ("sessions", "checkpoints", "layers")
        for p in (root / d).rglob("*")
    }


@pytest.mark.vm
def test_limits_refuse_with_exit_4_and_leave_nothing() -> None:
    session = _ok("create")
    try:
        checkpoint = _ok("checkpoint", session["id"])
        sessions, checkpoints = _ids("ls"), _ids("checkpoints")
        before = _home_files()
        no_room = {"FORKPOINT_DISK_RESERVE": "100%"}
        for args in (
            ("create",),
            ("fork", checkpoint["id"], "-n", "2"),
            ("checkpoint", session["id"]),
        ):
            done = _cli(*args, **no_room)
            err = done.stderr.decode()
            assert done.returncode == 4, err
            assert "not enough disk space" in err and "FORKPOINT_DISK_RESERVE" in err
            assert len(err.strip().splitlines()) == 1  # one line
        one = {"FORKPOINT_MAX_SESSIONS": "1"}
        for args in (("create",), ("fork", checkpoint["id"])):
            done = _cli(*args, **one)
            assert done.returncode == 4, done.stderr.decode()
            assert "FORKPOINT_MAX_SESSIONS=1" in done.stderr.decode()
        assert _ids("ls") == sessions
        assert _ids("checkpoints") == checkpoints
        assert _home_files() == before
        # Reviving a crashed session counts too.
        with Store.open(home()) as store:
            os.kill(store.get_session(session["id"]).qemu_pid or 0, signal.SIGKILL)
        assert _ok("show", session["id"])["state"] == "crashed"
        other = _ok("create")
        done = _cli("rollback", session["id"], **one)
        assert done.returncode == 4 and "FORKPOINT_MAX_SESSIONS=1" in done.stderr.decode()
        assert _ok("show", session["id"])["state"] == "crashed"
        _cli("rm", other["id"])
    finally:
        _cli("rm", session["id"])
