"""Moving a paused VM's RAM mapping onto the checkpoint just written of it.

A VM maps its base RAM file privately, so every page the guest writes stays a private
copy until QEMU exits: without help, each checkpoint would copy (and hash) every page
written since the restore, not since the previous checkpoint. After a checkpoint the new
RAM file holds exactly the guest's memory, so mapping *it* in place of the old mapping
changes nothing the guest can see and leaves no private page: the next checkpoint finds
only the pages written since this one. QEMU has no command for that, so forkpoint makes
QEMU's main thread run one ``mmap(MAP_FIXED)`` itself, through ``ptrace`` (the access the
checkpoint already needs to read guest memory).

While the main thread is stopped here QEMU's main loop is frozen: no QMP command, timer
or character-device handler runs, so nothing writes guest RAM between the copy of the
written pages and the remap (a device answering the guest while paused would otherwise
write into the old mapping and be lost). The vCPUs are stopped and block I/O is drained
by ``stop``.

x86_64 only (the register layout); elsewhere :func:`supported` is false and checkpoints
copy as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import platform
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from forkpoint.vm.written import RamMapping, copy_written_pages

__all__ = [
    "FrozenMainThread",
    "copy_and_rebase",
    "frozen_main_thread",
    "read_ahead",
    "supported",
]

_log = logging.getLogger(__name__)

_PTRACE_CONT = 7
_PTRACE_SINGLESTEP = 9
_PTRACE_GETREGS = 12
_PTRACE_SETREGS = 13
_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_SYS_MMAP = 9
_SYSCALL_INSN = b"\x0f\x05"
_MAX_STEPS = 16  # signals arriving while the one instruction is stepped
_WALL = 0x40000000  # waitpid: threads too


class _Regs(ctypes.Structure):
    """``struct user_regs_struct`` of x86_64."""

    _fields_ = [
        (name, ctypes.c_ulonglong)
        for name in (
            "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax",
            "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss",
            "fs_base", "gs_base", "ds", "es", "fs", "gs",
        )
    ]  # fmt: skip


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def supported() -> bool:
    """Whether this host can remap a VM's RAM (x86_64 registers)."""
    return platform.machine() == "x86_64"


def _ptrace(request: int, tid: int, addr: int = 0, data: int | ctypes.c_void_p = 0) -> int:
    result = _libc.ptrace(request, tid, ctypes.c_void_p(addr), data)
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"ptrace({request:#x}) of {tid}: {os.strerror(code)}")
    return int(result)


def _wait_stop(tid: int) -> int:
    """Until ``tid`` stops; returns the stopping signal."""
    while True:
        _, status = os.waitpid(tid, _WALL)
        if os.WIFSTOPPED(status):
            return os.WSTOPSIG(status)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            raise ProcessLookupError(tid, "QEMU exited while stopped for a checkpoint")


def _syscall_address(pid: int) -> int:
    """An address in QEMU's executable memory holding a ``syscall`` instruction."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if len(fields) < 2 or "x" not in fields[1] or not fields[1].startswith("r"):
                continue
            start, end = (int(a, 16) for a in fields[0].split("-"))
            mem.seek(start)
            try:
                text = mem.read(min(end - start, 4 << 20))
            except OSError:
                continue  # e.g. [vsyscall]
            at = text.find(_SYSCALL_INSN)
            if at >= 0:
                return start + at
    raise LookupError(f"no syscall instruction found in process {pid}")


class FrozenMainThread:
    """QEMU's main thread, stopped by ptrace: it runs the system calls asked of it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._saved = _Regs()
        self._pending = 0  # a signal that arrived meanwhile: delivered on release
        self._insn = _syscall_address(pid)
        _ptrace(_PTRACE_SEIZE, pid)
        try:
            _ptrace(_PTRACE_INTERRUPT, pid)
            while (sig := _wait_stop(pid)) != signal.SIGTRAP:
                self._pending = sig  # a signal-delivery stop first: keep it for later
                _ptrace(_PTRACE_INTERRUPT, pid)
                _ptrace(_PTRACE_CONT, pid, 0, 0)
            _ptrace(_PTRACE_GETREGS, pid, 0, ctypes.addressof(self._saved))
        except BaseException:
            with contextlib.suppress(OSError):
                _ptrace(_PTRACE_DETACH, pid, 0, self._pending)
            raise

    def syscall(self, number: int, *args: int) -> int:
        """Run system call ``number`` in the stopped thread; returns its result.
        :raises OSError: it failed (the thread's errno is untouched: it is the raw result)."""
        regs = _Regs.from_buffer_copy(self._saved)
        regs.rax, regs.orig_rax, regs.rip = number, ctypes.c_ulonglong(-1).value, self._insn
        for name, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args, strict=False):
            setattr(regs, name, ctypes.c_ulonglong(value).value)
        _ptrace(_PTRACE_SETREGS, self.pid, 0, ctypes.addressof(regs))
        for _ in range(_MAX_STEPS):
            _ptrace(_PTRACE_SINGLESTEP, self.pid, 0, 0)
            sig = _wait_stop(self.pid)
            _ptrace(_PTRACE_GETREGS, self.pid, 0, ctypes.addressof(regs))
            if sig == signal.SIGTRAP and regs.rip == self._insn + len(_SYSCALL_INSN):
                break
            if sig != signal.SIGTRAP:
                self._pending = sig  # delivered on release, not into the injected call
        else:
            raise OSError(errno.EIO, f"process {self.pid} did not run the injected call")
        result = ctypes.c_longlong(regs.rax).value
        if -4096 < result < 0:
            raise OSError(-result, os.strerror(-result))
        return result

    def release(self) -> None:
        """The thread's own registers back, and it runs on where it stopped."""
        try:
            _ptrace(_PTRACE_SETREGS, self.pid, 0, ctypes.addressof(self._saved))
        finally:
            _ptrace(_PTRACE_DETACH, self.pid, 0, self._pending)

    def map_private(self, address: int, length: int, fd: int) -> None:
        """Replace QEMU's mapping at ``address`` by a private mapping of its ``fd``."""
        flags = mmap.MAP_PRIVATE | 0x10  # MAP_FIXED: in place of what is there
        mapped = self.syscall(
            _SYS_MMAP, address, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0
        )
        if mapped != address:
            raise OSError(errno.EFAULT, f"mmap landed at {mapped:#x}, not {address:#x}")


@contextlib.contextmanager
def frozen_main_thread(pid: int) -> Iterator[FrozenMainThread]:
    """QEMU ``pid``'s main loop stopped for the block; it runs on after it.

    Must be entered and left on one OS thread (ptrace's tracer is a thread)."""
    frozen = FrozenMainThread(pid)
    try:
        yield frozen
    finally:
        frozen.release()


def copy_and_rebase(
    pid: int, ram: RamMapping, dest: Path, qemu_fd: int | None,
    ranges_out: list[tuple[int, int]],
) -> tuple[int, list[tuple[int, int]] | None]:  # fmt: skip
    """A paused VM's written pages copied over ``dest`` (a copy of the file ``ram``
    maps), then its RAM remapped onto QEMU's descriptor ``qemu_fd`` of ``dest``, all with
    the main loop frozen. Returns the bytes copied and, if the RAM was remapped, the
    ranges of the old file the guest had in memory (see :func:`read_ahead`).

    Without ``qemu_fd``, or when QEMU cannot be stopped (another tracer holds it), or the
    remap fails, the pages are still copied and the VM keeps its mapping: that checkpoint
    is whole, the next one merely copies more. Runs on one thread (see
    :func:`frozen_main_thread`).
    """
    if qemu_fd is None:
        return copy_written_pages(pid, ram, dest, ranges_out), None
    try:
        frozen = FrozenMainThread(pid)
    except (OSError, LookupError) as error:
        _log.warning("QEMU %s cannot be stopped for a remap (%s): copying only", pid, error)
        return copy_written_pages(pid, ram, dest, ranges_out), None
    try:
        used: list[tuple[int, int]] = []
        written = copy_written_pages(pid, ram, dest, ranges_out, read_out=used)
        try:
            frozen.map_private(ram.start, ram.size, qemu_fd)
        except OSError as error:  # before anything was unmapped: the old mapping stands
            _log.warning("QEMU %s: remapping its RAM failed (%s)", pid, error)
            return written, None
    finally:
        frozen.release()
    return written, used


def read_ahead(path: Path, ranges: list[tuple[int, int]]) -> None:
    """Ask the kernel to read ``ranges`` of ``path`` into memory, in the background.

    After a remap the guest's memory is the new file's pages, and a file's page cache is
    its own (a reflink shares blocks on disk, not pages in memory): the guest's next
    touch of each page it used would wait for the disk (≈ 40 ms more on the next
    ``exec`` here; 7 ms with this)."""
    threading.Thread(target=_read_ahead, args=(path, ranges), daemon=True).start()


def _read_ahead(path: Path, ranges: list[tuple[int, int]]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset, length in ranges:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)
