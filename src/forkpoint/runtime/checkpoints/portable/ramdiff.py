"""Guest RAM as a page-level diff against a base (the parent checkpoint's RAM, or zeros).

A child checkpoint's RAM is its parent's plus the pages its guest wrote, scattered over
the whole RAM: measured here, a child that wrote 3.8 MiB differs from its parent in 84 MiB
of 4 MiB chunks but in 2.4 MiB of 4 KiB pages. So a *pack* carries whole pages: runs of
consecutive changed pages, zstd-compressed. The delta is found at push time by comparing
the two RAM files page by page (both are local; only the allocated extents are read), so
checkpointing itself stays as it is.

Pack layout (before compression): ``MAGIC``, then records ``<first page, page count>``
(two little-endian u32) each followed by its pages, ended by ``END``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import zstandard

from forkpoint.errors import InvalidInput
from forkpoint.vm.ramfile import create_sparse, data_extents, sparse_copy

__all__ = ["PAGE", "PackStats", "apply_pack", "write_pack"]

PAGE = 4096
MAGIC = b"FPRAMPK1"
_RUN = struct.Struct("<II")
_END = 0xFFFFFFFF
_BLOCK = 1 << 20  # compared at once; most blocks of a child equal the parent's
_LEVEL = 3  # zstd -3: the template's RAM to ~1/4 in about a second, single-threaded


class PackStats:
    """What a pack holds: pages changed and its compressed size."""

    def __init__(self) -> None:
        self.pages = 0
        self.stored_bytes = 0


def write_pack(ram: Path, base: Path | None, dest: Path) -> PackStats:
    """Write the pages of ``ram`` that differ from ``base`` (None: from zeros) to ``dest``.

    :raises InvalidInput: the two RAM files have different sizes.
    """
    stats = PackStats()
    with ram.open("rb") as child, _open_base(base) as parent, dest.open("wb") as out:
        size = os.fstat(child.fileno()).st_size
        if parent is not None and os.fstat(parent.fileno()).st_size != size:
            raise InvalidInput(f"{ram.name} and its parent's RAM differ in size")
        writer = zstandard.ZstdCompressor(level=_LEVEL).stream_writer(out, closefd=False)
        writer.write(MAGIC)
        for first, pages in _changed_runs(child.fileno(), _fd(parent), size):
            writer.write(_RUN.pack(first, len(pages) // PAGE))
            writer.write(pages)
            stats.pages += len(pages) // PAGE
        writer.write(_RUN.pack(_END, 0))
        writer.flush(zstandard.FLUSH_FRAME)
        out.flush()
        os.fsync(out.fileno())
        stats.stored_bytes = out.tell()
    return stats


def apply_pack(pack: Path, base: Path | None, size: int, dest: Path) -> int:
    """Make ``dest``: a sparse copy of ``base`` (None: all holes, ``size`` bytes) with the
    pack's pages written over it; returns the pages written. Holes stay holes.

    :raises InvalidInput: the pack is malformed or runs past ``size``.
    """
    if base is not None:
        sparse_copy(base, dest)
    else:
        create_sparse(dest, size)
    written = 0
    with pack.open("rb") as f, dest.open("r+b") as out:
        reader = zstandard.ZstdDecompressor().stream_reader(f)
        if _read_exact(reader, len(MAGIC)) != MAGIC:
            raise InvalidInput(f"{pack.name} is not a RAM pack")
        while True:
            first, count = _RUN.unpack(_read_exact(reader, _RUN.size))
            if first == _END:
                break
            if (first + count) * PAGE > size:
                raise InvalidInput(f"{pack.name} has pages past the end of the RAM")
            for i in range(count):  # a page at a time: runs can be many MiB
                os.pwrite(out.fileno(), _read_exact(reader, PAGE), (first + i) * PAGE)
            written += count
        out.flush()
        os.fsync(out.fileno())
    return written


def _changed_runs(child: int, parent: int | None, size: int) -> Iterator[tuple[int, bytes]]:
    """``(first page, bytes of the run)`` for each run of pages that differ."""
    run_start, run = -1, bytearray()
    for offset, length in _union_extents(child, parent, size):
        for block in range(offset, offset + length, _BLOCK):
            n = min(_BLOCK, offset + length - block)
            mine = os.pread(child, n, block).ljust(n, b"\0")
            theirs = os.pread(parent, n, block).ljust(n, b"\0") if parent is not None else None
            if theirs is not None and mine == theirs:
                continue
            view = memoryview(mine)
            for p in range(0, n, PAGE):
                page = view[p : p + PAGE]
                same = page == (theirs[p : p + PAGE] if theirs is not None else _ZERO)
                index = (block + p) // PAGE
                if same:
                    continue
                if run and index == run_start + len(run) // PAGE:
                    run += page
                    continue
                if run:
                    yield run_start, bytes(run)
                run_start, run = index, bytearray(page)
    if run:
        yield run_start, bytes(run)


_ZERO = bytes(PAGE)


def _union_extents(child: int, parent: int | None, size: int) -> list[tuple[int, int]]:
    """Page-aligned allocated regions of either file, merged and sorted (a page that is a
    hole in both is zero in both)."""
    spans = list(data_extents(child, size))
    if parent is not None:
        spans += data_extents(parent, size)
    merged: list[tuple[int, int]] = []
    for start, length in sorted(spans):
        start, end = start - start % PAGE, min(size, -(-(start + length) // PAGE) * PAGE)
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return [(start, end - start) for start, end in merged]


class _open_base:
    """``open(base, "rb")``, or nothing for a diff against zeros."""

    def __init__(self, base: Path | None) -> None:
        self._file = base.open("rb") if base is not None else None

    def __enter__(self) -> BinaryIO | None:
        return self._file

    def __exit__(self, *_: object) -> None:
        if self._file is not None:
            self._file.close()


def _fd(f: BinaryIO | None) -> int | None:
    return f.fileno() if f is not None else None


def _read_exact(reader: zstandard.ZstdDecompressionReader, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = reader.read(n - len(out))
        if not chunk:
            raise InvalidInput("RAM pack ends early")
        out += chunk
    return bytes(out)
