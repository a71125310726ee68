"""Each session's resource limits: chosen from its shape and the configuration, put on its
VM through cgroups (:mod:`forkpoint.vm.cgroups`), reported when not enforced, and read
back for ``show`` (:func:`~forkpoint.runtime.models.limits_of`: queries must not load
``logging``).

The memory limit is the guest's RAM plus QEMU's own overhead, bounded and measured (see
"Resource limits" in ``docs/architecture.md``); CPU is the vCPU count as a quota.
"""

from __future__ import annotations

import logging
import threading

from forkpoint.config import Home, LimitDefaults
from forkpoint.errors import InvalidInput
from forkpoint.vm.argv import TCG_TB_MIB  # TCG's translation cache, capped in the argv
from forkpoint.vm.cgroups import CgroupHost, ResourceLimits, SessionCgroup
from forkpoint.vm.shape import MachineShape

__all__ = [
    "QEMU_OVERHEAD_MIB",
    "limits_for",
    "prepare_cgroup",
    "remove_cgroup",
    "sweep_cgroups",
]

# QEMU's memory besides guest RAM and TCG's translation cache (heap, thread stacks, page
# tables, device buffers) plus passt's: measured ≈ 33 + 20 MiB with the guest's RAM all in
# use (see "Resource limits" in the docs).
QEMU_OVERHEAD_MIB = 96

_log = logging.getLogger(__name__)
_reported_lock = threading.Lock()


def limits_for(shape: MachineShape) -> ResourceLimits:
    """The limits of a VM of ``shape``. :raises InvalidInput: a bad FORKPOINT_* setting."""
    try:
        defaults = LimitDefaults.from_env()
    except ValueError as error:
        raise InvalidInput(str(error)) from None
    overhead = QEMU_OVERHEAD_MIB + (TCG_TB_MIB if shape.accel == "tcg" else 0)
    return ResourceLimits(
        memory_bytes=(shape.memory_mib + overhead) << 20,
        cpus=shape.cpus,
        pids_max=defaults.pids_max,
        io_weight=defaults.io_weight,
    )


def prepare_cgroup(home: Home, name: str, shape: MachineShape) -> SessionCgroup:
    """The cgroup ``name`` with ``shape``'s limits written, ready for the VM's processes
    (blocking). What cannot be enforced is reported once (per home), never raised."""
    cgroup = CgroupHost.detect().create(name, limits_for(shape))
    report_not_enforced(home, cgroup.not_enforced)
    return cgroup


def report_not_enforced(home: Home, not_enforced: dict[str, str]) -> None:
    """Warn (one line per controller, on stderr or the server's log) about controllers
    that are not enforced, the first time this home sees each reason."""
    if not not_enforced:
        return
    lines = [
        f"forkpoint: {controller} limit not enforced: {why}"
        for controller, why in sorted(not_enforced.items())
    ]
    marker = home.root / "limits-reported"
    with _reported_lock:
        try:
            known = set(marker.read_text().splitlines())
        except OSError:
            known = set()
        new = [line for line in lines if line not in known]
        if not new:
            return
        for line in new:
            _log.warning("%s", line)
        try:
            marker.write_text("".join(f"{line}\n" for line in sorted(known | set(new))))
        except OSError:
            pass  # a read-only home: reported again next time, which is fine


def remove_cgroup(name: str) -> None:
    """Remove the VM cgroup ``name`` (after its processes are gone; blocking)."""
    CgroupHost.detect().remove(name)


def sweep_cgroups(keep: set[str]) -> list[str]:
    """Remove empty VM cgroups of sessions that no longer exist (blocking)."""
    return CgroupHost.detect().sweep(keep)
