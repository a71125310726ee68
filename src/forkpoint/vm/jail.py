"""Who a VM's processes run as, and what they can see of the host.

QEMU starts as root only to open what forkpoint prepared for it (RAM file, disk chain,
sockets, logs), then — before the guest runs a single instruction — chroots into an empty
directory and switches to the session's own uid and gid (``-runas``/``-chroot``, from
QEMU 9.1 ``-run-with``). From then on it has no capabilities (``CapEff`` 0), cannot gain
any (``NoNewPrivs`` 1, set by its seccomp filter), sees no file but the descriptors it
holds, and cannot signal another session's processes (a different uid each). Restores and
saves pass their state file as a descriptor (:mod:`.migration`), so nothing is opened by
path later. passt gets the same uid (``--runas``), which is also what the egress policy
matches the guest's connections by.

forkpoint itself keeps root: it reads a running VM's written pages through
``/proc/PID/pagemap`` and ``/proc/PID/mem`` (:mod:`.written`), which needs
``CAP_SYS_PTRACE`` over a process of another uid.

Without root (a developer running forkpoint as themselves) nothing can switch uid: VMs
then run as that user, as before.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from forkpoint.vm.build import QemuBuild
from forkpoint.vm.files import VmFiles

__all__ = ["Jail", "jails_processes"]


@functools.cache
def jails_processes() -> bool:
    """Whether VMs are jailed: only root can start a process as another uid."""
    return os.geteuid() == 0


@dataclass(frozen=True)
class Jail:
    """The uid (and equal gid) one VM's QEMU and passt run as."""

    uid: int

    def qemu_args(self, build: QemuBuild, files: VmFiles) -> list[str]:
        """QEMU options that drop to ``uid`` in an empty chroot once set up."""
        if not jails_processes():
            return []
        user, root = f"{self.uid}:{self.uid}", files.empty_root
        if build.major_minor >= (9, 1):  # -runas and -chroot are gone from QEMU 10
            return ["-run-with", f"chroot={root},user={user}"]
        return ["-runas", user, "-chroot", str(root)]

    def sandbox_elevation(self) -> str:
        """QEMU's seccomp setting for set*uid: the switch to ``uid`` happens after the
        filter is in place, so it must allow those calls; they cannot gain anything from
        then on (no capabilities, no new privileges, no exec)."""
        return "allow" if jails_processes() else "deny"

    def passt_args(self) -> list[str]:
        return ["--runas", f"{self.uid}:{self.uid}"] if jails_processes() else []
