"""What a VM is: the machine shape (must match for a restore) and its boot files."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from forkpoint.vm.accel import Accel
from forkpoint.vm.build import QemuBuild

__all__ = ["BootFiles", "MachineShape", "Network"]

Network = Literal["user", "none"]

# Bumped whenever the argv's device layout changes: old checkpoints then refuse to load.
ARGV_LAYOUT_VERSION = 9


@dataclass(frozen=True)
class MachineShape:
    """Everything a saved device state depends on besides the files themselves."""

    memory_mib: int
    cpus: int
    accel: Accel
    qemu: str  # QemuBuild.fingerprint

    @classmethod
    def for_build(cls, build: QemuBuild, accel: Accel, memory_mib: int, cpus: int) -> MachineShape:
        return cls(memory_mib=memory_mib, cpus=cpus, accel=accel, qemu=build.fingerprint)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "argv_layout": ARGV_LAYOUT_VERSION}

    @property
    def key(self) -> str:
        """A short stable id of this shape (templates are cached per key)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class BootFiles:
    """Guest kernel, initramfs and the kernel command line."""

    kernel: Path
    initrd: Path
    cmdline: str
