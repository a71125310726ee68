"""The guest pages a running VM has written since its RAM file was mapped.

Every VM maps a *base* RAM file MAP_PRIVATE: a checkpoint's RAM file (a restore), or an
empty sparse file (a cold boot). Pages the guest never wrote are still the file's page
cache, shared by every VM restored from it; a page it wrote became a private anonymous
copy inside QEMU. ``/proc/PID/pagemap`` tells the two apart and ``/proc/PID/mem`` reads
the private ones — so a checkpoint is the base file plus exactly the pages written.

Reading another process's pagemap and memory needs ptrace access to it (root, or the
same user where ``kernel.yama.ptrace_scope`` is 0).
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PAGE_SIZE",
    "RamMapping",
    "copy_written_pages",
    "ram_mapping",
    "written_ranges",
]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_CHUNK = 8 << 20  # bytes per read/write of guest memory
_WORKERS = min(4, os.cpu_count() or 1)

# pagemap entries are little-endian u64; their top byte holds the flags we need:
# bit 63 present, bit 62 swapped, bit 61 file-page-or-shared-anon.
_PRESENT, _SWAPPED, _FILE = 0x80, 0x40, 0x20
# Top byte -> b"w" when the page is a private (written) copy, b"r" when it is the file's
# page, in memory (read, not written), else b".".
_MARKS = bytes(
    ord("w")
    if (flags & _SWAPPED) or (flags & _PRESENT and not flags & _FILE)
    else ord("r")
    if flags & _PRESENT
    else ord(".")
    for flags in range(256)
)


@dataclass(frozen=True)
class RamMapping:
    """Where a VM's RAM is mapped, and a path that opens the file mapped there."""

    start: int
    size: int
    path: Path  # the file's own path, or /proc/PID/map_files/… if it was deleted
    named: bool  # ``path`` is the file's own (a checkpoint's RAM: its manifest is beside it)


def ram_mapping(pid: int, size: int) -> RamMapping:
    """The private, writable file mapping of ``size`` bytes from offset 0 in process
    ``pid``: its RAM. Found from QEMU itself, not from what the store says it was
    restored from: after a checkpoint it maps that checkpoint's file (see
    :mod:`.rebase`), which may since have been deleted (it lives on while mapped).

    :raises LookupError: no such mapping.
    """
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.rstrip("\n").split(maxsplit=5)
            if len(fields) < 6 or int(fields[4]) == 0 or int(fields[2], 16) != 0:
                continue
            span, perms, path = fields[0], fields[1], fields[5]
            start, end = (int(a, 16) for a in span.split("-"))
            if end - start != size or not perms.startswith("rw") or not perms.endswith("p"):
                continue
            own = Path(path)
            try:
                named = not path.endswith(" (deleted)") and own.stat().st_ino == int(fields[4])
            except OSError:
                named = False
            where = own if named else Path(f"/proc/{pid}/map_files/{span}")
            return RamMapping(start, size, where, named)
    raise LookupError(f"process {pid} maps no file of {size} bytes privately")


def written_ranges(pid: int, start: int, size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` in bytes of the runs of written pages in ``[start, start+size)``."""
    return _runs(rb"w+", _marks(pid, start, size))


def _marks(pid: int, start: int, size: int) -> bytes:
    """A byte per page of ``[start, start+size)``: see ``_MARKS``."""
    pages = size // PAGE_SIZE
    fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    try:
        entries = _pread_all(fd, pages * 8, start // PAGE_SIZE * 8)
    finally:
        os.close(fd)
    return entries[7::8].translate(_MARKS)  # scanned at C speed


def _runs(pattern: bytes, marks: bytes) -> list[tuple[int, int]]:
    return [
        (m.start() * PAGE_SIZE, (m.end() - m.start()) * PAGE_SIZE)
        for m in re.finditer(pattern, marks)
    ]


def copy_written_pages(
    pid: int, ram: RamMapping, dest: Path, ranges_out: list[tuple[int, int]] | None = None,
    *, read_out: list[tuple[int, int]] | None = None,
) -> int:  # fmt: skip
    """Write every page ``pid`` has written into its ``ram`` mapping over ``dest``.

    ``dest`` must already hold a copy of the mapped file; the VM must be paused. Returns
    the bytes written (and appends the runs written to ``ranges_out``, and the runs of
    the file's own pages it has in memory, read and not written, to ``read_out``). Copies
    on several threads (the VM is paused: the CPUs are free).
    """
    start = ram.start
    marks = _marks(pid, start, ram.size)
    ranges = _runs(rb"w+", marks)
    if ranges_out is not None:
        ranges_out.extend(ranges)
    if read_out is not None:
        read_out.extend(_runs(rb"r+", marks))
    chunks = [
        (offset, min(_CHUNK, run_start + length - offset))
        for run_start, length in ranges
        for offset in range(run_start, run_start + length, _CHUNK)
    ]
    workers = min(_WORKERS, len(chunks))
    if workers == 0:
        return 0
    with ThreadPoolExecutor(workers) as pool:
        shares = [chunks[i::workers] for i in range(workers)]  # interleaved: even loads
        return sum(pool.map(lambda share: _copy_chunks(pid, start, dest, share), shares))


def _copy_chunks(pid: int, start: int, dest: Path, chunks: list[tuple[int, int]]) -> int:
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    out = os.open(dest, os.O_WRONLY)
    buffer = memoryview(bytearray(_CHUNK))  # reused: no allocation per chunk
    copied = 0
    try:
        for offset, length in chunks:
            done = 0
            while done < length:
                n = os.preadv(mem, [buffer[done:length]], start + offset + done)
                if n <= 0:
                    raise OSError(f"cannot read guest memory at offset {offset + done:#x}")
                done += n
            _pwrite_all(out, buffer[:length], offset)
            copied += length
    finally:
        os.close(out)
        os.close(mem)
    return copied


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    parts = []
    while length > 0:
        data = os.pread(fd, length, offset)
        if not data:
            raise OSError(f"short read at offset {offset:#x}")
        parts.append(data)
        length -= len(data)
        offset += len(data)
    return b"".join(parts)
