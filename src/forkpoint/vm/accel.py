"""Pick the accelerator: KVM where it really runs a guest, else TCG.

``/dev/kvm`` can exist and still be unable to run a stock kernel (a PVM-backed host,
``/sys/module/kvm_pvm``): QEMU starts, then aborts ("failed to set MSR") once the guest
kernel touches its MSRs. So a PVM host means TCG, and elsewhere the probe boots the guest
kernel for a moment (``-no-reboot``: a panic for want of a root fs exits cleanly, an
abort does not) instead of trusting the device node.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Literal

from forkpoint.vm.build import QemuBuild

__all__ = ["Accel", "detect_accel"]

Accel = Literal["kvm", "tcg"]

_PROBE_SECONDS = 1.5


def _kvm_runs_a_guest(build: QemuBuild, kernel: Path) -> bool:
    if not os.access("/dev/kvm", os.R_OK | os.W_OK) or Path("/sys/module/kvm_pvm").exists():
        return False
    argv = [
        str(build.binary),
        "-M", "microvm,accel=kvm",
        "-nodefaults", "-no-user-config", "-display", "none", "-m", "128", "-no-reboot",
        "-kernel", str(kernel), "-append", "panic=-1",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        return proc.wait(timeout=_PROBE_SECONDS) == 0  # 0: the kernel ran and panicked
    except subprocess.TimeoutExpired:  # still running a guest: KVM works
        proc.kill()
        proc.wait()
        return True


def detect_accel(build: QemuBuild, cache_dir: Path, kernel: Path) -> Accel:
    """KVM or TCG for this host, cached per QEMU build; ``$FORKPOINT_ACCEL`` overrides.

    ``kernel`` is a guest kernel to probe KVM with (only booted when KVM looks usable).
    """
    forced = os.environ.get("FORKPOINT_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced  # type: ignore[return-value]
    cache = cache_dir / f"accel-{build.digest}.json"
    try:
        cached = json.loads(cache.read_text())["accel"]
        if cached in ("kvm", "tcg"):
            return cached  # type: ignore[no-any-return]
    except (OSError, ValueError, KeyError):
        pass
    accel: Accel = "kvm" if _kvm_runs_a_guest(build, kernel) else "tcg"
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"accel": accel}))
    tmp.replace(cache)
    return accel
