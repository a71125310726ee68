"""Everything about QEMU: argv, processes, QMP, accel, RAM files, disk layers.

Knows nothing of sessions or the database; the runtime combines it with the rest.
"""

from forkpoint.vm.accel import Accel, detect_accel
from forkpoint.vm.argv import build_argv, guest_cmdline
from forkpoint.vm.build import QemuBuild, qemu_build
from forkpoint.vm.disk import create_overlay
from forkpoint.vm.files import VmFiles
from forkpoint.vm.host import host_tsc_khz
from forkpoint.vm.machine import CheckpointStats, Machine
from forkpoint.vm.ramfile import allocated_bytes, sparse_copy
from forkpoint.vm.runstate import RunState, StateError
from forkpoint.vm.shape import BootFiles, MachineShape, Network

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
