"""QEMU's command line for a forkpoint microVM.

Device order is part of the saved state: a restore must use the exact same layout, so
every VM — booted or restored — gets its argv from this one function.
"""

from __future__ import annotations

from pathlib import Path

from forkpoint.vm.build import QemuBuild
from forkpoint.vm.console import chardev
from forkpoint.vm.fdsets import FDSET_PREFIX
from forkpoint.vm.files import VmFiles
from forkpoint.vm.jail import Jail
from forkpoint.vm.shape import BootFiles, MachineShape

__all__ = ["RESTORE_LISTENERS_CHARDEV", "TCG_TB_MIB", "build_argv", "guest_cmdline"]

RESTORE_LISTENERS_CHARDEV = "rl"
# The guest knows it as protocol.RESTORE_LISTENERS_PORT (vm does not import the protocol).
RESTORE_LISTENERS_PORT = "restore-listeners"
VOLUMES_PORT = "volumes"  # protocol.VOLUMES_PORT

TCG_TB_MIB = 128  # measured: ≈ 70 MiB after booting and a broad workload (docs)
# QEMU's default CPU model (qemu64) lacks ARAT, so the guest kernel assumes its local APIC
# timer stops in deep idle and, with no broadcast timer on microvm, never leaves the
# periodic 250 Hz tick: an idle guest would keep its QEMU busy (docs: "The VM").
_CPU = "qemu64,+arat"


def guest_cmdline(accel: str, tsc_khz: int | None) -> str:
    """Kernel command line. Under TCG the TSC must be given, or calibration can hang."""
    # reboot=t: microvm has no reset hardware the kernel knows; a triple fault reaches
    # QEMU, which then exits (-no-reboot) instead of the guest spinning forever.
    parts = ["console=ttyS0", "panic=-1", "reboot=t", "quiet", "loglevel=4"]
    if accel == "tcg" and tsc_khz:
        parts += [f"tsc_early_khz={tsc_khz}", "tsc=reliable"]
    return " ".join(parts)


def build_argv(
    build: QemuBuild,
    shape: MachineShape,
    boot: BootFiles,
    files: VmFiles,
    disk: tuple[Path, tuple[int, int]],
    ram: Path,
    jail: Jail,
    *,
    net_fd: int | None,
    incoming: bool = False,
    console_file: bool = False,
) -> list[str]:
    """The full argv. ``incoming``: wait for a device state to restore (``-incoming defer``).

    ``net_fd``: a listening unix socket, inherited, the NIC's backend for passt (see
    :mod:`.net`; None: no network), which
    must be connected before the VM runs: QEMU 7.2 crashes sending to an unconnected
    stream netdev (e.g. the announcement after a restore). Without, it sits alone on a
    hub. The backend is not part of the saved state; the NIC is.

    Guest RAM maps the file ``ram`` privately (copy-on-write): the VM reads it, never
    writes it (see :mod:`forkpoint.vm.written`). ``disk``: the top layer's path and its
    read-write and read-only descriptors, inherited under those numbers (QEMU opens the
    layer through them, see :mod:`.fdsets`). ``jail``: who QEMU becomes once set up.
    ``console_file``: the serial console goes to ``serial.log`` uncapped, not to a capped
    ring (only for a boot of a trusted image that a timeout bounds; see :mod:`.console`).
    """
    mem = f"{shape.memory_mib}M"
    disk_path, disk_fds = disk
    argv = [
        str(build.binary),
        "-name", files.name,
        # suppress-vmdesc: device-only saves have no VM description section; without
        # this every load looks for one and logs a warning. pit=off: the guest kernel
        # (TSC clocksource, local-APIC timer with ARAT) never uses the PIT, but the
        # firmware leaves it running and QEMU then woke 36 times a second to emulate it.
        "-M", "microvm,memory-backend=mem,pit=off,pic=on,rtc=on,suppress-vmdesc=on",
        "-accel", _accel(shape),
        "-cpu", _CPU,
        "-m", mem,
        "-smp", str(shape.cpus),
        "-nodefaults", "-no-user-config", "-display", "none",
        "-object",
        f"memory-backend-file,id=mem,size={mem},mem-path={ram},share=off",
        *(arg for fd in disk_fds for arg in ("-add-fd", f"fd={fd},set=1,opaque={disk_path}")),
        "-drive", f"id=d0,file={FDSET_PREFIX}1,format=qcow2,if=none",
        "-device", "virtio-blk-device,drive=d0",
        "-netdev", _netdev(net_fd),
        "-device", "virtio-net-device,netdev=n0",
        "-device", "virtio-serial-device",
        "-chardev", f"socket,id=ag,path={files.agent_socket},server=on,wait=off",
        "-device", "virtserialport,chardev=ag,name=agent",
        # Held open by the guest while it has processes or hooks to tell of a restore
        # (guest/restore.py): QEMU's frontend-open of this port, read at each checkpoint,
        # says whether a restore of it must wait for the guest (runtime/sessions/machines.py).
        "-chardev", f"null,id={RESTORE_LISTENERS_CHARDEV}",
        "-device",
        f"virtserialport,chardev={RESTORE_LISTENERS_CHARDEV},name={RESTORE_LISTENERS_PORT}",
        # The guest's volume mounts, served by volume_server.py (guest/volumes.py).
        "-chardev", f"socket,id=vol,path={files.volumes_socket},server=on,wait=off",
        "-device", f"virtserialport,chardev=vol,name={VOLUMES_PORT}",
        "-chardev", chardev(files, ring=not console_file),
        "-serial", "chardev:ser0",
        "-qmp", f"unix:{files.qmp_socket},server=on,wait=off",
        "-pidfile", str(files.pidfile),
        "-no-reboot",
        # Device states are saved without RAM (xen-save-devices-state), which writes no
        # configuration section; loading must not expect one either.
        "-global", "migration.send-configuration=off",
        "-sandbox", "on,obsolete=deny,spawn=deny,resourcecontrol=deny,"
        f"elevateprivileges={jail.sandbox_elevation()}",
        *jail.qemu_args(build, files),
    ]  # fmt: skip
    if incoming:  # paused after the load too: the caller decides when it runs
        argv += ["-incoming", "defer", "-S"]
    else:
        # A restored guest's kernel is in its RAM: loading these would cost ~40 ms of
        # every restore. So a guest cannot reboot into them: -no-reboot makes a reboot
        # end the VM (the session shows as crashed), for booted VMs alike.
        argv += ["-kernel", str(boot.kernel), "-initrd", str(boot.initrd)]
        argv += ["-append", boot.cmdline]
    return argv


def _accel(shape: MachineShape) -> str:
    # TCG's translation cache defaults to up to 1 GiB, touched as code is translated: a
    # fixed size keeps QEMU's overhead bounded for the session's memory limit (cgroups).
    return f"tcg,tb-size={TCG_TB_MIB}" if shape.accel == "tcg" else shape.accel


def _netdev(net_fd: int | None) -> str:
    # The listening socket is forkpoint's, inherited: QEMU 7.2 binds a stream netdev's
    # own socket asynchronously, which can come after a jailed QEMU's chroot (the bind
    # then fails inside the empty root and passt finds no socket).
    if net_fd is not None:
        return f"stream,id=n0,server=on,addr.type=fd,addr.str={net_fd}"
    return "hubport,id=n0,hubid=0"
