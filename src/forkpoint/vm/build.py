"""Which QEMU this host runs: binary, version and a build fingerprint.

The fingerprint goes into every checkpoint manifest. QEMU itself does not check that a
state file was written by the same build, so forkpoint must.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from forkpoint.errors import QemuError

__all__ = ["QemuBuild", "qemu_build", "qemu_img"]


@dataclass(frozen=True)
class QemuBuild:
    """A QEMU binary identified by its version line and the sha256 of the binary."""

    binary: Path
    version: str  # e.g. "7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"
    digest: str  # first 16 hex digits of sha256(binary)

    @property
    def major_minor(self) -> tuple[int, int]:
        major, minor, *_ = self.version.split(" ", 1)[0].split(".")
        return int(major), int(minor)

    @property
    def fingerprint(self) -> str:
        return f"{self.version}#{self.digest}"


def _which(name: str, env_var: str) -> Path:
    found = os.environ.get(env_var) or shutil.which(name)
    if not found:
        raise QemuError(f"{name} not found: install Debian's qemu-system-x86 (make setup)")
    return Path(found).resolve()


@functools.cache
def qemu_build() -> QemuBuild:
    """Identify the QEMU in use (``$FORKPOINT_QEMU`` or ``qemu-system-x86_64`` on PATH)."""
    binary = _which("qemu-system-x86_64", "FORKPOINT_QEMU")
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=False
    ).stdout
    first = out.splitlines()[0] if out else ""
    version = first.removeprefix("QEMU emulator version ").strip()
    if not version:
        raise QemuError(f"cannot read the version of {binary}")
    sha = hashlib.sha256()
    with binary.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return QemuBuild(binary=binary, version=version, digest=sha.hexdigest()[:16])


@functools.cache
def qemu_img() -> Path:
    return _which("qemu-img", "FORKPOINT_QEMU_IMG")
