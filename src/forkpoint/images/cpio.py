"""A minimal writer for the ``newc`` cpio format the Linux kernel unpacks as initramfs.

Pure Python so building an image needs no ``cpio`` binary. Output is deterministic:
every entry gets mtime 0 and uid/gid 0, and inode numbers are assigned in order.
"""

from __future__ import annotations

import stat
from typing import BinaryIO

__all__ = ["CpioWriter"]

_MAGIC = b"070701"
_TRAILER = "TRAILER!!!"


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


class CpioWriter:
    """Append entries to a newc archive on ``stream``; call :meth:`close` to finish it.

    Paths are archive-relative (``"bin/busybox"``, no leading slash). Parent directories
    must be added before their entries, as the kernel unpacks in order.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._ino = 0
        self._closed = False

    def _entry(
        self,
        name: str,
        mode: int,
        data: bytes = b"",
        *,
        rdev: tuple[int, int] = (0, 0),
        nlink: int = 1,
    ) -> None:
        if self._closed:
            raise ValueError("archive already closed")
        self._ino += 1
        encoded = name.encode() + b"\0"
        fields = (
            self._ino,  # ino
            mode,
            0,  # uid
            0,  # gid
            nlink,
            0,  # mtime
            len(data),
            0,  # devmajor
            0,  # devminor
            rdev[0],
            rdev[1],
            len(encoded),
            0,  # check (unused by newc)
        )
        header = _MAGIC + b"".join(b"%08X" % value for value in fields)
        self._stream.write(header + encoded + _pad(len(header) + len(encoded)))
        self._stream.write(data + _pad(len(data)))

    def add_dir(self, name: str, perm: int = 0o755) -> None:
        self._entry(name.strip("/"), stat.S_IFDIR | perm, nlink=2)

    def add_file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self._entry(name.strip("/"), stat.S_IFREG | perm, data)

    def add_symlink(self, name: str, target: str) -> None:
        self._entry(name.strip("/"), stat.S_IFLNK | 0o777, target.encode())

    def add_char_device(self, name: str, major: int, minor: int, perm: int = 0o600) -> None:
        self._entry(name.strip("/"), stat.S_IFCHR | perm, rdev=(major, minor))

    def close(self) -> None:
        """Write the trailer. The stream itself is left open for the caller."""
        if not self._closed:
            self._entry(_TRAILER, 0, nlink=1)
            self._closed = True
