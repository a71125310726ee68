"""Facts about the host that the guest needs."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

__all__ = ["host_facts", "host_tsc_khz"]


@functools.cache
def host_tsc_khz() -> int | None:
    """The host TSC frequency in kHz (TCG guests run their TSC at this rate)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return int(float(line.split(":", 1)[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None


def host_facts(accel: str, tsc_khz: int | None) -> dict[str, object]:
    """What a checkpoint taken here needs of a host to restore, besides the QEMU build and
    machine shape: under TCG the TSC rate baked into the guest's command line at boot
    (``tsc_khz``, inherited down a lineage: restores do not re-read it); under KVM the
    host CPU (model and a hash of its flags, which the guest saw through CPUID) and kernel.
    """
    facts: dict[str, object] = {"accel": accel}
    if accel == "tcg":
        facts["tsc_khz"] = tsc_khz
    else:
        model, flags = _cpu_model_and_flags()
        facts["cpu_model"] = model
        facts["cpu_flags_sha256"] = hashlib.sha256(flags.encode()).hexdigest()[:16]
        facts["kernel"] = os.uname().release
    return facts


def _cpu_model_and_flags() -> tuple[str, str]:
    model = flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return model, flags
