"""One running microVM: start (cold or from a checkpoint), checkpoint, kill, re-adopt.

Knows QEMU and files, nothing of sessions or the store. Every method that waits takes or
implies a deadline and raises :class:`~forkpoint.errors.QemuError` with QEMU's own
message and the tail of its log when QEMU fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

from forkpoint import faults
from forkpoint.errors import InternalError, QemuError
from forkpoint.polling import poll_until
from forkpoint.vm.argv import RESTORE_LISTENERS_CHARDEV, build_argv
from forkpoint.vm.build import QemuBuild, qemu_build
from forkpoint.vm.cgroups import SessionCgroup
from forkpoint.vm.console import drain_console
from forkpoint.vm.disk import overlay_on_top
from forkpoint.vm.fdsets import FDSET_PREFIX, add_to_fdset, disk_fds
from forkpoint.vm.files import VmFiles
from forkpoint.vm.jail import Jail
from forkpoint.vm.migration import incoming_arguments, state_file_uri
from forkpoint.vm.process import exit_status, is_running, kill_and_wait, spawn_detached
from forkpoint.vm.qmp import Qmp
from forkpoint.vm.ramfile import allocated_bytes, copy_of, create_sparse
from forkpoint.vm.rebase import copy_and_rebase, read_ahead
from forkpoint.vm.rebase import supported as rebase_supported
from forkpoint.vm.runstate import LOADING, RESUMABLE, RunState, StateError, require
from forkpoint.vm.shape import BootFiles, MachineShape
from forkpoint.vm.stats import CheckpointStats
from forkpoint.vm.written import RamMapping, ram_mapping

__all__ = ["Machine"]

_START_TIMEOUT_S = 30.0
_MIGRATE_TIMEOUT_S = 120.0
_NET_TIMEOUT_S = 10.0
_MAX_BANDWIDTH = 64 << 30  # bytes/s


class Machine:
    """A QEMU process plus its QMP connection; ``build`` says which QMP it speaks."""

    def __init__(self, files: VmFiles, pid: int, qmp: Qmp, build: QemuBuild | None) -> None:
        self.files = files
        self.pid = pid
        self._build = build
        self._qmp = qmp

    @property
    def build(self) -> QemuBuild:
        # Identified only when needed: an adopted VM that is only resumed (every agent
        # call) must not pay for hashing the QEMU binary.
        if self._build is None:
            self._build = qemu_build()
        return self._build

    # -- lifecycle ---------------------------------------------------------------------

    @classmethod
    async def launch(
        cls,
        build: QemuBuild,
        shape: MachineShape,
        boot: BootFiles,
        files: VmFiles,
        disk: Path,
        *,
        jail: Jail,
        ram: Path | None = None,
        network: bool,
        incoming: bool,
        cgroup: SessionCgroup | None = None,
        console_file: bool = False,
    ) -> Machine:
        """Start QEMU on the RAM file ``ram``, mapped copy-on-write (None: a new empty one,
        ``files.boot_ram``). ``incoming``: the VM waits for :meth:`restore`; else it boots.
        ``jail``: the uid QEMU runs as once set up (see :mod:`~forkpoint.vm.jail`).
        ``cgroup``: QEMU is moved into it before the guest runs. ``console_file``: see
        :func:`~forkpoint.vm.argv.build_argv`.

        With ``network`` the caller connects the network backend (passt) before the VM
        runs, see :func:`~forkpoint.vm.argv.build_argv`.
        :raises QemuError: QEMU exited, or did not come up within the start timeout.
        """
        # New files, the pidfile too: QEMU locks it, and the VM this one replaces (a
        # rollback) may still be exiting, holding the lock on the old one.
        await asyncio.to_thread(_fresh_files, files)
        if ram is None:
            ram = files.boot_ram
            create_sparse(ram, shape.memory_mib << 20)
        # A booting guest waits (-S) until QEMU is in its cgroup; a restore waits anyway.
        hold = cgroup is not None and not incoming
        with disk_fds(disk) as fds, _listening(files.net_socket, network) as net_fd:
            argv = build_argv(
                build, shape, boot, files, (disk, fds), ram, jail,
                net_fd=net_fd, incoming=incoming, console_file=console_file,
            )  # fmt: skip
            inherited = fds if net_fd is None else (*fds, net_fd)
            pid = spawn_detached(argv + ["-S"] if hold else argv, files.qemu_log, inherited)
        # Moved while QEMU starts up (a cgroup move can wait for an RCU grace period,
        # milliseconds), and always before its guest runs.
        attached = asyncio.ensure_future(asyncio.to_thread(cgroup.attach, pid)) if cgroup else None
        try:
            try:
                qmp = await Qmp.connect(
                    files.qmp_socket,
                    _START_TIMEOUT_S,
                    files.name,
                    alive=lambda: is_running(pid, files.name),
                )
            finally:
                if attached is not None:
                    await attached
            if hold:
                await qmp.run("cont")
            return cls(files, pid, qmp, build)
        except QemuError as error:
            raise _start_failed(files, pid, error) from None

    async def attach_network(self, connect: Callable[[], Awaitable[None]]) -> None:
        """Run ``connect`` (which connects the network backend to the VM's stream socket)
        and return once QEMU has accepted the connection: only then may a restored VM
        run (see :func:`~forkpoint.vm.argv.build_argv`).

        :raises QemuError: QEMU did not report the connection in time.
        """
        await self._qmp.run_until_event("NETDEV_STREAM_CONNECTED", connect, _NET_TIMEOUT_S)

    async def restore(self, state: Path, *, run: bool = True) -> None:
        """Load ``state`` (from :meth:`checkpoint` or :meth:`save_state`) into a VM launched
        with ``incoming``, and run it (``run=False``: leave it paused for :meth:`run`).
        On failure QEMU is killed.

        :raises QemuError: QEMU's own error text plus the log tail.
        """
        try:
            async with state_file_uri(
                self._qmp, self.build, state, write=False, fd_name="incoming"
            ) as uri:
                await self._qmp.run("migrate-incoming", **incoming_arguments(self.build, uri))
            await self._wait_incoming()
            if run:
                await self.run()
        except QemuError as error:
            await self._qmp.close()
            raise _start_failed(self.files, self.pid, error) from None

    async def run(self) -> None:
        """Run a paused VM."""
        await self._qmp.run("cont")

    async def pause(self) -> None:
        """Pause a running VM (its vCPUs stop; QEMU keeps everything else)."""
        await self._qmp.run("stop")

    async def restore_listeners(self) -> bool:
        """Whether the guest holds its restore-listeners port open: it has processes or
        hooks to tell of a restore (see ``guest/restore.py``). QEMU knows; the guest is
        not asked."""
        for chardev in await self._qmp.run("query-chardev"):
            if chardev.get("label") == RESTORE_LISTENERS_CHARDEV:
                return bool(chardev.get("frontend-open"))
        return False

    @classmethod
    async def start(
        cls,
        build: QemuBuild,
        shape: MachineShape,
        boot: BootFiles,
        files: VmFiles,
        disk: Path,
        *,
        ram: Path | None = None,
        state: Path | None = None,
        jail: Jail,
        cgroup: SessionCgroup | None = None,
        console_file: bool = False,
    ) -> Machine:
        """:meth:`launch` without network, then :meth:`restore` ``state`` if given (else
        the VM boots). Returns once the VM runs."""
        machine = await cls.launch(
            build, shape, boot, files, disk,
            jail=jail, ram=ram, network=False, incoming=state is not None, cgroup=cgroup,
            console_file=console_file,
        )  # fmt: skip
        if state is not None:
            await machine.restore(state)
        return machine

    @classmethod
    async def adopt(
        cls, files: VmFiles, pid: int, timeout_s: float = 5.0, build: QemuBuild | None = None
    ) -> Machine:
        """Reconnect to a QEMU started by another process (of ``build``; default: the one
        in use, identified when first needed; a checkpoint's manifest pins its VMs' build).

        :raises QemuError: the process is gone or its monitor does not answer.
        """
        if not is_running(pid, files.name):
            raise QemuError(f"{files.name}: QEMU process {pid} is not running")
        qmp = await Qmp.connect(files.qmp_socket, timeout_s, files.name)
        return cls(files, pid, qmp, build)

    def is_running(self) -> bool:
        return is_running(self.pid, self.files.name)

    async def close(self) -> None:
        """Drop the monitor connection; the VM keeps running."""
        await self._qmp.close()

    async def kill(self) -> None:
        """Kill QEMU at once (the session's state lives in checkpoints, not in it)."""
        await self._qmp.close()
        await asyncio.to_thread(kill_and_wait, self.pid, self.files.name)

    async def grow_disk(self, size_bytes: int) -> int:
        """Grow the virtual disk to ``size_bytes`` (QEMU truncates the top layer through
        its descriptor and tells the guest the new capacity); returns the size it had.
        Never shrinks: a smaller ``size_bytes`` changes nothing."""
        for block in await self._qmp.run("query-block"):
            if block.get("device") == "d0" and "inserted" in block:
                current = int(block["inserted"]["image"]["virtual-size"])
                if size_bytes > current:
                    await self._qmp.run("block_resize", device="d0", size=size_bytes)
                return current
        raise QemuError(f"{self.files.name}: disk d0 not found")

    async def active_disk(self) -> Path:
        """The qcow2 file the VM writes to now (QEMU's view is the truth)."""
        name = await self._disk_name()
        if not name.startswith(FDSET_PREFIX):
            return Path(name)
        fdset = int(name.removeprefix(FDSET_PREFIX))
        for entry in await self._qmp.run("query-fdsets"):
            if entry["fdset-id"] == fdset and entry["fds"]:
                return Path(entry["fds"][0]["opaque"])
        raise QemuError(f"{self.files.name}: the disk's fd set {fdset} is gone")

    async def _disk_name(self) -> str:
        """What QEMU opened the top layer's file as: a path, or ``/dev/fdset/N``."""
        for block in await self._qmp.run("query-block"):
            if block.get("device") == "d0" and "inserted" in block:
                name = str(block["inserted"]["file"])
                # A layer whose backing QEMU attached itself (a checkpoint's new layer) is
                # described as JSON: its file is under "file".
                if name.startswith("json:"):
                    name = str(json.loads(name.removeprefix("json:"))["file"]["filename"])
                return name
        raise QemuError(f"{self.files.name}: disk d0 not found")

    async def resume_if_paused(self) -> None:
        """Resume a VM left paused (e.g. by a process killed in the middle of a checkpoint)
        or stopped by a failed disk write (a full disk, once there is room again)."""
        if await self.status() in RESUMABLE:
            await self._qmp.run("cont")

    async def status(self) -> RunState:
        """QEMU's run state now."""
        result = await self._qmp.run("query-status")
        return RunState(result["status"])

    async def drain_console(self) -> None:
        """Move the console's ring into ``serial.log`` (capped; see :mod:`.console`)."""
        await drain_console(self._qmp, self.files)

    async def log_tail(self) -> str:
        """The tail of QEMU's log and of the console, its ring drained first."""
        with contextlib.suppress(QemuError, OSError):
            await self.drain_console()
        return self.files.log_tail()

    @property
    def describe(self) -> str:
        """Names this VM in errors."""
        return self.files.name

    async def _remove_fdset(self, name: str) -> None:
        if name.startswith(FDSET_PREFIX):
            await self._qmp.run("remove-fd", **{"fdset-id": int(name.removeprefix(FDSET_PREFIX))})

    async def _wait_incoming(self) -> None:
        """Until the state is loaded; the VM stays paused (it was launched with -S)."""

        async def loaded() -> bool | None:
            status = await self.status()
            if status not in LOADING:
                raise StateError(self.describe, status, LOADING)
            info = await self._qmp.run("query-migrate")
            if info.get("status") == "failed":
                raise QemuError(f"restore failed: {info.get('error-desc', 'unknown error')}")
            if info.get("status") == "completed" and status != RunState.INMIGRATE:
                return True
            if not self.is_running():
                raise QemuError(f"{self.files.name}: QEMU exited while restoring")
            return None

        await poll_until(
            loaded,
            timeout_s=_MIGRATE_TIMEOUT_S,
            timed_out=lambda: QemuError(f"{self.files.name}: restore did not finish in time"),
        )

    # -- checkpoint --------------------------------------------------------------------

    @require(RunState.RUNNING)
    async def checkpoint(
        self, new_overlay: Path, state_dest: Path, ram_dest: Path, ram_size: int
    ) -> CheckpointStats:
        """Freeze the running VM into files, then let it run on.

        The file this VM's RAM maps (its *base*, found in QEMU's mappings: after a
        checkpoint it is that checkpoint's) is copied to ``ram_dest`` while the VM runs
        (a reflink where the file system can; taken from the VM's directory if
        ``ramfile.prepare_copy`` made it there ahead). Then, with the VM paused: the
        current disk layer is frozen and the VM continues on ``new_overlay``; the device
        state (no RAM) is written to ``state_dest``; with QEMU's main loop frozen, the
        pages the guest wrote are copied over ``ram_dest`` and the VM's RAM is remapped
        onto ``ram_dest`` (see :mod:`.rebase`), so the next checkpoint copies only what
        changes from here.
        The VM resumes even on failure.
        :raises QemuError: QEMU's own error text plus the log tail.
        """
        started = time.perf_counter()
        try:
            base = await asyncio.to_thread(ram_mapping, self.pid, ram_size)
        except (LookupError, OSError) as error:
            raise _no_ram_access(self.files.name, error) from error
        # A deleted base (its checkpoint removed while mapped) is reachable only through
        # this mapping, which the remap ends: held open for its sum (closed by the caller).
        kept = None
        if not base.named:
            kept = await asyncio.to_thread(os.open, base.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return await self._checkpoint(base, kept, new_overlay, state_dest, ram_dest, started)
        except BaseException:
            if kept is not None:
                os.close(kept)
            raise

    async def _checkpoint(
        self, base: RamMapping, kept: int | None, new_overlay: Path, state_dest: Path,
        ram_dest: Path, started: float,
    ) -> CheckpointStats:  # fmt: skip
        await asyncio.to_thread(copy_of, base.path, ram_dest, self.files.dir)
        faults.point("checkpoint.ram-base-copied")
        # The new layer is made here and handed over open: a jailed QEMU cannot create it.
        old_name = await self._disk_name()
        await asyncio.to_thread(overlay_on_top, await self.active_disk(), new_overlay)
        faults.point("checkpoint.overlay-made")
        base_copy_ms = (time.perf_counter() - started) * 1000
        paused = time.perf_counter()
        await self._qmp.run("stop")
        faults.point("checkpoint.vm-stopped")
        try:
            try:
                with disk_fds(new_overlay) as fds:
                    name = await add_to_fdset(self._qmp, fds, str(new_overlay))
                await self._qmp.run(
                    "blockdev-snapshot-sync",
                    device="d0",
                    **{"snapshot-file": name, "format": "qcow2", "mode": "existing"},
                )
                faults.point("checkpoint.disk-switched")
            except BaseException:
                await asyncio.to_thread(new_overlay.unlink, missing_ok=True)  # not switched to
                raise
            # The frozen layer is never reopened (it has no writers): its set can go, or a
            # long-lived VM would collect two descriptors per checkpoint.
            await self._remove_fdset(old_name)
            t_state = time.perf_counter()
            await self._save_device_state(state_dest)
            device_state_ms = (time.perf_counter() - t_state) * 1000
            faults.point("checkpoint.state-saved")
            t_ram = time.perf_counter()
            ranges: list[tuple[int, int]] = []
            async with self._ram_for_qemu(ram_dest) as qemu_fd:
                written, used = await asyncio.to_thread(
                    copy_and_rebase, self.pid, base, ram_dest, qemu_fd, ranges
                )
            written_ms = (time.perf_counter() - t_ram) * 1000
            faults.point("checkpoint.pages-copied")
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):  # found by the fault campaign
                raise InternalError(
                    f"{self.files.name}: checkpoint failed, the disk is full ({error})"
                ) from error
            raise _no_ram_access(self.files.name, error) from error
        except QemuError as error:
            raise QemuError(error.message, log_tail=await self.log_tail()) from error
        finally:
            with contextlib.suppress(QemuError):
                await self._qmp.run("cont")
        pause_ms = (time.perf_counter() - paused) * 1000
        if used is not None:
            read_ahead(ram_dest, used)
        ram_bytes, state_bytes = await asyncio.to_thread(_seal, ram_dest, state_dest)
        return CheckpointStats(
            pause_ms=pause_ms,
            base_copy_ms=base_copy_ms,
            device_state_ms=device_state_ms,
            written_ms=written_ms,
            written_bytes=written,
            ram_bytes=ram_bytes,
            state_bytes=state_bytes,
            rebased=used is not None,
            written_ranges=tuple(ranges),
            ram_base=base.path if kept is None else Path(f"/proc/self/fd/{kept}"),
            ram_base_fd=kept,
        )

    @contextlib.asynccontextmanager
    async def _ram_for_qemu(self, ram: Path) -> AsyncIterator[int | None]:
        """``ram`` opened inside QEMU (its descriptor number there) for the remap, closed
        there afterwards; None where the remap cannot be done."""
        if not rebase_supported():
            yield None
            return
        fd = await asyncio.to_thread(os.open, ram, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._qmp.send_fd(fd)
            added = await self._qmp.run("add-fd", opaque=f"ram {ram}")
        finally:
            os.close(fd)
        try:
            yield int(added["fd"])
        finally:
            await self._qmp.run("remove-fd", **{"fdset-id": int(added["fdset-id"])})

    async def _save_device_state(self, dest: Path) -> None:
        # Despite its name this is QEMU's generic "every device but RAM" save. live=false:
        # live=true would also hand the disks over to a migration target that is not there.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fd = await asyncio.to_thread(os.open, dest, flags, 0o444)
        try:
            name = await add_to_fdset(self._qmp, (fd,), str(dest))
        finally:
            os.close(fd)
        try:
            await self._qmp.run("xen-save-devices-state", filename=name, live=False)
            await self._remove_fdset(name)
        except QemuError as error:
            reason = error.message.rpartition("failed: ")[2]
            raise QemuError(f"{self.files.name}: saving device state failed: {reason}") from error

    @require(RunState.RUNNING)
    async def save_state(self, dest: Path) -> float:
        """Pause, migrate the whole VM state into ``dest``, resume; returns milliseconds.

        Unlike :meth:`checkpoint` this freezes no disk layer and all of RAM goes through
        migration (the naive full-RAM baseline).
        :raises QemuError: QEMU's own error text plus the log tail.
        """
        # QEMU's default bandwidth cap (128 MiB/s) must not slow the baseline down.
        await self._qmp.run("migrate-set-parameters", **{"max-bandwidth": _MAX_BANDWIDTH})
        started = time.perf_counter()
        await self._qmp.run("stop")
        try:
            await self._migrate_to(dest)
        except QemuError as error:
            raise QemuError(error.message, log_tail=await self.log_tail()) from error
        finally:
            with contextlib.suppress(QemuError):
                await self._qmp.run("cont")
        return (time.perf_counter() - started) * 1000

    async def _migrate_to(self, dest: Path) -> None:
        async with state_file_uri(self._qmp, self.build, dest, write=True, fd_name="ckpt") as uri:
            await self._qmp.run("migrate", uri=uri)
            await self._wait_saved()

    async def _wait_saved(self) -> None:
        deadline = time.monotonic() + _MIGRATE_TIMEOUT_S
        while True:
            info = await self._qmp.run("query-migrate")
            status = info.get("status")
            if status == "completed":
                return
            if status in ("failed", "cancelled"):
                desc = info.get("error-desc", "no error description")
                raise QemuError(f"{self.files.name}: saving the VM state failed: {desc}")
            if time.monotonic() > deadline:
                await self._qmp.run("migrate_cancel")
                raise QemuError(f"{self.files.name}: saving the VM state timed out")
            await asyncio.sleep(0.001)


@contextlib.contextmanager
def _listening(path: Path, wanted: bool) -> Iterator[int | None]:
    """A unix socket listening at ``path`` for QEMU to inherit (None if not ``wanted``);
    closed here once QEMU has its copy."""
    if not wanted:
        yield None
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        yield listener.fileno()


def _start_failed(files: VmFiles, pid: int, error: QemuError) -> QemuError:
    """Kill a QEMU that failed to come up; the error says how it ended and what it logged."""
    status = exit_status(pid)
    kill_and_wait(pid, files.name)
    return QemuError(
        f"{files.name}: QEMU did not start ({status}): {error.message}",
        log_tail=files.log_tail(),
    )


def _fresh_files(files: VmFiles) -> None:
    """The VM's directory, without the sockets and pidfile of a VM before it."""
    files.ensure()
    for path in (files.qmp_socket, files.agent_socket, files.net_socket, files.pidfile):
        path.unlink(missing_ok=True)


def _no_ram_access(name: str, error: Exception) -> QemuError:
    return QemuError(
        f"{name}: cannot read guest RAM ({error}); forkpoint needs ptrace access to QEMU: "
        "run as root or with kernel.yama.ptrace_scope=0"
    )


def _seal(ram: Path, state: Path) -> tuple[int, int]:
    """A checkpoint's RAM and device-state files made read-only; their sizes on disk."""
    state.chmod(0o444)
    ram.chmod(0o444)
    return allocated_bytes(ram), state.stat().st_size
