"""Remapping a running process's private file mapping onto a new file through ptrace, as a
checkpoint does to QEMU (no VM: a child process plays QEMU, waiting in a system call)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkpoint.vm import sparse_copy
from forkpoint.vm.rebase import copy_and_rebase, frozen_main_thread, supported
from forkpoint.vm.written import PAGE_SIZE, ram_mapping, written_ranges

pytestmark = pytest.mark.skipif(not supported(), reason="remapping needs x86_64")

PAGES = 37  # no other mapping of the test's own process has this size
SIZE = PAGES * PAGE_SIZE

# The child maps BASE privately, writes pages 2, 3 and 9, then answers commands on stdin
# (blocked in read(2), as QEMU's main loop sits in ppoll): "open PATH" -> its fd number,
# "dump" -> its mapping's bytes as hex, "write N" -> writes page N, "signals" -> how many
# SIGUSR1 it has had.
_CHILD = textwrap.dedent(
    """
    import mmap, os, signal, sys
    size = int(sys.argv[2])
    got = []
    signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    with open(sys.argv[1], "rb") as f:
        ram = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE)
    page = mmap.PAGESIZE
    for n in (2, 3, 9):
        ram[n * page:(n + 1) * page] = bytes([0x50 + n]) * page
    print("ready", flush=True)
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "open":
            print(os.open(arg, os.O_RDONLY), flush=True)
        elif command == "dump":
            print(bytes(ram).hex(), flush=True)
        elif command == "write":
            n = int(arg)
            ram[n * page:(n + 1) * page] = bytes([0xE0 + n]) * page
            print("ok", flush=True)
        elif command == "signals":
            print(len(got), flush=True)
    """
)


class Child:
    def __init__(self, base: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(base), str(SIZE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.ask(None) == "ready"

    def ask(self, command: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def memory(self) -> bytes:
        return bytes.fromhex(self.ask("dump"))


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "base"
    with path.open("wb") as f:
        f.truncate(SIZE)
        f.seek(5 * PAGE_SIZE)
        f.write(b"\x05" * PAGE_SIZE)
    return path


@pytest.fixture
def dest(base: Path, tmp_path: Path) -> Path:
    """A copy of the base: what a checkpoint's RAM file starts as."""
    path = tmp_path / "ckpt"
    sparse_copy(base, path)
    return path


@pytest.fixture
def child(base: Path) -> Iterator[Child]:
    c = Child(base)
    yield c
    c.proc.kill()
    c.proc.wait()
    for stream in (c.proc.stdin, c.proc.stdout):
        if stream is not None:
            stream.close()


def test_the_mapping_moves_onto_the_copy_and_no_private_page_is_left(
    base: Path, child: Child, dest: Path
) -> None:
    pid = child.proc.pid
    before = child.memory()
    mapping = ram_mapping(pid, SIZE)
    assert mapping.path == base
    fd_in_child = int(child.ask(f"open {dest}"))
    ranges: list[tuple[int, int]] = []

    written, used = copy_and_rebase(pid, mapping, dest, fd_in_child, ranges)

    assert used is not None and written == 3 * PAGE_SIZE
    # What it had read of the old file (all of it: the dump), not what it had written:
    # the kernel reads that ahead for it from the new file.
    assert used == [
        (0, 2 * PAGE_SIZE),
        (4 * PAGE_SIZE, 5 * PAGE_SIZE),
        (10 * PAGE_SIZE, (PAGES - 10) * PAGE_SIZE),
    ]
    assert ranges == [(2 * PAGE_SIZE, 2 * PAGE_SIZE), (9 * PAGE_SIZE, PAGE_SIZE)]
    assert dest.read_bytes() == before  # the checkpoint holds what the process saw
    assert ram_mapping(pid, SIZE).path == dest  # it maps the checkpoint now ...
    assert written_ranges(pid, mapping.start, SIZE) == []  # ... with nothing private
    assert child.memory() == before  # and sees exactly what it saw
    # It runs on normally: its next write is private again, the checkpoint untouched.
    assert child.ask("write 7") == "ok"
    assert written_ranges(pid, mapping.start, SIZE) == [(7 * PAGE_SIZE, PAGE_SIZE)]
    assert dest.read_bytes() == before
    assert base.read_bytes()[2 * PAGE_SIZE] == 0  # the old base was never written


def test_a_signal_sent_while_frozen_arrives_after(base: Path, child: Child) -> None:
    pid = child.proc.pid
    with frozen_main_thread(pid):
        os.kill(pid, signal.SIGUSR1)
        with open(f"/proc/{pid}/status") as status:
            assert any(line.split() == ["State:", "t", "(tracing", "stop)"] for line in status)
    assert child.ask("signals") == "1"


def test_without_a_descriptor_the_pages_are_copied_and_the_mapping_stays(
    base: Path, child: Child, dest: Path
) -> None:
    pid = child.proc.pid
    mapping = ram_mapping(pid, SIZE)
    assert copy_and_rebase(pid, mapping, dest, None, []) == (3 * PAGE_SIZE, None)
    assert dest.read_bytes() == child.memory()
    assert ram_mapping(pid, SIZE).path == base


def test_a_failed_remap_leaves_the_process_as_it_was(base: Path, child: Child, dest: Path) -> None:
    pid = child.proc.pid
    before = child.memory()
    mapping = ram_mapping(pid, SIZE)
    written, used = copy_and_rebase(pid, mapping, dest, 987, [])  # no such fd there
    assert written == 3 * PAGE_SIZE and used is None
    assert ram_mapping(pid, SIZE).path == base
    assert child.memory() == before
    assert child.ask("write 1") == "ok"
