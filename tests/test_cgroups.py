"""Per-session cgroups: hierarchy discovery, the files written for v1 and v2 (against
temporary directories laid out like each), reading limits back, missing controllers, and
the real hierarchies of this host (v1 controllers, and the v2 mount beside them)."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkpoint.config import Home
from forkpoint.errors import InvalidInput
from forkpoint.runtime.sessions.limits import (
    QEMU_OVERHEAD_MIB,
    limits_for,
    report_not_enforced,
)
from forkpoint.vm import cgroups
from forkpoint.vm.argv import TCG_TB_MIB
from forkpoint.vm.cgroups import (
    CgroupHost,
    Hierarchy,
    ResourceLimits,
    limits_from,
    parse_hierarchies,
)
from forkpoint.vm.shape import MachineShape

LIMITS = ResourceLimits(memory_bytes=700 << 20, cpus=2, pids_max=256, io_weight=200)

# This host: v1 controllers, a v2 mount without controllers beside them, and forkpoint
# in a memory cgroup of its own (a container manager's).
HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = """\
9:name=systemd:/
8:pids:/
7:blkio:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
"""
# Debian 13: one unified hierarchy; forkpoint in a systemd service's cgroup.
V2_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V2_SELF = "0::/system.slice/forkpoint.service\n"


def test_hierarchies_of_a_hybrid_host() -> None:
    found = {h.mount.name: h for h in parse_hierarchies(HYBRID_MOUNTINFO, HYBRID_SELF)}
    assert set(found) == {"cpu", "memory", "blkio", "pids", "unified"}  # no cpuacct, systemd
    assert found["memory"].own == Path("/sys/fs/cgroup/memory/process_api/abc")
    assert found["memory"].base == Path("/sys/fs/cgroup/memory/process_api/abc/forkpoint")
    assert found["blkio"].controllers == {"io"}
    assert (found["cpu"].version, found["unified"].version) == (1, 2)


def test_hierarchies_of_a_v2_host() -> None:
    (only,) = parse_hierarchies(V2_MOUNTINFO, V2_SELF)
    assert only.version == 2
    assert only.own == Path("/sys/fs/cgroup/system.slice/forkpoint.service")


def test_a_mount_of_another_part_of_the_tree_is_not_ours() -> None:
    # A container's mount shows /docker/x only; we run elsewhere: nothing to use there.
    mountinfo = "30 23 0:26 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert parse_hierarchies(mountinfo, "0::/user.slice\n") == []
    (inside,) = parse_hierarchies(mountinfo, "0::/docker/x/app\n")
    assert inside.own == Path("/sys/fs/cgroup/app")


# -- the files, against temporary directories --------------------------------------------


def _v1_host(root: Path, *, memsw: bool = True, blkio_weight: bool = True) -> CgroupHost:
    """Directories laid out like this host's v1 hierarchies; control files that a real
    cgroup directory would have are made in advance (mkdir makes none in a tmp dir)."""
    hierarchies = []
    for name, controller in (("memory", "memory"), ("cpu", "cpu"), ("pids", "pids")):
        own = root / name / "own"
        hierarchies.append(Hierarchy(1, root / name, "/", own, frozenset({controller})))
    hierarchies.append(Hierarchy(1, root / "blkio", "/", root / "blkio", frozenset({"io"})))
    session = root / "memory" / "own" / "forkpoint" / "s-1"
    session.mkdir(parents=True)
    if memsw:
        (session / "memory.memsw.limit_in_bytes").write_text("9223372036854771712")
    if blkio_weight:
        blkio = root / "blkio" / "forkpoint" / "s-1"
        blkio.mkdir(parents=True)
        (blkio / "blkio.weight").write_text("500")
    return CgroupHost(hierarchies)


def test_v1_files(tmp_path: Path) -> None:
    cgroup = _v1_host(tmp_path).create("s-1", LIMITS)
    assert cgroup.not_enforced == {}
    memory = tmp_path / "memory/own/forkpoint/s-1"
    assert (memory / "memory.limit_in_bytes").read_text() == str(700 << 20)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(700 << 20)  # no swap
    cpu = tmp_path / "cpu/own/forkpoint/s-1"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "200000"
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (tmp_path / "pids/own/forkpoint/s-1/pids.max").read_text() == "256"
    # v2's 200 (twice the default) is blkio's 1000 (twice its default 500)
    assert (tmp_path / "blkio/forkpoint/s-1/blkio.weight").read_text() == "1000"
    assert set(cgroup.dirs) == {memory, cpu, tmp_path / "pids/own/forkpoint/s-1",
                                tmp_path / "blkio/forkpoint/s-1"}  # fmt: skip


def test_v1_without_blkio_weight_reports_io(tmp_path: Path) -> None:
    cgroup = _v1_host(tmp_path, memsw=False, blkio_weight=False).create("s-1", LIMITS)
    assert set(cgroup.not_enforced) == {"io"}
    assert "blkio.weight" in cgroup.not_enforced["io"]
    assert not (tmp_path / "blkio/forkpoint/s-1").exists()  # no empty directory left
    assert not (tmp_path / "memory/own/forkpoint/s-1/memory.memsw.limit_in_bytes").exists()


def _v2_host(root: Path, available: str = "cpuset cpu io memory hugetlb pids") -> CgroupHost:
    own = root / "system.slice" / "forkpoint.service"
    session = own / "forkpoint" / "s-1"
    session.mkdir(parents=True)
    (own / "cgroup.controllers").write_text(available + "\n")
    for parent in (own, own / "forkpoint"):
        (parent / "cgroup.subtree_control").write_text("")
    for name in ("memory.swap.max", "io.weight"):
        (session / name).write_text("max\n" if name == "memory.swap.max" else "default 100\n")
    (only,) = parse_hierarchies(
        f"30 23 0:26 / {root} rw - cgroup2 cgroup2 rw\n", "0::/system.slice/forkpoint.service\n"
    )
    return CgroupHost([_with_controllers(only)])


def _with_controllers(hierarchy: Hierarchy) -> Hierarchy:
    from forkpoint.vm.cgroups import _with_v2_controllers

    return _with_v2_controllers(hierarchy)


def test_v2_files(tmp_path: Path) -> None:
    host = _v2_host(tmp_path)
    cgroup = host.create("s-1", LIMITS)
    assert cgroup.not_enforced == {}
    own = tmp_path / "system.slice/forkpoint.service"
    session = own / "forkpoint/s-1"
    assert list(cgroup.dirs) == [session]
    assert (session / "memory.max").read_text() == str(700 << 20)
    assert (session / "memory.swap.max").read_text() == "0"
    assert (session / "cpu.max").read_text() == "200000 100000"
    assert (session / "pids.max").read_text() == "256"
    assert (session / "io.weight").read_text() == "default 200"
    # enabled for our children, ours and forkpoint/'s (the tmp file keeps the last write)
    assert (own / "cgroup.subtree_control").read_text() == "+io"
    assert (own / "forkpoint/cgroup.subtree_control").read_text() == "+io"


def test_v2_without_controllers_reports_each(tmp_path: Path) -> None:
    cgroup = _v2_host(tmp_path, available="cpu").create("s-1", LIMITS)
    assert set(cgroup.not_enforced) == {"memory", "pids", "io"}
    assert cgroup.not_enforced["memory"] == "no cgroup hierarchy offers memory"


def _busy_while_populated(monkeypatch: pytest.MonkeyPatch, own: Path) -> list[str]:
    """cgroup v2's "no internal processes" rule, for ``own``: enabling a controller for
    its children fails (EBUSY) while its cgroup.procs lists a process."""
    moved: list[str] = []
    real = cgroups._write_control

    def write(control: Path, text: str) -> None:
        if control.parent == own and not moved:
            raise OSError(errno.EBUSY, "Device or resource busy")
        real(control, text)

    real_leave = cgroups._leave

    def leave(own_: Path, base: Path) -> bool:
        done = real_leave(own_, base)
        if done:
            moved.append(str(base))
        return done

    monkeypatch.setattr(cgroups, "_write_control", write)
    monkeypatch.setattr(cgroups, "_leave", leave)
    return moved


def test_v2_alone_in_its_cgroup_forkpoint_moves_into_a_leaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _v2_host(tmp_path)
    own = tmp_path / "system.slice/forkpoint.service"
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    moved = _busy_while_populated(monkeypatch, own)
    cgroup = host.create("s-1", LIMITS)
    assert cgroup.not_enforced == {}
    assert moved
    leaf = own / "forkpoint" / f"forkpoint-{os.getpid()}"
    assert (leaf / "cgroup.procs").read_text() == str(os.getpid())


def test_v2_sharing_its_cgroup_forkpoint_moves_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _v2_host(tmp_path)
    own = tmp_path / "system.slice/forkpoint.service"
    (own / "cgroup.procs").write_text(f"1\n{os.getpid()}\n")  # e.g. the user's shell
    _busy_while_populated(monkeypatch, own)
    cgroup = host.create("s-1", LIMITS)
    assert set(cgroup.not_enforced) == {"memory", "cpu", "pids", "io"}
    assert "other processes share forkpoint's cgroup" in cgroup.not_enforced["memory"]
    assert not (own / "forkpoint" / f"forkpoint-{os.getpid()}").exists()


def test_read_back_v1_and_v2(tmp_path: Path) -> None:
    host = _v1_host(tmp_path / "v1")
    host.create("s-1", LIMITS)
    lines = ["4:memory:/own/forkpoint/s-1", "1:cpu:/own/forkpoint/s-1",
             "8:pids:/own/forkpoint/s-1", "7:blkio:/forkpoint/s-1", "0::/"]  # fmt: skip
    found = limits_from(lines, host)
    assert found is not None
    assert (found.memory_bytes, found.cpus, found.pids_max, found.io_weight) == (
        700 << 20, 2.0, 256, 200,
    )  # fmt: skip
    assert found.not_enforced == ()

    v2 = _v2_host(tmp_path / "v2", available="memory cpu")
    v2.create("s-1", LIMITS)
    found = limits_from(["0::/system.slice/forkpoint.service/forkpoint/s-1"], v2)
    assert found is not None
    assert (found.memory_bytes, found.cpus) == (700 << 20, 2.0)
    assert found.not_enforced == ("pids", "io")

    # a process in no cgroup of ours has nothing to read back
    assert limits_from(["0::/system.slice/forkpoint.service"], v2) is None


def test_cgroups_cannot_be_made(tmp_path: Path) -> None:
    """A read-only cgroupfs (here: a file where a directory should be): every controller is
    reported, nothing raises, and attaching a process is a no-op."""
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    host = CgroupHost([Hierarchy(1, tmp_path, "/", blocked, frozenset({"memory", "cpu"}))])
    cgroup = host.create("s-1", LIMITS)
    assert set(cgroup.not_enforced) == {"memory", "cpu", "pids", "io"}
    assert "Not a directory" in cgroup.not_enforced["memory"]
    cgroup.attach(os.getpid())
    host.remove("s-1")
    assert host.sweep(set()) == []


def test_sweep_removes_only_old_empty_cgroups_of_gone_sessions(tmp_path: Path) -> None:
    host = _v1_host(tmp_path)
    base = tmp_path / "pids/own/forkpoint"
    for name in ("s-gone", "s-kept", "s-new"):
        (base / name).mkdir(parents=True)
    old = 1_000_000_000
    for name in ("s-gone", "s-kept"):
        os.utime(base / name, (old, old))
    assert host.sweep({"s-kept"}) == ["s-gone"]
    assert sorted(p.name for p in base.iterdir()) == ["s-kept", "s-new"]


# -- limits from the shape and the configuration -------------------------------------------


def _shape(accel: str) -> MachineShape:
    return MachineShape(memory_mib=512, cpus=2, accel=accel, qemu="test")  # type: ignore[arg-type]


def test_limits_follow_the_shape_and_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORKPOINT_PIDS_MAX", raising=False)
    monkeypatch.setenv("FORKPOINT_IO_WEIGHT", "50")
    tcg, kvm = limits_for(_shape("tcg")), limits_for(_shape("kvm"))
    assert tcg.memory_bytes == (512 + QEMU_OVERHEAD_MIB + TCG_TB_MIB) << 20
    assert kvm.memory_bytes == (512 + QEMU_OVERHEAD_MIB) << 20  # no translation cache
    assert (tcg.cpus, tcg.pids_max, tcg.io_weight) == (2, 256, 50)
    monkeypatch.setenv("FORKPOINT_PIDS_MAX", "lots")
    with pytest.raises(InvalidInput, match="FORKPOINT_PIDS_MAX must be an integer"):
        limits_for(_shape("tcg"))


def test_not_enforced_is_reported_once_per_home(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = Home(tmp_path)
    with caplog.at_level(logging.WARNING, logger="forkpoint.runtime.sessions.limits"):
        report_not_enforced(home, {"io": "no I/O scheduler with weights (blkio.weight)"})
        report_not_enforced(home, {"io": "no I/O scheduler with weights (blkio.weight)"})
        report_not_enforced(home, {"pids": "Permission denied (pids.max)"})
    assert caplog.messages == [
        "forkpoint: io limit not enforced: no I/O scheduler with weights (blkio.weight)",
        "forkpoint: pids limit not enforced: Permission denied (pids.max)",
    ]


# -- this host's real hierarchies ------------------------------------------------------


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_real_hierarchies(sleeper: subprocess.Popen[bytes]) -> None:
    """On this host (v1; on a v2 host the same): a process goes in, the limits read back."""
    host = CgroupHost.detect()
    if not any(h.controllers for h in host.hierarchies):
        pytest.skip("no cgroup controllers on this host")
    name = _name()
    cgroup = host.create(name, LIMITS)
    try:
        if "memory" in cgroup.not_enforced and "Permission" in cgroup.not_enforced["memory"]:
            pytest.skip("cgroups are not writable here")
        cgroup.attach(sleeper.pid)
        lines = Path(f"/proc/{sleeper.pid}/cgroup").read_text().splitlines()
        assert any(line.endswith(f"/forkpoint/{name}") for line in lines), lines
        found = limits_from(lines, host)
        assert found is not None
        enforced = {c for c in ("memory", "cpu", "pids", "io") if c not in cgroup.not_enforced}
        assert set(found.not_enforced) == {"memory", "cpu", "pids", "io"} - enforced
        if "memory" in enforced:
            assert found.memory_bytes == LIMITS.memory_bytes
        if "cpu" in enforced:
            assert found.cpus == 2.0
        if "pids" in enforced:
            assert found.pids_max == 256
    finally:
        sleeper.kill()
        sleeper.wait()
        host.remove(name)
    assert all(not (h.base / name).exists() for h in host.hierarchies)


def test_real_v2_mount(sleeper: subprocess.Popen[bytes]) -> None:
    """The cgroup2 mount of this host (no controllers: they are v1's here): a process is
    placed in ``<own>/forkpoint/<name>`` and found there; a controller it lacks is
    reported with the kernel's reason, not raised."""
    v2 = [h for h in CgroupHost.detect().hierarchies if h.version == 2]
    if not v2:
        pytest.skip("no cgroup2 mount")
    (hierarchy,) = v2
    name = _name()
    directory = hierarchy.base / name
    try:
        directory.mkdir(parents=True)
    except OSError as error:
        pytest.skip(f"cgroup2 not writable: {error}")
    try:
        (directory / "cgroup.procs").write_text(str(sleeper.pid))
        lines = Path(f"/proc/{sleeper.pid}/cgroup").read_text().splitlines()
        assert f"0::{'/' + str(directory.relative_to(hierarchy.mount))}" in lines
        if "pids" not in hierarchy.controllers:
            forced = CgroupHost([Hierarchy(2, hierarchy.mount, hierarchy.root, hierarchy.own,
                                           frozenset({"pids"}))])  # fmt: skip
            other = _name()
            cgroup = forced.create(other, LIMITS)
            assert "pids" in cgroup.not_enforced  # the kernel's reason, e.g. EINVAL
            forced.remove(other)
    finally:
        (hierarchy.own / "cgroup.procs").write_text(str(sleeper.pid))
        directory.rmdir()


def test_a_vm_outside_our_cgroups_shows_every_limit_not_enforced() -> None:
    from forkpoint.runtime.models import limits_of

    mine = limits_of(os.getpid())  # this process is in no VM cgroup
    assert mine is not None
    assert mine.not_enforced == ("memory", "cpu", "pids", "io")
    assert mine.memory_bytes is None
    assert limits_of(None) is None  # no VM: nothing to show
