"""The pages a process wrote into a private file mapping, found and copied exactly."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from forkpoint.vm import sparse_copy
from forkpoint.vm.written import PAGE_SIZE, copy_written_pages, ram_mapping, written_ranges

PAGES = 64


def _base(tmp_path: Path) -> Path:
    base = tmp_path / "base"
    with base.open("wb") as f:
        f.truncate(PAGES * PAGE_SIZE)
        for page in (0, 1, 20):  # some data, the rest holes
            f.seek(page * PAGE_SIZE)
            f.write(bytes([page + 1]) * PAGE_SIZE)
    return base


def test_written_pages_are_found_and_copied(tmp_path: Path) -> None:
    base = _base(tmp_path)
    size = PAGES * PAGE_SIZE
    with base.open("rb") as f:
        ram = mmap.mmap(
            f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
    try:
        assert ram[0] == 1 and ram[30 * PAGE_SIZE] == 0  # read-only touches stay the file's
        for page in (3, 4, 20, 63):
            ram[page * PAGE_SIZE : (page + 1) * PAGE_SIZE] = bytes([0xA0 + page]) * PAGE_SIZE
        mapping = ram_mapping(os.getpid(), size)
        assert mapping.named and mapping.path == base
        assert written_ranges(os.getpid(), mapping.start, size) == [
            (3 * PAGE_SIZE, 2 * PAGE_SIZE),
            (20 * PAGE_SIZE, PAGE_SIZE),
            (63 * PAGE_SIZE, PAGE_SIZE),
        ]
        dest = tmp_path / "dest"
        sparse_copy(base, dest)
        assert copy_written_pages(os.getpid(), mapping, dest) == 4 * PAGE_SIZE
        assert dest.read_bytes() == bytes(ram)
        assert base.read_bytes()[20 * PAGE_SIZE] == 21  # the base file is never written
    finally:
        ram.close()


def test_a_deleted_mapped_file_is_reached_through_map_files(tmp_path: Path) -> None:
    """A VM's RAM file may be deleted while mapped (its checkpoint removed): the mapping
    is still found, and the file still read, through /proc/PID/map_files."""
    base = _base(tmp_path)
    size = PAGES * PAGE_SIZE
    with base.open("rb") as f:
        ram = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE)
    try:
        base.unlink()
        mapping = ram_mapping(os.getpid(), size)
        assert not mapping.named and "map_files" in str(mapping.path)
        assert mapping.path.read_bytes()[20 * PAGE_SIZE] == 21
    finally:
        ram.close()


def test_no_mapping_of_that_size_is_refused() -> None:
    with pytest.raises(LookupError, match="maps no file"):
        ram_mapping(os.getpid(), 12345 * PAGE_SIZE)
