"""Starting a session's VM from a checkpoint, and the guest identity it wakes up with.

Shared by create (from the image template), fork and rollback: the only difference is
which session id and host ports the restored VM gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from forkpoint import faults
from forkpoint.agent_client import confirm_restore, fresh_identity, post_identity
from forkpoint.config import Home
from forkpoint.egress import EgressPolicy
from forkpoint.errors import ForkpointError, QemuError
from forkpoint.images import Image
from forkpoint.models import JAIL_UID_BASE, CheckpointKind, Network
from forkpoint.protocol import RestoreFacts, RestoreIdentityArgs, RestoreStatus
from forkpoint.runtime.capacity import host_limits
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles
from forkpoint.runtime.sessions.cleanup import kill_vm_processes
from forkpoint.runtime.sessions.egress import install_filter
from forkpoint.runtime.sessions.limits import prepare_cgroup, report_not_enforced
from forkpoint.store import CheckpointRecord, SessionRecord
from forkpoint.store.standby import StandbyRecord
from forkpoint.store.warm import WarmRecord
from forkpoint.vm import (
    BootFiles,
    Machine,
    MachineShape,
    VmFiles,
    guest_cmdline,
    host_tsc_khz,
    qemu_build,
)
from forkpoint.vm.disk import overlay_from_blank
from forkpoint.vm.jail import Jail
from forkpoint.vm.net import passt_ready, start_passt, stop_passt
from forkpoint.vm.process import is_running
from forkpoint.vm.volume_mounts import VolumeServer

__all__ = [
    "AGENT_READY_TIMEOUT_S",
    "SESSIONLESS",
    "RestoreSpec",
    "ResumeTogether",
    "Started",
    "boot_files",
    "guest_hostname",
    "has_restore_listeners",
    "identity_token",
    "jail_of",
    "new_layer_name",
    "restore_facts",
    "start_restored",
]

AGENT_READY_TIMEOUT_S = 60.0  # a loaded 2-core TCG host can take this long

_log = logging.getLogger(__name__)


class ResumeTogether:
    """Lets several restores load their VMs, then run them all at once.

    A restored guest first re-translates its code under TCG, a burst of CPU that would
    slow the restores still starting; so forks resume together once all are loaded.
    """

    def __init__(self, count: int) -> None:
        self._loading = count
        self._all_loaded = asyncio.Event()

    def _done(self) -> None:
        self._loading -= 1
        if self._loading <= 0:
            self._all_loaded.set()

    @contextlib.asynccontextmanager
    async def member(self) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        """One restore's ``loaded`` callback; leaving counts as loaded (e.g. it failed)."""
        counted = False

        async def loaded() -> None:
            nonlocal counted
            if not counted:
                counted = True
                self._done()
            await self._all_loaded.wait()

        try:
            yield loaded
        finally:
            if not counted:
                self._done()


def identity_token(session_id: str, generation: int) -> str:
    """Names one restore of a session: the guest applies each identity once."""
    return f"{session_id}:{generation}"


def has_restore_listeners(checkpoint: CheckpointRecord) -> bool:
    """Whether the guest had processes or hooks to tell of a restore when ``checkpoint``
    was taken (``Manifest.restore_listeners``)."""
    return checkpoint.manifest.get("restore_listeners") is True


def restore_facts(session_id: str, generation: int, checkpoint: CheckpointRecord) -> RestoreFacts:
    """What restoring ``checkpoint`` as ``session_id``'s ``generation`` is to the guest's
    processes: a session's first VM is a create (from an image's template) or a fork, a
    later one a resume (of its pause checkpoint) or a rollback."""
    if generation == 0:
        event = "create" if checkpoint.kind == CheckpointKind.TEMPLATE else "fork"
    else:
        event = "resume" if checkpoint.kind == CheckpointKind.PAUSE else "rollback"
    hook_timeout = float(host_limits().restore_hook_timeout_s)
    return RestoreFacts(event, session_id, checkpoint.id, hook_timeout)


# VMs that belong to no stored session: template and image builds.
SESSIONLESS = Jail(JAIL_UID_BASE)


def jail_of(record: SessionRecord) -> Jail:
    """Who the session's QEMU and passt run as (its own uid; see :mod:`forkpoint.vm.jail`)."""
    return Jail(record.uid or SESSIONLESS.uid)  # every stored session has a uid


def new_layer_name() -> str:
    return f"{uuid.uuid4().hex[:16]}.qcow2"


def boot_files(image: Image, shape: MachineShape) -> BootFiles:
    """The image's kernel and initramfs with the command line for this machine."""
    return BootFiles(image.kernel, image.initrd, guest_cmdline(shape.accel, host_tsc_khz()))


def guest_hostname(name: str | None, session_id: str) -> str:
    """The guest's hostname for a session: its name as one DNS label (a name may hold
    ``_`` or ``..``, which a hostname may not), else its id."""
    label = re.sub(r"[^A-Za-z0-9-]+", "-", name or "").strip("-")[:63].rstrip("-")
    return label or session_id


@dataclass(frozen=True)
class RestoreSpec:
    """What :func:`start_restored` makes: which checkpoint becomes which VM.

    ``forwards`` are ``(host_port, guest_port)`` pairs; ``token`` names this restore (see
    :func:`identity_token`), ``hostname`` is the guest's new one and ``facts`` what the
    restore is to its processes (``wait_for_guest``: its checkpoint had restore listeners,
    see :func:`has_restore_listeners`); ``jail`` says which uid its QEMU and passt run as,
    ``egress`` where its guest may connect.
    """

    files: VmFiles
    checkpoint: CheckpointFiles
    checkpoint_layer: str
    shape: MachineShape
    boot: BootFiles
    network: Network
    forwards: tuple[tuple[int, int], ...]
    hostname: str
    token: str
    facts: RestoreFacts
    jail: Jail
    egress: EgressPolicy = EgressPolicy()
    wait_for_guest: bool = False
    #: ``(volume id, guest path)``: the volume mounts its guest gets or keeps.
    volumes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Started:
    """A restored VM: its QEMU, its network helper pid and its fresh top disk layer;
    ``guest``: what the guest told its processes, when the restore waited for that (its
    checkpoint had listeners: see :func:`start_restored`)."""

    machine: Machine
    passt_pid: int | None
    disk_layer: str
    guest: RestoreStatus | None = None
    volume_server_pid: int | None = None

    @property
    def aux_pids(self) -> list[int]:
        return [pid for pid in (self.passt_pid, self.volume_server_pid) if pid]


async def start_restored(
    home: Home,
    spec: RestoreSpec,
    loaded: Callable[[], Awaitable[None]] | None = None,
    *,
    warm: WarmRecord | None = None,
    standby: StandbyRecord | None = None,
) -> Started:
    """Restore ``spec.checkpoint`` as a running VM with the identity ``spec`` gives it.

    The VM gets a new top layer on the checkpoint's frozen one and maps the checkpoint's
    RAM file copy-on-write (nothing is copied). On return the VM runs and its new
    identity (clock, RNG seed, hostname) sits in the guest agent's receive buffer: the
    guest applies it as soon as it gets to run, and every later agent connection makes
    sure it has (see :func:`~forkpoint.agent_client.post_identity`). When the checkpoint
    had restore listeners (processes registered to be told, or hooks: see
    ``guest/restore.py``) the return waits until the guest has applied it, signalled them
    and run its hooks — what a caller does next meets processes that know; a guest that
    does not answer is logged, never fails the restore.
    ``loaded`` is awaited between loading the VM and letting it run. ``warm``: a VM
    already started and loaded for this session, on its own layer (see :mod:`.warm`).
    ``standby``: a QEMU already started for this restore, on its own layer, waiting for
    the state (see :mod:`.standby`); the VM it replaces must be gone.
    """
    files = spec.files
    files.ensure()
    network = spec.network == Network.USER
    machine: Machine | None = None
    ahead = warm or standby
    layer = ahead.disk_layer if ahead else new_layer_name()
    filtering: asyncio.Future[None] | None = None
    passt_pid = None
    volume_server: VolumeServer | None = None
    passt_placed: asyncio.Future[None] | None = None
    try:
        if warm is not None:
            machine = await _adopt_warm(home, files, warm)
        elif standby is not None:
            machine = await _adopt_standby(home, files, standby)
        if ahead is not None and machine is None:  # it died: restored cold in its place
            warm, standby, ahead, layer = None, None, None, new_layer_name()
        # The session's cgroup (made once, reused by rollbacks and warm VMs; named by the
        # session id, its directory's name) is prepared while the new disk layer is copied.
        _, cgroup = await asyncio.gather(
            asyncio.to_thread(
                overlay_from_blank, home.layers / spec.checkpoint_layer, home.layers / layer
            )
            if ahead is None
            else asyncio.sleep(0),
            asyncio.to_thread(prepare_cgroup, home, files.dir.name, spec.shape),
        )
        faults.point("restore.layer-made")
        prepared = set(cgroup.not_enforced)
        if spec.volumes:  # its start-up overlaps the restore; it connects once the VM runs
            volume_server = await asyncio.to_thread(
                VolumeServer.spawn, files, home.volumes, spec.volumes
            )
            # Its CPU is the guest's doing: counted with the VM's, like passt's.
            await asyncio.to_thread(cgroup.attach, volume_server.pid)
        # Installed while QEMU starts; the guest runs only once it is (no unfiltered packet
        # ever leaves: until then the VM is paused). A warm VM's uid got the default
        # policy's rules when it started (see .warm): installing them again would put
        # `nft`'s 20 ms on the path the warm VM exists to shorten. A standby's start
        # installed the session's own.
        if network and standby is None and not (warm and spec.egress == EgressPolicy()):
            filtering = asyncio.ensure_future(
                asyncio.to_thread(install_filter, spec.jail, spec.egress)
            )
        if machine is None:
            machine = await Machine.launch(
                qemu_build(), spec.shape, spec.boot, files, home.layers / layer,
                jail=spec.jail, ram=spec.checkpoint.ram, network=network, incoming=True,
                cgroup=cgroup,
            )  # fmt: skip
            faults.point("restore.qemu-started")
        if warm is None:
            if network:  # connected before the VM runs; learns the MAC from QEMU's announcement

                async def connect() -> None:
                    nonlocal passt_pid, passt_placed
                    passt_pid = await asyncio.to_thread(
                        start_passt, files, list(spec.forwards), spec.jail
                    )
                    faults.point("restore.passt-started")
                    # Moved while the state loads (a cgroup move can take milliseconds).
                    passt_placed = asyncio.ensure_future(
                        asyncio.to_thread(cgroup.attach, passt_pid)
                    )

                await machine.attach_network(connect)
            await machine.restore(spec.checkpoint.state, run=False)
        else:  # loaded already, its passt connected and forwarding the session's ports
            passt_pid = warm.passt_pid
        assert machine is not None
        faults.point("restore.state-loaded")
        if passt_placed is not None:
            await passt_placed  # QEMU and passt are both in the cgroup before the VM runs
        if set(cgroup.not_enforced) != prepared:  # a move was refused: say so, once
            await asyncio.to_thread(report_not_enforced, home, cgroup.not_enforced)
        if filtering is not None:
            await filtering
        starting = passt_pid if warm is None else None  # a passt started with this restore
        if loaded is not None:
            # A fan-out's guests wake together and starve the passts still starting (fork
            # x100: the last ready 6 s after its guest ran): each waits for its own first.
            if starting is not None:
                await passt_ready(files, starting)
                starting = None
            await loaded()
        await machine.run()
        faults.point("restore.running")
        identity = fresh_identity(spec.token, spec.hostname, spec.facts)
        guest = None
        if spec.wait_for_guest:
            guest = await _tell_guest(files, identity)
        else:
            await post_identity(files.agent_socket, identity)
        if starting is not None:  # last: its start-up overlaps the load
            await passt_ready(files, starting)
        if volume_server is not None:
            await asyncio.to_thread(volume_server.serve)
    except BaseException:
        # Nothing of a failed restore may linger: not the VM, its network, or its layer.
        if filtering is not None:  # its rules stay: harmless, replaced by the next install
            await asyncio.gather(filtering, return_exceptions=True)
        if machine is not None:
            await machine.kill()
        await asyncio.to_thread(stop_passt, files, passt_pid)
        if volume_server is not None:
            await asyncio.to_thread(volume_server.abandon)
        (home.layers / layer).unlink(missing_ok=True)
        raise
    return Started(machine, passt_pid, layer, guest, volume_server.pid if volume_server else None)


async def _tell_guest(files: VmFiles, identity: RestoreIdentityArgs) -> RestoreStatus | None:
    """Hand the guest its identity and wait until it has told its processes and its
    hooks have run (each is bounded by the restore's hook time limit)."""
    assert identity.restore is not None
    try:
        return await confirm_restore(
            files.agent_socket, identity, AGENT_READY_TIMEOUT_S, identity.restore.hook_timeout_s
        )
    except ForkpointError as error:
        _log.warning("forkpoint: %s did not confirm its restore: %s", files.name, error.message)
        return None


async def _adopt_warm(home: Home, files: VmFiles, warm: WarmRecord) -> Machine | None:
    """The warm VM's QEMU; None if it or its passt died since the pool checked them (then
    nothing of it is left: its passt held the session's host ports)."""
    assert warm.qemu_pid is not None  # WarmStore.take hands out started ones only
    if warm.passt_pid is None or is_running(warm.passt_pid, files.name):
        with contextlib.suppress(QemuError):
            return await Machine.adopt(files, warm.qemu_pid, build=qemu_build())
    await asyncio.to_thread(kill_vm_processes, files, warm.qemu_pid, warm.aux_pids)
    (home.layers / warm.disk_layer).unlink(missing_ok=True)
    return None


async def _adopt_standby(home: Home, files: VmFiles, standby: StandbyRecord) -> Machine | None:
    """The standby's QEMU, its sockets moved into the session's places; None if it died
    since it was taken (then nothing of it is left)."""
    assert standby.qemu_pid is not None  # Standbys.take hands out started ones only
    own = files.standby(standby.tag)
    await asyncio.to_thread(own.move_into, files)
    with contextlib.suppress(QemuError):
        return await Machine.adopt(files, standby.qemu_pid, build=qemu_build())
    await asyncio.to_thread(kill_vm_processes, files, standby.qemu_pid)
    (home.layers / standby.disk_layer).unlink(missing_ok=True)
    return None
