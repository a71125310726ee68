"""What forkpoint is compared with, measured on the same host in the same run.

- ``cold_boot_create``: a session-equivalent VM booted from the kernel until its agent
  answers (what creating a session costs without a template).
- ``full_ram_checkpoint`` / ``full_ram_restore``: the straightforward implementation —
  guest RAM is private memory, so migration streams *all* of it into the state file and
  back out of it on restore.
- ``qemu_start_floor``: QEMU process start until its monitor answers (no guest code).
- ``ram_copy_floor``: a sparse copy of a checkpoint's RAM file (a plain copy of the memory
  a VM uses; forkpoint's restores map it copy-on-write instead, its checkpoints copy it).

Every VM here lives under a scratch directory the caller owns and deletes; none of them
is a session in the store.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from forkpoint.agent_client import AgentClient
from forkpoint.images import Image
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles
from forkpoint.runtime.sessions.machines import SESSIONLESS
from forkpoint.vm import (
    BootFiles,
    Machine,
    MachineShape,
    QemuBuild,
    VmFiles,
    create_overlay,
    sparse_copy,
)
from forkpoint.vm.process import kill_and_wait, pids_with_arg

__all__ = ["Baselines"]

_COLD_BOOT_TIMEOUT_S = 120.0
_RESTORE_AGENT_TIMEOUT_S = 60.0


class Baselines:
    """Runs baseline measurements; each returns samples in milliseconds.

    ``scratch`` must be on the same filesystem as the checkpoints (a fair RAM copy) and is
    the caller's to delete; VMs started here are killed before each method returns.
    """

    def __init__(
        self,
        build: QemuBuild,
        shape: MachineShape,
        boot: BootFiles,
        image: Image,
        scratch: Path,
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.build = build
        self.shape = shape
        self.boot = boot
        self.image = image
        self.scratch = scratch
        self.log = log
        self._token = uuid.uuid4().hex[:8]
        self._count = 0
        self.full_ram_state_bytes = 0

    def _files(self) -> VmFiles:
        self._count += 1
        directory = self.scratch / f"vm-{self._count}"
        return VmFiles(directory, f"forkpoint-bench-{self._token}-{self._count}").ensure()

    def kill_strays(self) -> int:
        """Kill QEMUs of this run that outlived their method (a start interrupted by
        Ctrl-C is not killed by ``Machine.start``); returns how many. They are found by
        this run's unique token in their ``-name``."""
        marker = f"forkpoint-bench-{self._token}-"
        strays = pids_with_arg(lambda arg: arg.startswith(marker))
        for pid, name in strays:
            kill_and_wait(pid, name)
        return len(strays)

    @staticmethod
    def _discard(files: VmFiles) -> None:
        shutil.rmtree(files.dir, ignore_errors=True)
        shutil.rmtree(files.sock_dir, ignore_errors=True)

    async def _start(
        self, files: VmFiles, disk: Path, *, ram: Path | None = None, state: Path | None = None
    ) -> tuple[Machine, float]:
        """``Machine.start``; returns the machine and the ``perf_counter()`` it began at."""
        began = time.perf_counter()
        machine = await Machine.start(
            self.build, self.shape, self.boot, files, disk, ram=ram, state=state, jail=SESSIONLESS
        )
        return machine, began

    async def cold_boot_create(self, reps: int) -> list[float]:
        """Overlay on the image's root disk + empty RAM file + boot until the agent answers."""
        samples = []
        for i in range(reps):
            files = self._files()
            started = time.perf_counter()
            disk = files.dir / "disk.qcow2"
            await asyncio.to_thread(create_overlay, self.image.rootfs, disk)
            prepared_s = time.perf_counter() - started
            machine, began = await self._start(files, disk)  # makes the empty RAM file
            try:
                await _agent_hello(files, _COLD_BOOT_TIMEOUT_S)
                samples.append((prepared_s + time.perf_counter() - began) * 1000)
            finally:
                await machine.kill()
                await asyncio.to_thread(self._discard, files)
            self.log(f"cold boot {i + 1}/{reps}: {samples[-1]:.0f} ms")
        return samples

    async def qemu_start_floor(self, reps: int) -> list[float]:
        """QEMU exec until QMP is ready, started as for a restore (no state loaded)."""
        samples = []
        for _ in range(reps):
            files = self._files()
            disk = files.dir / "disk.qcow2"
            await asyncio.to_thread(create_overlay, self.image.rootfs, disk)
            began = time.perf_counter()
            machine = await Machine.launch(
                self.build, self.shape, self.boot, files, disk,
                jail=SESSIONLESS, network=False, incoming=True,
            )  # fmt: skip
            samples.append((time.perf_counter() - began) * 1000)
            await machine.kill()
            await asyncio.to_thread(self._discard, files)
        return samples

    async def ram_copy_floor(self, checkpoint: CheckpointFiles, reps: int) -> list[float]:
        """A sparse copy of the checkpoint's RAM file (a plain copy of the memory in use)."""
        samples = []
        dest = self.scratch / "ram-copy"
        for _ in range(reps):
            await asyncio.to_thread(dest.unlink, missing_ok=True)
            started = time.perf_counter()
            await asyncio.to_thread(sparse_copy, checkpoint.ram, dest)
            samples.append((time.perf_counter() - started) * 1000)
            await asyncio.to_thread(dest.unlink, missing_ok=True)
        return samples

    async def full_ram(
        self, checkpoint: CheckpointFiles, disk_layer: Path, reps: int
    ) -> tuple[list[float], list[float]]:
        """``(checkpoint samples, restore samples)`` of the naive full-RAM design.

        ``disk_layer`` is the checkpoint's frozen disk layer (only used as a backing file).
        The guest state of ``checkpoint`` (e.g. a running web server) is restored into a
        VM whose RAM is private memory. Then, ``reps`` times: save it through migration
        (all of RAM goes into the state file), kill it, and restore that file into a
        fresh private-RAM VM, timed until it runs (as forkpoint's operations are) — the
        naive design's steady state of checkpoint, restore, checkpoint (each VM migrates
        out only once).
        """
        files = self._files()
        disk = files.dir / "disk.qcow2"
        await asyncio.to_thread(create_overlay, disk_layer, disk)
        machine, _ = await self._start(files, disk, ram=checkpoint.ram, state=checkpoint.state)
        saves: list[float] = []
        restores: list[float] = []
        try:
            await _agent_hello(files, _RESTORE_AGENT_TIMEOUT_S)
            for _ in range(reps):
                state = self.scratch / "full-ram.state"
                await asyncio.to_thread(state.unlink, missing_ok=True)
                saves.append(await machine.save_state(state))
                self.full_ram_state_bytes = (await asyncio.to_thread(state.stat)).st_size
                await machine.kill()
                await asyncio.to_thread(self._discard, files)
                files = self._files()
                disk = files.dir / "disk.qcow2"
                await asyncio.to_thread(create_overlay, disk_layer, disk)
                machine, began = await self._start(files, disk, state=state)
                # Until the VM runs: the same end point as forkpoint's operations.
                restores.append((time.perf_counter() - began) * 1000)
                await _agent_hello(files, _RESTORE_AGENT_TIMEOUT_S)  # sane before next save
                await asyncio.to_thread(state.unlink)
        finally:
            await machine.kill()
            await asyncio.to_thread(self._discard, files)
        return saves, restores


async def _agent_hello(files: VmFiles, timeout_s: float) -> None:
    agent = await AgentClient.connect(files.agent_socket, timeout=timeout_s)
    async with agent:
        await agent.hello()
