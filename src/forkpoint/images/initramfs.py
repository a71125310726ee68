"""The initramfs: busybox-static, the virtio modules, and an ``/init`` that finds the root.

The Debian cloud kernel builds its virtio drivers as modules, so the initramfs loads
them in dependency order, mounts ``/dev/vda`` (ext4) and ``switch_root``s into
``/sbin/forkpoint-init``. Any failure is printed on the console and the VM powers off,
so a caller sees the reason instead of a hang.
"""

from __future__ import annotations

import gzip
import io
import shutil
import struct
from pathlib import Path

from forkpoint.errors import ImageBuildError
from forkpoint.images.cpio import CpioWriter
from forkpoint.images.kernel import ExtractedKernel, read_module

__all__ = ["INIT_SCRIPT", "MODULES", "build_initramfs", "find_busybox"]

#: Loaded in this order; each needs only the ones before it.
MODULES: tuple[str, ...] = (
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "failover",
    "net_failover",
    "virtio_net",
    "fuse",  # volume mounts (guest/volumes.py)
)

_APPLETS = (
    "sh", "mount", "umount", "insmod", "switch_root", "sleep", "cat", "echo", "mkdir",
    "poweroff", "ls", "dmesg",
)  # fmt: skip

INIT_SCRIPT = """\
#!/bin/sh
# forkpoint initramfs: load virtio, mount /dev/vda, hand over to /sbin/forkpoint-init.
export PATH=/bin
fail() {
    echo "forkpoint-initramfs: FATAL: $*" >/dev/console
    echo "forkpoint-initramfs: powering off" >/dev/console
    sleep 1
    poweroff -f
    exit 1
}
mount -t proc proc /proc || fail "cannot mount /proc"
mount -t sysfs sysfs /sys || fail "cannot mount /sys"
mount -t devtmpfs devtmpfs /dev || fail "cannot mount devtmpfs on /dev"
for m in %(modules)s; do
    # Absent from the archive means built into the kernel.
    [ -f /lib/modules/$m.ko ] || continue
    [ -d /sys/module/$m ] && continue
    insmod /lib/modules/$m.ko || fail "insmod $m failed"
done
i=0
while [ ! -b /dev/vda ]; do
    i=$((i + 1))
    [ $i -gt 100 ] && fail "no /dev/vda after 10 s (is a virtio-blk-device attached?)"
    sleep 0.1
done
mkdir -p /newroot
mount -t ext4 -o rw /dev/vda /newroot || fail "cannot mount /dev/vda (ext4) on /newroot"
[ -x /newroot/sbin/forkpoint-init ] || fail "/sbin/forkpoint-init missing on /dev/vda"
mount -o move /dev /newroot/dev || fail "cannot move /dev"
umount /sys
umount /proc
exec switch_root /newroot /sbin/forkpoint-init
fail "switch_root failed"
"""


def _is_static_elf(path: Path) -> bool:
    """True if ``path`` is an ELF64 executable without a PT_INTERP (dynamic loader)."""
    with path.open("rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:5] != b"\x7fELF\x02":
            return False
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    for i in range(phnum):
        (p_type,) = struct.unpack_from("<I", table, i * phentsize)
        if p_type == 3:  # PT_INTERP
            return False
    return True


def find_busybox() -> Path:
    """The host's statically linked busybox (package ``busybox-static``).

    Raises :class:`ImageBuildError` if there is none, or only a dynamic one.
    """
    for candidate in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")):
        if candidate and Path(candidate).is_file() and _is_static_elf(Path(candidate)):
            return Path(candidate)
    raise ImageBuildError("no statically linked busybox found: apt-get install busybox-static")


def build_initramfs(kernel: ExtractedKernel, out: Path, busybox: Path | None = None) -> list[str]:
    """Write a gzip'd newc initramfs for ``kernel`` to ``out``.

    Returns the modules packed (in load order); the rest are built in or absent.
    Raises :class:`ImageBuildError` if a module is neither packed nor built in.
    """
    busybox = busybox or find_busybox()
    buf = io.BytesIO()
    cpio = CpioWriter(buf)
    for d in ("bin", "dev", "lib", "lib/modules", "newroot", "proc", "sys"):
        cpio.add_dir(d)
    # The kernel opens /dev/console for init's stdio before anything mounts devtmpfs.
    cpio.add_char_device("dev/console", 5, 1)
    cpio.add_char_device("dev/null", 1, 3, perm=0o666)
    cpio.add_file("bin/busybox", busybox.read_bytes(), perm=0o755)
    for applet in _APPLETS:
        cpio.add_symlink(f"bin/{applet}", "busybox")
    packed: list[str] = []
    for name in MODULES:
        path = kernel.find_module(name)
        if path is None:
            if kernel.is_builtin(name):
                continue
            raise ImageBuildError(f"kernel {kernel.version} has no module {name}")
        cpio.add_file(f"lib/modules/{name}.ko", read_module(path))
        packed.append(name)
    cpio.add_file("init", (INIT_SCRIPT % {"modules": " ".join(MODULES)}).encode(), perm=0o755)
    cpio.close()
    out.write_bytes(gzip.compress(buf.getvalue(), compresslevel=6, mtime=0))
    return packed
