"""Guest RAM files: sparse copies that move only the allocated extents.

A 512 MiB guest that uses 80 MiB has an 80 MiB RAM file on disk; copying it must cost
80 MiB, not 512. ``SEEK_DATA``/``SEEK_HOLE`` find the extents and ``copy_file_range``
copies them inside the kernel (a reflink where the filesystem can).

A checkpoint's RAM file starts as a sparse copy of the file its VM maps (see
:mod:`forkpoint.vm.written` for the pages written on top).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "allocated_bytes",
    "copy_of",
    "create_sparse",
    "data_extents",
    "prepare_copy",
    "sparse_copy",
]

_CHUNK = 8 << 20  # bytes per read/write when copy_file_range cannot be used
_FICLONE = 0x40049409  # ioctl: dst shares all of src's blocks
# No reflink here: another file system (ext4, tmpfs), or across two.
_NO_REFLINK = (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS)


def data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """Yield ``(offset, length)`` in bytes of every allocated region of ``fd``."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: no data after offset
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end - start
        offset = end


def allocated_bytes(path: Path) -> int:
    """Bytes actually stored for ``path`` (what a sparse copy moves)."""
    return path.stat().st_blocks * 512


def create_sparse(path: Path, size: int) -> None:
    """Create an all-hole file of ``size`` bytes (a fresh guest's RAM)."""
    with path.open("wb") as f:
        f.truncate(size)


def sparse_copy(src: Path, dst: Path) -> int:
    """Copy ``src`` to a new ``dst`` keeping holes; returns the bytes copied (0 for a
    reflink: where the file system has them, ``dst`` shares every block with ``src`` until
    one of them is written, and the copy costs a few milliseconds whatever the size)."""
    copied = 0
    with src.open("rb") as fin, dst.open("wb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
            return 0
        except OSError as error:
            if error.errno not in _NO_REFLINK:
                raise
        size = os.fstat(fin.fileno()).st_size
        fout.truncate(size)
        for start, length in data_extents(fin.fileno(), size):
            _copy_range(fin.fileno(), fout.fileno(), start, length)
            copied += length
    return copied


def _copy_range(fd_in: int, fd_out: int, offset: int, length: int) -> None:
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(fd_in, fd_out, length - done, offset + done, offset + done)
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            n = 0  # across filesystems on older kernels: copy through userspace
        if n == 0:
            _pread_pwrite(fd_in, fd_out, offset + done, length - done)
            return
        done += n


def _pread_pwrite(fd_in: int, fd_out: int, offset: int, length: int) -> None:
    end = offset + length
    while offset < end:
        data = os.pread(fd_in, min(_CHUNK, end - offset), offset)
        if not data:
            return
        os.pwrite(fd_out, data, offset)
        offset += len(data)


def _prepared(directory: Path, src: Path) -> Path:
    """Where :func:`prepare_copy` keeps a copy of ``src``: named by its inode (a file's
    identity while it exists; a checkpoint's RAM file never changes)."""
    return directory / f"ram-copy-{os.stat(src).st_ino}"


def prepare_copy(src: Path, directory: Path) -> None:
    """A copy of ``src`` made ahead in ``directory`` (replacing older ones there), for
    :func:`copy_of` to take later instead of copying then."""
    for old in directory.glob("ram-copy-*"):
        old.unlink(missing_ok=True)
    dest = _prepared(directory, src)
    tmp = dest.with_name(f".{dest.name}.tmp")
    sparse_copy(src, tmp)
    os.replace(tmp, dest)


def copy_of(src: Path, dst: Path, directory: Path) -> None:
    """``dst`` a copy of ``src``: the one :func:`prepare_copy` made in ``directory`` if it
    is there (a rename), else a copy now."""
    try:
        os.rename(_prepared(directory, src), dst)
    except OSError:  # none prepared, or on another file system
        sparse_copy(src, dst)
