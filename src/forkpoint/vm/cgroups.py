"""Per-VM resource limits with cgroups, inside forkpoint's own subtree only.

Each VM's QEMU (and its passt) goes into ``<forkpoint's cgroup>/forkpoint/<name>`` of
every hierarchy that carries a controller we use, where ``<forkpoint's cgroup>`` is the
one this process runs in (``/proc/self/cgroup``): nothing outside it is ever touched.

- **cgroup v2** (one unified hierarchy, e.g. Debian 13): one directory; the controllers
  are enabled for our children through ``cgroup.subtree_control`` (ours, then
  ``forkpoint/``'s; alone in its cgroup, forkpoint first moves itself into a leaf, since
  v2 lets no cgroup with processes of its own enable controllers). Files:
  ``memory.max`` + ``memory.swap.max``, ``cpu.max``, ``pids.max``, ``io.weight``.
- **cgroup v1** (a hierarchy per controller, e.g. this host, where a v2 mount without
  controllers sits beside them): one directory per hierarchy. Files:
  ``memory.limit_in_bytes`` + ``memory.memsw.limit_in_bytes``, ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``, ``pids.max``, ``blkio.weight``.

A controller no hierarchy offers, or whose files we may not write, is *not enforced*:
:class:`SessionCgroup` says which and why, so the caller can report it; nothing here
raises for it. Limits shown to users are read back from the files the VM's process is
really in (:func:`limits_in_force`), not from what was asked.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "CONTROLLERS",
    "CgroupHost",
    "Hierarchy",
    "InForce",
    "ResourceLimits",
    "SessionCgroup",
    "join_cgroups_of",
    "limits_from",
    "limits_in_force",
    "parse_hierarchies",
]

# Named tuples and plain classes, not dataclasses: `forkpoint ls` reads limits back through
# this module, and each dataclass costs ≈ 1.8 ms to create (see "CLI start-up" in the docs).

CONTROLLERS = ("memory", "cpu", "pids", "io")
SUBTREE = "forkpoint"  # our directory under the cgroup forkpoint runs in
CPU_PERIOD_US = 100_000
_V1_NAMES = {"memory": "memory", "cpu": "cpu", "pids": "pids", "io": "blkio"}
_V1_UNLIMITED = 1 << 62  # memory.limit_in_bytes reads ≈ 2^63 (page-rounded) when unset
# io weight is given on v2's scale (1–10000, default 100); v1's blkio.weight is 10–1000
# (default 500): mapped as systemd maps IOWeight to BlockIOWeight.
_IO_V2_DEFAULT, _IO_V1_DEFAULT = 100, 500


class ResourceLimits(NamedTuple):
    """What a VM may use: bytes of memory (no swap), CPUs' worth of time, tasks (threads
    and processes), and an I/O weight on cgroup v2's scale (1–10000)."""

    memory_bytes: int
    cpus: int
    pids_max: int
    io_weight: int


class InForce(NamedTuple):
    """Limits read back from a process's cgroups; ``None``: not enforced."""

    memory_bytes: int | None
    cpus: float | None
    pids_max: int | None
    io_weight: int | None

    @property
    def not_enforced(self) -> tuple[str, ...]:
        values = (self.memory_bytes, self.cpus, self.pids_max, self.io_weight)
        return tuple(c for c, v in zip(CONTROLLERS, values, strict=True) if v is None)


class Hierarchy(NamedTuple):
    """One mounted cgroup hierarchy, seen from this process.

    ``own`` is the directory of the cgroup this process runs in; ``controllers`` are the
    ones of :data:`CONTROLLERS` it carries (v1: mounted with it; v2: available to us).
    """

    version: int
    mount: Path
    root: str  # the part of the tree the mount shows (mountinfo's root field)
    own: Path
    controllers: frozenset[str]

    def directory_of(self, path: str) -> Path | None:
        """Where cgroup ``path`` (as /proc/PID/cgroup names it) is under the mount."""
        return _inside(self.mount, self.root, path)

    @property
    def base(self) -> Path:
        return self.own / SUBTREE


def parse_hierarchies(mountinfo: str, proc_cgroup: str) -> list[Hierarchy]:
    """The hierarchies of ``/proc/self/mountinfo`` this process is in (``/proc/self/cgroup``).

    v2 controllers are not known from these texts: :meth:`CgroupHost.detect` reads them.
    """
    paths_v1: dict[frozenset[str], str] = {}
    path_v2: str | None = None
    for line in proc_cgroup.splitlines():
        number, names, path = line.split(":", 2)
        if number == "0" and not names:
            path_v2 = path
        else:
            paths_v1[frozenset(names.split(","))] = path
    found: list[Hierarchy] = []
    seen: set[object] = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        root, mount, fstype, options = fields[3], fields[4], fields[dash + 1], fields[dash + 3]
        if fstype == "cgroup2" and path_v2 is not None and "v2" not in seen:
            own = _inside(Path(mount), root, path_v2)
            if own is not None:
                seen.add("v2")
                found.append(Hierarchy(2, Path(mount), root, own, frozenset()))
        elif fstype == "cgroup":
            # Mount options name the hierarchy's controllers (among others, e.g. "rw").
            mounted = frozenset(options.split(","))
            hierarchy = next((k for k in paths_v1 if k <= mounted), None)
            ours = _controllers_of(options)
            if hierarchy is None or not ours or hierarchy in seen:
                continue
            own = _inside(Path(mount), root, paths_v1[hierarchy])
            if own is not None:
                seen.add(hierarchy)
                found.append(Hierarchy(1, Path(mount), root, own, ours))
    return found


def _inside(mount: Path, root: str, path: str) -> Path | None:
    """The directory of cgroup ``path`` under a mount of the hierarchy's ``root``; None if
    that mount does not show it (a mount of another part of the tree)."""
    if root == "/":
        return mount / path.lstrip("/")
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return mount / path[len(root) :].lstrip("/")
    return None


class SessionCgroup:
    """One VM's cgroup: its directory in each hierarchy used (with the controllers it
    enforces there), and the controllers that are not enforced, with the reason."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dirs: dict[Path, frozenset[str]] = {}
        self.not_enforced: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"SessionCgroup({self.name!r}, dirs={self.dirs}, not_enforced={self.not_enforced})"

    def attach(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into this cgroup. A hierarchy that
        refuses makes its controllers not enforced (recorded, never raised)."""
        for directory, controllers in self.dirs.items():
            try:
                (directory / "cgroup.procs").write_text(str(pid))
            except OSError as error:
                for controller in controllers:
                    self.not_enforced[controller] = f"cannot move a process in: {_why(error)}"


def join_cgroups_of(source_pid: int, pid: int, host: CgroupHost | None = None) -> None:
    """Move ``pid`` into the VM cgroups of ours that ``source_pid`` is in (passt restarted
    beside its QEMU). Best effort: the limits shown are read back from the files."""
    host = host or CgroupHost.detect()
    try:
        lines = Path(f"/proc/{source_pid}/cgroup").read_text().splitlines()
    except OSError:
        return
    for hierarchy in host.hierarchies:
        directory = _path_in(lines, hierarchy)
        if directory is not None and directory.parent.name == SUBTREE:
            with contextlib.suppress(OSError):
                (directory / "cgroup.procs").write_text(str(pid))


class CgroupHost:
    """forkpoint's part of this host's cgroup hierarchies: creates, removes and sweeps
    the VMs' cgroups."""

    def __init__(self, hierarchies: list[Hierarchy]) -> None:
        self.hierarchies = hierarchies

    @classmethod
    @functools.cache
    def detect(cls) -> CgroupHost:
        """This process's hierarchies (cached: they do not change while it runs)."""
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
            own = Path("/proc/self/cgroup").read_text()
        except OSError:
            return cls([])
        return cls([_with_v2_controllers(h) for h in parse_hierarchies(mountinfo, own)])

    def provider(self, controller: str) -> Hierarchy | None:
        """The hierarchy that enforces ``controller``: v1's own one, else v2's."""
        candidates = [h for h in self.hierarchies if controller in h.controllers]
        return min(candidates, key=lambda h: h.version, default=None)

    def create(self, name: str, limits: ResourceLimits) -> SessionCgroup:
        """Make (or reuse) the cgroup ``name`` and write ``limits`` into it."""
        cgroup = SessionCgroup(name)
        for controller in CONTROLLERS:
            hierarchy = self.provider(controller)
            if hierarchy is None:
                cgroup.not_enforced[controller] = f"no cgroup hierarchy offers {controller}"
                continue
            directory = hierarchy.base / name
            try:
                _make(hierarchy, directory, controller)
                _WRITERS[hierarchy.version][controller](directory, limits)
            except OSError as error:
                cgroup.not_enforced[controller] = _why(error)
                if directory not in cgroup.dirs:
                    with contextlib.suppress(OSError):
                        directory.rmdir()  # nothing of ours is enforced there
                continue
            cgroup.dirs[directory] = cgroup.dirs.get(directory, frozenset()) | {controller}
        return cgroup

    def remove(self, name: str) -> None:
        """Remove the cgroup ``name`` (its processes must be gone); absent is fine."""
        for hierarchy in self.hierarchies:
            with contextlib.suppress(OSError):
                (hierarchy.base / name).rmdir()

    def sweep(self, keep: Collection[str], min_age_s: float = 60.0) -> list[str]:
        """Remove the empty cgroups not named in ``keep`` and older than ``min_age_s`` (a
        younger one may belong to a VM starting in another process); returns their names."""
        removed: list[str] = []
        now = time.time()
        for hierarchy in self.hierarchies:
            try:
                entries = [e for e in hierarchy.base.iterdir() if e.is_dir()]
            except OSError:
                continue
            for entry in entries:
                if entry.name in keep:
                    continue
                try:
                    if now - entry.stat().st_mtime < min_age_s:
                        continue
                    entry.rmdir()  # EBUSY while a process is in it
                except OSError:
                    continue
                removed.append(entry.name)
        return sorted(set(removed))


def _with_v2_controllers(hierarchy: Hierarchy) -> Hierarchy:
    if hierarchy.version != 2:
        return hierarchy
    try:
        available = (hierarchy.own / "cgroup.controllers").read_text().split()
    except OSError:
        return hierarchy
    return hierarchy._replace(controllers=frozenset(CONTROLLERS) & set(available))


def _make(hierarchy: Hierarchy, directory: Path, controller: str) -> None:
    if hierarchy.version == 2:
        # Children get a controller only if every parent up to ours enabled it.
        for parent in (hierarchy.own, hierarchy.base):
            parent.mkdir(exist_ok=True)
            _enable(parent, controller, hierarchy.base)
    directory.mkdir(parents=True, exist_ok=True)


def _enable(parent: Path, controller: str, base: Path) -> None:
    control = parent / "cgroup.subtree_control"
    if controller in control.read_text().split():
        return
    try:
        _write_control(control, f"+{controller}")
    except OSError as error:
        # cgroup v2's "no internal processes" rule: a cgroup with processes of its own
        # cannot enable controllers for children. If the only one is this process (a
        # service with its own delegated cgroup), it moves into a leaf of our subtree,
        # as systemd's delegation guide prescribes; it never moves anyone else.
        if error.errno == errno.EBUSY and parent != base and _leave(parent, base):
            _write_control(control, f"+{controller}")
            return
        hint = ""
        if error.errno == errno.EBUSY:
            hint = ": other processes share forkpoint's cgroup; run it in one of its own"
        raise OSError(
            error.errno, f"cannot enable it for {parent}'s children ({error.strerror}){hint}"
        ) from None


def _write_control(control: Path, text: str) -> None:
    control.write_text(text)


def _leave(own: Path, base: Path) -> bool:
    """Move this process from ``own`` (if it is alone there) into ``base/forkpoint-PID``."""
    pid = os.getpid()
    try:
        if (own / "cgroup.procs").read_text().split() != [str(pid)]:
            return False
        leaf = base / f"{SUBTREE}-{pid}"
        leaf.mkdir(parents=True, exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(pid))
    except OSError:
        return False
    return True


def _why(error: OSError) -> str:
    """The reason, the same for every VM (it is reported once): names a control file, or
    the directory a VM's cgroup could not be made in."""
    where = ""
    if error.filename:
        path = Path(error.filename)
        where = f" ({path.name})" if "." in path.name else f" (making cgroups in {path.parent})"
    return f"{error.strerror or error}{where}"


# -- the files, per version ------------------------------------------------------------


def _write(path: Path, value: object) -> None:
    try:
        path.write_text(str(value))
    except OSError as error:  # a failed write() names no file: say which
        raise OSError(error.errno, error.strerror, str(path)) from None


def _memory_v1(directory: Path, limits: ResourceLimits) -> None:
    limit = directory / "memory.limit_in_bytes"
    swap = directory / "memory.memsw.limit_in_bytes"  # memory + swap: equal means no swap
    try:
        _write(limit, limits.memory_bytes)
    except OSError:
        # memsw must stay ≥ the memory limit: raising an existing limit goes memsw first.
        if not swap.exists():
            raise
        _write(swap, limits.memory_bytes)
        _write(limit, limits.memory_bytes)
    if swap.exists():
        _write(swap, limits.memory_bytes)


def _memory_v2(directory: Path, limits: ResourceLimits) -> None:
    _write(directory / "memory.max", limits.memory_bytes)
    if (directory / "memory.swap.max").exists():
        _write(directory / "memory.swap.max", 0)


def _cpu_v1(directory: Path, limits: ResourceLimits) -> None:
    _write(directory / "cpu.cfs_period_us", CPU_PERIOD_US)
    _write(directory / "cpu.cfs_quota_us", limits.cpus * CPU_PERIOD_US)


def _cpu_v2(directory: Path, limits: ResourceLimits) -> None:
    _write(directory / "cpu.max", f"{limits.cpus * CPU_PERIOD_US} {CPU_PERIOD_US}")


def _pids(directory: Path, limits: ResourceLimits) -> None:
    _write(directory / "pids.max", limits.pids_max)


def _io_v1(directory: Path, limits: ResourceLimits) -> None:
    weight = directory / "blkio.weight"
    if not weight.exists():
        raise FileNotFoundError(0, "no I/O scheduler with weights on this host", str(weight))
    _write(weight, _io_to_v1(limits.io_weight))


def _io_v2(directory: Path, limits: ResourceLimits) -> None:
    weight = directory / "io.weight"
    if not weight.exists():
        raise FileNotFoundError(0, "no I/O scheduler with weights on this host", str(weight))
    _write(weight, f"default {limits.io_weight}")


def _io_to_v1(weight: int) -> int:
    return max(10, min(1000, weight * _IO_V1_DEFAULT // _IO_V2_DEFAULT))


def _io_from_v1(weight: int) -> int:
    return weight * _IO_V2_DEFAULT // _IO_V1_DEFAULT


_WRITERS = {
    1: {"memory": _memory_v1, "cpu": _cpu_v1, "pids": _pids, "io": _io_v1},
    2: {"memory": _memory_v2, "cpu": _cpu_v2, "pids": _pids, "io": _io_v2},
}


# -- reading back ----------------------------------------------------------------------


def limits_in_force(pid: int, host: CgroupHost | None = None) -> InForce | None:
    """The limits on process ``pid`` as its cgroup files say; None if it is in no VM
    cgroup of ours (gone, or started where no cgroup could be made)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    return limits_from(lines, host or CgroupHost.detect())


def limits_from(proc_cgroup: list[str], host: CgroupHost) -> InForce | None:
    """:func:`limits_in_force` of the process whose ``/proc/PID/cgroup`` has these lines."""
    where: dict[Hierarchy, Path] = {}
    for hierarchy in host.hierarchies:
        path = _path_in(proc_cgroup, hierarchy)
        if path is not None and path.parent.name == SUBTREE:
            where[hierarchy] = path
    if not where:
        return None

    def read(controller: str, v1: str, v2: str) -> str | None:
        hierarchy = host.provider(controller)
        if hierarchy is None or hierarchy not in where:
            return None
        try:
            return (where[hierarchy] / (v1 if hierarchy.version == 1 else v2)).read_text()
        except OSError:
            return None

    return InForce(
        memory_bytes=_memory_of(read("memory", "memory.limit_in_bytes", "memory.max")),
        cpus=_cpus_of(read("cpu", "cpu.cfs_quota_us", "cpu.max"), where, host),
        pids_max=_int_or_none(read("pids", "pids.max", "pids.max")),
        io_weight=_io_of(read("io", "blkio.weight", "io.weight")),
    )


def _path_in(lines: list[str], hierarchy: Hierarchy) -> Path | None:
    """The directory of the process's cgroup in ``hierarchy`` (from ``/proc/PID/cgroup``)."""
    for line in lines:
        number, names, path = line.split(":", 2)
        if hierarchy.version == 2 and (number, names) == ("0", ""):
            return hierarchy.directory_of(path)
        if hierarchy.version == 1 and hierarchy.controllers <= _controllers_of(names):
            return hierarchy.directory_of(path)
    return None


def _controllers_of(names: str) -> frozenset[str]:
    split = set(names.split(","))
    return frozenset(c for c in CONTROLLERS if _V1_NAMES[c] in split)


def _int_or_none(text: str | None) -> int | None:
    if text is None or text.strip() == "max":
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _memory_of(text: str | None) -> int | None:
    value = _int_or_none(text)
    return None if value is None or value >= _V1_UNLIMITED else value


def _cpus_of(text: str | None, where: dict[Hierarchy, Path], host: CgroupHost) -> float | None:
    if text is None:
        return None
    parts = text.split()
    if len(parts) == 2:  # v2: "QUOTA PERIOD"
        quota, period = _int_or_none(parts[0]), _int_or_none(parts[1])
    else:  # v1: the period is a file of its own
        hierarchy = host.provider("cpu")
        assert hierarchy is not None
        try:
            period = int((where[hierarchy] / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            return None
        quota = _int_or_none(text)
    if quota is None or period is None or quota < 0 or period <= 0:
        return None
    return round(quota / period, 2)


def _io_of(text: str | None) -> int | None:
    if text is None:
        return None
    if text.startswith("default"):  # v2: "default N\n" plus per-device lines
        return _int_or_none(text.split()[1])
    value = _int_or_none(text)
    return None if value is None else _io_from_v1(value)
