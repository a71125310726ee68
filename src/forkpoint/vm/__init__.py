"""Everything about QEMU: argv, processes, QMP, accel, RAM files, disk layers.

Knows nothing of sessions or the database; the runtime combines it with the rest.

Names load on first use (PEP 562): a CLI query that only checks whether a QEMU process
is alive must not pay for QMP and asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forkpoint.vm.accel import Accel, detect_accel
    from forkpoint.vm.argv import build_argv, guest_cmdline
    from forkpoint.vm.build import QemuBuild, qemu_build
    from forkpoint.vm.disk import create_overlay
    from forkpoint.vm.files import VmFiles
    from forkpoint.vm.host import host_tsc_khz
    from forkpoint.vm.machine import Machine
    from forkpoint.vm.ramfile import allocated_bytes, sparse_copy
    from forkpoint.vm.runstate import RunState, StateError
    from forkpoint.vm.shape import BootFiles, MachineShape, Network
    from forkpoint.vm.stats import CheckpointStats

_WHERE = {
    "Accel": "accel",
    "detect_accel": "accel",
    "build_argv": "argv",
    "guest_cmdline": "argv",
    "QemuBuild": "build",
    "qemu_build": "build",
    "create_overlay": "disk",
    "VmFiles": "files",
    "host_tsc_khz": "host",
    "Machine": "machine",
    "allocated_bytes": "ramfile",
    "sparse_copy": "ramfile",
    "RunState": "runstate",
    "StateError": "runstate",
    "BootFiles": "shape",
    "MachineShape": "shape",
    "Network": "shape",
    "CheckpointStats": "stats",
}

__all__ = [
    "Accel",
    "BootFiles",
    "CheckpointStats",
    "Machine",
    "MachineShape",
    "Network",
    "QemuBuild",
    "RunState",
    "StateError",
    "VmFiles",
    "allocated_bytes",
    "build_argv",
    "create_overlay",
    "detect_accel",
    "guest_cmdline",
    "host_tsc_khz",
    "qemu_build",
    "sparse_copy",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
