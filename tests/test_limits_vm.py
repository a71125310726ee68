"""Per-session resource limits on real VMs: QEMU and passt sit in the session's cgroup with
the session's limits from create through rollback to removal, ``show`` reports them, and
a guest using all its memory keeps QEMU within the memory limit."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkpoint.config import home
from forkpoint.images import get_image
from forkpoint.models import Session
from forkpoint.runtime import Runtime
from forkpoint.runtime.sessions.limits import limits_for
from forkpoint.vm import MachineShape, detect_accel, qemu_build
from forkpoint.vm.cgroups import CgroupHost, Hierarchy

pytestmark = pytest.mark.vm

MEMORY_MIB, CPUS = 512, 1
HOG = "b = []\ntry:\n    while True: b.append(b'x' * (1 << 20))\nexcept MemoryError: pass\n"


@pytest.fixture(scope="module")
def rt() -> Iterator[Runtime]:
    runtime = Runtime.open()
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def session(rt: Runtime) -> Iterator[Session]:
    created = asyncio.run(rt.create(memory_mib=MEMORY_MIB, cpus=CPUS))
    yield created
    leftovers = [c.id for c in rt.list_checkpoints(created.id)]
    asyncio.run(rt.remove(created.id))
    for checkpoint_id in leftovers:
        asyncio.run(rt.remove_checkpoint(checkpoint_id))


def _enforcing(host: CgroupHost) -> dict[str, Hierarchy]:
    found = {c: host.provider(c) for c in ("memory", "cpu", "pids")}
    usable = {c: h for c, h in found.items() if h is not None}
    if not usable:
        pytest.skip("no memory, cpu or pids controller on this host")
    return usable


def _read(path: Path) -> str:
    return path.read_text().strip()


def _pids(rt: Runtime, session_id: str) -> list[int]:
    record = rt.store.get_session(session_id)
    assert record.qemu_pid
    return [record.qemu_pid, *record.aux_pids]


def test_qemu_and_passt_are_in_the_session_cgroup_with_its_limits(
    rt: Runtime, session: Session
) -> None:
    host = CgroupHost.detect()
    build = qemu_build()
    accel = detect_accel(build, home().cache, get_image().kernel)
    expected = limits_for(MachineShape.for_build(build, accel, MEMORY_MIB, CPUS))
    pids = _pids(rt, session.id)
    assert len(pids) == 2  # QEMU and passt
    for controller, hierarchy in _enforcing(host).items():
        directory = hierarchy.base / session.id
        members = {int(p) for p in _read(directory / "cgroup.procs").split()}
        assert set(pids) <= members, (controller, directory)
        v1 = hierarchy.version == 1
        if controller == "memory":
            memory = _read(directory / ("memory.limit_in_bytes" if v1 else "memory.max"))
            assert int(memory) == expected.memory_bytes == (MEMORY_MIB + 224) << 20
        elif controller == "cpu":
            if v1:
                quota = (
                    _read(directory / "cpu.cfs_quota_us"),
                    _read(directory / "cpu.cfs_period_us"),
                )
                assert quota == (str(CPUS * 100000), "100000")
            else:
                assert _read(directory / "cpu.max") == f"{CPUS * 100000} 100000"
        else:
            assert _read(directory / "pids.max") == str(expected.pids_max)

    shown = rt.get(session.id).limits
    assert shown is not None
    assert (shown.memory_bytes, shown.cpus, shown.pids_max) == (
        expected.memory_bytes, float(CPUS), expected.pids_max,
    )  # fmt: skip
    io_hierarchy = host.provider("io")
    io_enforced = io_hierarchy is not None and any(
        (io_hierarchy.base / session.id / f).exists() for f in ("blkio.weight", "io.weight")
    )
    assert ("io" in shown.not_enforced) == (not io_enforced)
    assert (shown.io_weight is None) == (not io_enforced)

    # `forkpoint show` (its JSON and its table) reports the same
    env = {**os.environ, "NO_COLOR": "1"}
    cli = [sys.executable, "-m", "forkpoint.cli.app", "show", session.id]
    as_json = subprocess.run([*cli, "--json"], capture_output=True, text=True, env=env)
    assert json.loads(as_json.stdout)["limits"]["memory_bytes"] == expected.memory_bytes
    table = subprocess.run(cli, capture_output=True, text=True, env=env).stdout
    assert f"memory {expected.memory_bytes >> 20} MiB, cpu {CPUS}" in table
    if not io_enforced:
        assert "not enforced: io" in table


def test_a_guest_using_all_its_memory_keeps_qemu_under_the_limit(
    rt: Runtime, session: Session
) -> None:
    """A guest that fills its RAM keeps its QEMU under the cgroup's limit, and the VM
    survives its guest's out-of-memory. (Whether usage reaches the limit depends on who
    the RAM file's page cache is charged to — the first cgroup that touched it, e.g. an
    earlier session's — so only the bound is asserted.)"""
    memory = _enforcing(CgroupHost.detect()).get("memory")
    if memory is None:
        pytest.skip("no memory controller")
    directory = memory.base / session.id
    v1 = memory.version == 1
    limit = int(_read(directory / ("memory.limit_in_bytes" if v1 else "memory.max")))
    peak_file = directory / ("memory.max_usage_in_bytes" if v1 else "memory.peak")
    if not peak_file.exists():
        pytest.skip("this kernel does not record the cgroup's peak usage")
    qemu = _pids(rt, session.id)[0]

    hog = asyncio.run(rt.exec(session.id, ["python3", "-c", HOG], timeout=300))
    assert hog.exit_code in (0, 137)  # done, or killed by the guest's OOM killer

    peak = int(_read(peak_file))
    anon = _anonymous_bytes(qemu)
    assert peak <= limit
    assert anon >= 0.6 * (MEMORY_MIB << 20), anon  # the guest really filled its RAM
    assert asyncio.run(rt.exec(session.id, "echo alive")).stdout == "alive\n"
    assert _pids(rt, session.id)[0] == qemu


def _anonymous_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no Anonymous line")


def test_rollback_puts_the_new_qemu_in_the_same_cgroup_and_rm_removes_it(
    rt: Runtime, session: Session
) -> None:
    enforcing = _enforcing(CgroupHost.detect())
    checkpoint = asyncio.run(rt.checkpoint(session.id))
    old = _pids(rt, session.id)
    asyncio.run(rt.rollback(session.id, checkpoint.id))
    new = _pids(rt, session.id)
    assert not set(old) & set(new)
    for hierarchy in enforcing.values():
        members = {int(p) for p in _read(hierarchy.base / session.id / "cgroup.procs").split()}
        assert members == set(new)

    other = asyncio.run(rt.fork(checkpoint.id))[0]
    assert isinstance(other, Session)
    for hierarchy in enforcing.values():
        assert (hierarchy.base / other.id).is_dir()
    asyncio.run(rt.remove(other.id))
    for hierarchy in enforcing.values():
        assert not (hierarchy.base / other.id).exists()


def test_without_writable_cgroups_sessions_still_run_and_say_so(rt: Runtime) -> None:
    """A read-only cgroupfs (remounted so in a mount namespace of the CLI's own): create
    works, each limit is reported once on stderr, and shown as not enforced."""
    mounts = [str(h.mount) for h in CgroupHost.detect().hierarchies]
    if os.geteuid() != 0 or not mounts:
        pytest.skip("needs root (a mount namespace) and cgroup mounts")
    (home().root / "limits-reported").unlink(missing_ok=True)
    remount = "; ".join(f"mount -o remount,bind,ro {m}" for m in mounts)
    script = f"{remount} && exec {sys.executable} -m forkpoint.cli.app create --json"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    created = json.loads(done.stdout)
    try:
        assert created["limits"]["not_enforced"] == ["memory", "cpu", "pids", "io"]
        assert created["limits"]["memory_bytes"] is None
        warned = [line for line in done.stderr.splitlines() if "limit not enforced" in line]
        assert len(warned) == 4 and all("Read-only file system" in w for w in warned), warned
        shown = rt.get(created["id"]).limits
        assert shown is not None and shown.not_enforced == ("memory", "cpu", "pids", "io")
        assert asyncio.run(rt.exec(created["id"], "echo ok")).stdout == "ok\n"
    finally:
        asyncio.run(rt.remove(created["id"]))
