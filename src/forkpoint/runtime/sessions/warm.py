"""Warm VMs: restores done ahead of a create, so a create pays no QEMU start-up or load.

QEMU's start-up (≈ 35 ms of CPU: exec, 51 libraries, relocating an 18 MB binary) is the
floor of every restore and more than half of a create; loading the device state is
another ≈ 10 ms. A warm VM is a restore done ahead, paused: QEMU started
as a create's restore starts it (``-incoming defer``, mapping the template's RAM file, on
a new disk layer of its own, in its own cgroup, as its own uid, its egress rules
installed for the default policy), passt connected and forwarding host ports reserved
for it, the state loaded, the guest run once through a first command (``_warm_up``: under
TCG the create's first command then finds its code translated) and paused — for a
session id minted ahead: its directory, ``-name``, uid, cgroup and host ports are already
the session's. A create that takes one only records it, runs it and hands the guest its
identity (see ``machines.start_restored``).

Kept: ``FORKPOINT_WARM_VMS`` per (template, machine shape with its QEMU build, network,
forwarded guest ports) that creates used, refilled after each create by whoever made it
(the server in the background, the CLI once it printed its result). Paused, a warm VM
costs no CPU and ≈ 41 MiB (QEMU 21, passt 19). A warm VM never serves a key it was not
started for: the key names the template checkpoint, the shape (memory, vCPUs,
accelerator, QEMU binary digest, argv layout), the network and the forwarded guest
ports. Its rows leave the store in the transaction that hands them out
(``store/warm.py``); one whose QEMU or passt died is discarded when met. Removing a
template's checkpoint or image drains its warm VMs first.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from forkpoint.agent_client import AgentClient
from forkpoint.config import Home
from forkpoint.egress import EgressPolicy
from forkpoint.errors import ForkpointError
from forkpoint.images import Image
from forkpoint.models import Network
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles
from forkpoint.runtime.sessions.cleanup import kill_vm_processes, remove_session_files
from forkpoint.runtime.sessions.egress import install_filter
from forkpoint.runtime.sessions.limits import prepare_cgroup
from forkpoint.runtime.sessions.machines import boot_files, new_layer_name
from forkpoint.runtime.sessions.ports import choosing_ports
from forkpoint.store import CheckpointRecord, Store, utc_now
from forkpoint.store.warm import WarmRecord, WarmStore
from forkpoint.vm import Machine, MachineShape, VmFiles, qemu_build
from forkpoint.vm.disk import overlay_from_blank
from forkpoint.vm.jail import Jail
from forkpoint.vm.net import passt_ready, start_passt
from forkpoint.vm.process import is_running

__all__ = ["WarmPool", "WarmTarget", "vm_files"]

_ABANDONED_S = 60.0
_WARM_UP_S = 30.0


def vm_files(home: Home, session_id: str) -> VmFiles:
    """A session's VM files (the same as ``Runtime.files``)."""
    return VmFiles(home.sessions / session_id, f"forkpoint-{session_id}")


@dataclass(frozen=True)
class WarmTarget:
    """What warm VMs are started for: creates of ``template`` on ``shape`` with ``network``."""

    template: CheckpointRecord
    image: Image
    shape: MachineShape
    network: Network
    guest_ports: tuple[int, ...] = ()  # forwarded to host ports reserved ahead

    @property
    def key(self) -> str:
        ports = ",".join(map(str, sorted(set(self.guest_ports))))
        return f"{self.template.id}:{self.shape.key}:{self.network.value}:{ports}"


class WarmPool:
    """The warm VMs of one home."""

    def __init__(self, home: Home, store: Store) -> None:
        self.home = home
        self.rows = WarmStore(store)
        self._filling = asyncio.Lock()  # one fill at a time per process: no overshoot

    def take(self, target: WarmTarget) -> WarmRecord | None:
        """A live warm VM for ``target``, out of the pool (None: none is ready)."""
        while (record := self.rows.take(target.key)) is not None:
            name = vm_files(self.home, record.id).name
            if all(is_running(pid, name) for pid in record.pids):
                return record
            self._discard_files(record)  # its QEMU or passt died
        return None

    def drain_stale(self, checkpoints: set[str]) -> int:
        """Discard warm VMs of checkpoints not in ``checkpoints`` (a removal killed before
        it drained them); returns how many."""
        stale = {r.checkpoint_id for r in self.rows.all()} - checkpoints
        return sum(self.drain(checkpoint_id) for checkpoint_id in stale)

    def count(self, target: WarmTarget) -> int:
        return sum(1 for r in self.rows.all() if r.key == target.key)

    async def fill(self, target: WarmTarget, size: int) -> int:
        """Start warm VMs for ``target`` until it has ``size``; returns how many started.
        A failed start is dropped whole (nothing of it stays) and ends the fill."""
        started = 0
        async with self._filling:
            await asyncio.to_thread(self._drop_abandoned)
            while self.count(target) < size:
                try:
                    await self._start(target)
                except ForkpointError:
                    break
                started += 1
        return started

    def discard(self, record: WarmRecord) -> None:
        """Kill a warm VM taken out of the pool and remove everything of it."""
        self._discard_files(record)

    def drain(self, checkpoint_id: str | None = None) -> int:
        """Kill and remove the warm VMs of ``checkpoint_id`` (None: all); returns how many."""
        drained = 0
        for record in self.rows.all():
            if checkpoint_id is None or record.checkpoint_id == checkpoint_id:
                self.rows.remove(record.id)
                self._discard_files(record)
                drained += 1
        return drained

    async def _start(self, target: WarmTarget) -> None:
        layer = new_layer_name()
        record = await asyncio.to_thread(self._reserve, target, layer)
        files = vm_files(self.home, record.id)
        jail = Jail(record.uid)
        passt_pid: int | None = None
        try:
            layers = self.home.layers
            await asyncio.to_thread(
                overlay_from_blank, layers / target.template.disk_layer, layers / layer
            )
            cgroup = await asyncio.to_thread(prepare_cgroup, self.home, record.id, target.shape)
            network = target.network == Network.USER
            if network:  # the default policy; a create asking for another installs its own
                await asyncio.to_thread(install_filter, jail, EgressPolicy())
            checkpoint = CheckpointFiles.of(self.home, target.template.id)
            machine = await Machine.launch(
                qemu_build(), target.shape, boot_files(target.image, target.shape), files,
                layers / layer, jail=jail, network=network, incoming=True, cgroup=cgroup,
                ram=checkpoint.ram,
            )  # fmt: skip
            try:
                if network:  # connected before the load, as for every restore

                    async def connect() -> None:
                        nonlocal passt_pid
                        passt_pid = await asyncio.to_thread(
                            start_passt, files, record.forwards, jail
                        )
                        await asyncio.to_thread(cgroup.attach, passt_pid)

                    await machine.attach_network(connect)
                await machine.restore(checkpoint.state, run=False)
                await _warm_up(machine, files)
            finally:
                await machine.close()
            if passt_pid is not None:
                await passt_ready(files, passt_pid)
            await asyncio.to_thread(self.rows.set_started, record.id, machine.pid, passt_pid)
        except BaseException:
            self.rows.remove(record.id)
            self._discard_files(record)  # its passt too: found by its command line
            raise

    def _reserve(self, target: WarmTarget, layer: str) -> WarmRecord:
        """Its row, with a free host port for each forwarded guest port (no session can
        take them: the store counts them as allocated; see ``HostPorts``)."""
        with choosing_ports(self.home, self.rows.store) as pick:
            forwards = tuple((pick(), guest) for guest in sorted(set(target.guest_ports)))
            return self.rows.reserve(target.template.id, target.key, layer, forwards)

    def _drop_abandoned(self) -> None:
        """Rows a filler reserved but never gave a QEMU (it was killed): they would count
        as warm VMs forever. A start takes well under a second; a minute is abandoned."""
        cutoff = utc_now(_ABANDONED_S)
        for record in self.rows.all():
            if record.qemu_pid is None and record.created_at < cutoff:
                self.rows.remove(record.id)
                self._discard_files(record)

    def _discard_files(self, record: WarmRecord) -> None:
        files = vm_files(self.home, record.id)
        kill_vm_processes(files, record.qemu_pid, record.aux_pids)
        remove_session_files(files)
        with contextlib.suppress(OSError):
            (self.home.layers / record.disk_layer).unlink()


async def _warm_up(machine: Machine, files: VmFiles) -> None:
    """Run the guest once through what a create's first command does — the agent's
    handshake, a shell, a login shell as ``user`` started as E2B's commands are — then
    pause it again.

    Under TCG a restored VM's first command pays for translating that guest code (the
    agent's first answer took ≈ 200 ms, a first ``bash -l`` 190 ms); QEMU keeps its
    translations while paused, so the create that takes this VM does not. Its identity
    (clock, RNG seed, hostname) is still handed over when the create runs it.
    """
    await machine.run()
    try:
        async with await AgentClient.connect(files.agent_socket, timeout=_WARM_UP_S) as agent:
            await agent.hello()
            await agent.exec(["/bin/sh", "-c", "true"], timeout=_WARM_UP_S)
            with contextlib.suppress(ForkpointError):  # an image without bash or `user`
                # E2B's path: a process the agent owns, streamed (twice: the second run
                # finds what the first one's page faults and caches left behind).
                for _ in range(2):
                    started = await agent.start_process(
                        ["/bin/bash", "-l", "-c", "true"], user="user", timeout=_WARM_UP_S
                    )
                    await started.started()
                    while await started.next() is not None:
                        pass
                    started.end()
    finally:
        await machine.pause()
