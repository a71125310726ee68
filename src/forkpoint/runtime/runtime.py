"""The runtime: sessions, checkpoints, forks, rollback, ports and garbage collection.

The only module that combines the VM engine, the agent client, images and the store;
:class:`Runtime` is its one façade, and each of its parts lives in a module of its own
(see ``docs/architecture.md``). The store is the truth; every operation that changes a
session holds that session's inter-process lock, so two CLIs and a server can work side
by side. QEMU processes outlive the process that started them and are re-adopted through
the pid kept in the store.

The query methods (``get``, ``list_*``, ``gc``) block (SQLite, /proc): async callers run
them with ``asyncio.to_thread``. The ``async`` methods never block the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from forkpoint import faults
from forkpoint.agent_client import AgentClient, OutputCallback, fresh_identity
from forkpoint.agent_client.tunnel import TunnelReader, TunnelWriter
from forkpoint.config import ApiLimits, Home, home
from forkpoint.errors import (
    AgentError,
    Conflict,
    ForkpointError,
    InternalError,
    LimitExceeded,
    NotFound,
    Unsatisfiable,
)
from forkpoint.images import Image, get_image
from forkpoint.models import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    BackgroundProcess,
    Checkpoint,
    CheckpointKind,
    CommandResult,
    Expiry,
    FileEntry,
    FileStat,
    HistoryStep,
    Network,
    OutputEncoding,
    Port,
    Process,
    ProcessEvent,
    Session,
    SessionState,
    StateDiff,
    TrackedProcess,
)
from forkpoint.store import (
    KEEP,
    CheckpointRecord,
    Keep,
    SessionRecord,
    Store,
    global_lock_async,
    session_lock_async,
    validate_name,
)
from forkpoint.store.warm import WarmRecord
from forkpoint.vm import Machine, MachineShape, QemuBuild, detect_accel, qemu_build
from forkpoint.vm.egress import EgressPolicy
from forkpoint.vm.process import is_running

from . import processes
from .admission import UNLIMITED, Admission
from .agents import AgentPool
from .capacity import SESSION_BYTES, checkpoint_bytes, host_limits, require_space
from .checkpoints import Checkpointer, CheckpointOrigin
from .cleanup import collect_layers, destroy_session, kill_session_processes
from .disksize import grow_block_device, grow_filesystem
from .egress import policy_of
from .hostfit import check_host_fits
from .integrity import FileCheck
from .limits import sweep_cgroups
from .lineage import lineage, rollback_target
from .machines import (
    AGENT_READY_TIMEOUT_S,
    RestoreSpec,
    ResumeTogether,
    Started,
    boot_files,
    guest_hostname,
    identity_token,
    jail_of,
    start_restored,
)
from .manifest import CheckpointFiles, Manifest
from .ports import HostPorts
from .queries import Queries
from .standby import Standbys, standby_key
from .templates import Templates
from .upkeep import expires_after
from .warm import WarmPool, WarmTarget

if TYPE_CHECKING:
    from forkpoint.models import CheckpointTransfer

    from .portable.common import Local, Progress

__all__ = ["Runtime"]

_AGENT_LOCK_TIMEOUT_S = 600.0  # another process's connection may serve a long exec
# A lost agent connection waits this long for an operation on the session (rollback, rm)
# to finish, to tell the caller what happened.
_LOST_AGENT_WAIT_S = 30.0


_log = logging.getLogger(__name__)


async def _quietly(work: Awaitable[object]) -> None:
    """Background work (a standby) whose failure is logged: the operation it follows stands."""
    try:
        await work
    except ForkpointError as error:
        _log.warning("forkpoint: %s", error.message)


def _quiet(_: str) -> None:
    """Progress nobody watches."""


class Runtime(Queries):
    """In-process forkpoint. Open with :meth:`open`; every method is safe to call from
    several processes at once. Errors are :class:`~forkpoint.errors.ForkpointError`.
    The reads (``get``, ``list_sessions``, ...) are :class:`Queries`'."""

    def __init__(self, home_: Home, store: Store) -> None:
        super().__init__(home_, store)
        self._checkpoints = Checkpointer(self.home, store)
        self._templates = Templates(self.home, store, self._checkpoints)
        self._ports = HostPorts(self.home, store)
        #: Sessions this process forked only to look at a checkpoint (diffs); gone soon.
        self.scratch_sessions: set[str] = set()
        self.warm = WarmPool(self.home, store)
        #: A long-lived door (:meth:`serve_long_lived`) refills warm VMs after a create and
        #: prepares rollback standbys after a checkpoint or rollback in the background; a CLI
        #: process does so once it has printed its result (``fill_warm``, ``prepare_rollback``).
        self.refill_in_background = False
        self._background: set[asyncio.Task[object]] = set()
        self.standbys = Standbys(self.home, store)
        #: What a long-lived door lets in; everything until one calls :meth:`serve_long_lived`.
        self.admission = Admission(UNLIMITED, self)
        self._agents = AgentPool(
            lambda session_id: global_lock_async(
                self.home, f"agent-{session_id}", timeout_s=_AGENT_LOCK_TIMEOUT_S
            )
        )

    @functools.cached_property
    def build(self) -> QemuBuild:
        """The QEMU in use; identified on first need (it hashes the binary), not by the
        queries a CLI call makes (``ls``, ``show``, ``exec``)."""
        return qemu_build()

    @classmethod
    def open(cls, home_: Home | None = None) -> Runtime:
        h = (home_ or home()).ensure()
        return cls(h, Store.open(h))

    def close(self) -> None:
        self.store.close()

    def serve_long_lived(self, limits: ApiLimits) -> Admission:
        """Run as the runtime of a long-lived door (the REST server, the E2B gateway, MCP),
        each of which calls this once: admit heavy operations within ``limits``, and
        refill warm VMs after a create and prepare rollback standbys after a checkpoint or
        rollback in the background. Doors sharing a runtime share the first limits set,
        and so one count of what runs."""
        self.refill_in_background = True
        if self.admission.limits == UNLIMITED:
            self.admission = Admission(limits, self)
        return self.admission

    # -- helpers -----------------------------------------------------------------------

    def checkpoint_files(self, checkpoint_id: str) -> CheckpointFiles:
        """Where a checkpoint's RAM, device state and manifest are."""
        return self._checkpoints.files(checkpoint_id)

    def _machine(self, image: str, memory_mib: int, cpus: int) -> tuple[Image, MachineShape]:
        """The image and the machine shape to run it on (blocking: may probe KVM).

        :raises Conflict: the host has less memory (RAM + swap) or fewer CPUs than that.
        """
        check_host_fits(memory_mib, cpus)
        found = get_image(image, self.home.images)
        accel = detect_accel(self.build, self.home.cache, found.kernel)
        return found, MachineShape.for_build(self.build, accel, memory_mib, cpus)

    def _manifest(self, checkpoint_id: str, shape: MachineShape) -> Manifest:
        """The checkpoint's manifest, checked to restore on ``shape``.

        :raises IncompatibleCheckpoint: :raises DamagedCheckpoint: (before any guest starts)
        """
        from .integrity import check_before_restore

        files = self.checkpoint_files(checkpoint_id)
        check_before_restore(files, self.store.get_checkpoint(checkpoint_id).manifest)
        manifest = Manifest.load(files)
        manifest.check_compatible(shape)
        return manifest

    def lineage(self, record: SessionRecord) -> list[str]:
        """Checkpoints a session may roll back to: its own, and those it descends from."""
        return lineage(self.store, record)

    def gc(self) -> list[str]:
        """Delete disk layers nothing depends on any more; returns their names.

        Opportunistic: skipped while another process builds an image template (its base
        layer has no referrer until the template checkpoint exists). Empty cgroups of
        sessions that are gone are removed too.
        """
        checkpoints = {c.id for c in self.store.list_checkpoints()}
        self.warm.drain_stale(checkpoints)
        self.standbys.drain(checkpoints)
        warm = {w.id for w in self.warm.rows.all()}
        sweep_cgroups({r.id for r in self.store.list_sessions()} | warm)
        return collect_layers(self.home, self.store)

    # -- create ------------------------------------------------------------------------

    async def create(
        self,
        *,
        image: str = "default",
        memory_mib: int = DEFAULT_MEMORY_MIB,
        cpus: int = DEFAULT_CPUS,
        name: str | None = None,
        ports: Sequence[int] = (),
        network: Network | str = Network.USER,
        allow_net: Sequence[str] = (),
        deny_net: Sequence[str] = (),
        timeout_s: float | None = None,
        disk_mib: int | None = None,
        history: bool = False,
        history_keep: int = 20,
        on_expiry: Expiry | str = Expiry.REMOVE,
    ) -> Session:
        """Create a session by forking the image's template (booted once, then cached).
        ``allow_net``/``deny_net``: CIDRs adjusting the default egress policy (see
        :mod:`forkpoint.vm.egress`). ``timeout_s``: its lifetime, from now, and
        ``on_expiry`` what happens at its end (see :meth:`set_timeout`). ``disk_mib``: its
        virtual disk's size, at least the image's (see ``disksize``).

        ``history``: checkpoint it before every exec and file write made through forkpoint
        (``history``, ``undo``), keeping the last ``history_keep`` automatic checkpoints.
        :raises InvalidInput: bad sizes, ports, network or CIDRs; :raises NotFound: no
            such image; :raises LimitExceeded: the disk reserve or the session count would
            be crossed.
        """
        from forkpoint.requests import CreateSessionRequest, parse  # pydantic: only when used

        request = parse(
            CreateSessionRequest, image=image, memory_mib=memory_mib, cpus=cpus, name=name,
            ports=tuple(ports), network=network, allow_net=tuple(allow_net),
            deny_net=tuple(deny_net), timeout_s=timeout_s, disk_mib=disk_mib, history=history,
            history_keep=history_keep, on_expiry=on_expiry,
        )  # fmt: skip
        egress = EgressPolicy.of(request.allow_net, request.deny_net).to_json()
        await asyncio.to_thread(self._require_room, 1)
        img, shape = await asyncio.to_thread(
            self._machine, request.image, request.memory_mib, request.cpus
        )
        if request.disk_mib is not None and request.disk_mib << 20 < img.recipe.disk_size:
            raise Unsatisfiable(
                f"--disk {request.disk_mib} MiB is smaller than image {img.name}'s disk "
                f"({img.recipe.disk_size >> 20} MiB): disks only grow"
            )
        template = await self._templates.get(img, shape)
        await asyncio.to_thread(self._manifest, template.id, shape)
        target = WarmTarget(template, img, shape, request.network, request.ports)
        warm = await asyncio.to_thread(self.warm.take, target)  # any started ahead
        warm_size = host_limits().warm_vms
        session = await self._start_session(
            template, img, shape, name=request.name, guest_ports=request.ports,
            network=request.network, egress=egress,
            expires_at=expires_after(request.timeout_s), on_expiry=request.on_expiry,
            disk_mib=request.disk_mib, warm=warm,
        )  # fmt: skip
        if warm_size and self.refill_in_background:
            self._in_background(self.warm.fill(target, warm_size))
        if request.history:
            from forkpoint.store.history import HistoryStore

            await asyncio.to_thread(
                HistoryStore(self.store).enable, session.id, request.history_keep
            )
        return session

    async def fill_warm(
        self,
        *,
        image: str = "default",
        memory_mib: int = DEFAULT_MEMORY_MIB,
        cpus: int = DEFAULT_CPUS,
        network: Network | str = Network.USER,
        ports: Sequence[int] = (),
        checkpoint: str | None = None,
        count: int | None = None,
    ) -> int:
        """Start warm VMs until there are ``count`` (``FORKPOINT_WARM_VMS`` by default)
        for creates of this kind (forwarding ``ports``), or with ``checkpoint`` for forks
        of it; returns how many started. See :mod:`.warm`.
        :raises NotFound: no such image or checkpoint; :raises InvalidInput: bad ports."""
        size = host_limits().warm_vms if count is None else count
        if checkpoint is not None:
            record, source = await asyncio.to_thread(self._fork_source, checkpoint)
            target = await self._fork_target(record, source)
        else:
            from forkpoint.requests import CreateSessionRequest, parse

            request = parse(
                CreateSessionRequest, image=image, memory_mib=memory_mib, cpus=cpus,
                ports=tuple(ports), network=network,
            )  # fmt: skip
            img, shape = await asyncio.to_thread(
                self._machine, request.image, request.memory_mib, request.cpus
            )
            template = await self._templates.get(img, shape)
            target = WarmTarget(template, img, shape, request.network, request.ports)
        return await self.warm.fill(target, size) if size > 0 else 0

    def _in_background(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _require_room(self, sessions: int) -> None:
        """Refuse to start ``sessions`` more when the disk reserve or the session count
        would be crossed (before anything is made; the store re-checks the count when it
        inserts each one, so racing creates cannot both pass).

        :raises LimitExceeded:
        """
        what = "a new session" if sessions == 1 else f"{sessions} new sessions"
        require_space(self.home, sessions * SESSION_BYTES, what)
        self._require_count(sessions, what)

    def _require_count(self, sessions: int, what: str) -> None:
        """:raises LimitExceeded: ``sessions`` more would pass FORKPOINT_MAX_SESSIONS."""
        most = host_limits().max_sessions
        # Queries.list_sessions notices dead VMs first: a crashed session does not count.
        active = sum(s.state == SessionState.RUNNING for s in self.list_sessions())
        if active + sessions > most:
            raise LimitExceeded(
                f"{what} would make {active + sessions} running sessions, more than "
                f"FORKPOINT_MAX_SESSIONS={most}: remove or stop some first"
            )

    async def prepare(
        self, image: str = "default", memory_mib: int = DEFAULT_MEMORY_MIB, cpus: int = DEFAULT_CPUS
    ) -> float:
        """Make sure the image's template exists (booting it once if needed); returns ms.

        ``create`` does this itself; call it first to keep that one-time boot out of a
        measurement.
        """
        started = time.perf_counter()
        img, shape = await asyncio.to_thread(self._machine, image, memory_mib, cpus)
        await self._templates.get(img, shape)
        return (time.perf_counter() - started) * 1000

    async def _start_session(
        self,
        checkpoint: CheckpointRecord,
        image: Image,
        shape: MachineShape,
        *,
        name: str | None,
        guest_ports: Sequence[int],
        network: Network,
        egress: dict[str, list[str]],
        loaded: Callable[[], Awaitable[None]] | None = None,
        expires_at: str | None = None,
        on_expiry: Expiry = Expiry.REMOVE,
        disk_mib: int | None = None,
        warm: WarmRecord | None = None,
    ) -> Session:
        """Restore ``checkpoint`` as a new session; the caller has checked its manifest
        for ``shape`` (:meth:`_manifest`). ``warm``: a warm VM taken for this create; it
        becomes the session (its id, uid and QEMU), or is discarded if the session cannot
        be made."""
        # The session row needs a layer row to point at; the checkpoint's own frozen
        # layer is a valid placeholder until the VM runs on its own top layer.
        fresh = SessionRecord.new(
            image=image.name, image_hash=image.hash, disk_layer=checkpoint.disk_layer,
            memory_mib=shape.memory_mib, cpus=shape.cpus, network=network, name=name,
            parent_checkpoint=checkpoint.id, egress=egress, expires_at=expires_at,
            on_expiry=on_expiry, disk_mib=disk_mib,
        )  # fmt: skip
        if warm is not None:
            fresh = dataclasses.replace(fresh, id=warm.id, uid=warm.uid)
        # Locked before the row exists: a `creating` session whose lock is free has lost
        # its creator (killed), and queries may call it crashed (Queries._refresh).
        async with session_lock_async(self.home, fresh.id):
            try:
                record = await asyncio.to_thread(
                    self.store.insert_session, fresh, max_active=host_limits().max_sessions
                )
            except BaseException:
                if warm is not None:
                    await asyncio.to_thread(self.warm.discard, warm)
                raise
            faults.point("restore.session-inserted")
            try:
                if warm is None:
                    forwards = [(await self._ports.allocate(record.id, g), g) for g in guest_ports]
                else:  # its passt forwards host ports reserved for it
                    forwards = list(warm.forwards)
                    await asyncio.to_thread(self._ports.adopt, record.id, forwards)
                spec = RestoreSpec(
                    files=self.files(record.id),
                    checkpoint=self.checkpoint_files(checkpoint.id),
                    checkpoint_layer=checkpoint.disk_layer, shape=shape,
                    boot=boot_files(image, shape), network=network, forwards=tuple(forwards),
                    hostname=guest_hostname(name, record.id), token=identity_token(record.id, 0),
                    jail=jail_of(record), egress=policy_of(record),
                )  # fmt: skip
                started = await start_restored(self.home, spec, loaded, warm=warm)
                record = await asyncio.to_thread(
                    self._record_running, record.id, started, checkpoint.disk_layer
                )
                faults.point("restore.recorded")
                try:
                    grew = disk_mib is not None and await grow_block_device(
                        started.machine, disk_mib, at_create=True
                    )
                finally:
                    await started.machine.close()
            except BaseException:
                await self._destroy(record)
                raise
        if grew:  # through the agent, which takes the session's lock itself
            try:
                await grow_filesystem(self, record.id)
            except BaseException:
                await self._destroy(record)
                raise
        return await asyncio.to_thread(self.session_of, record)

    def _record_running(
        self,
        session_id: str,
        started: Started,
        backing: str,
        *,
        generation: int | Keep = KEEP,
        parent_checkpoint: str | Keep = KEEP,
    ) -> SessionRecord:
        """Record the session's restored VM: its new top layer and pids (and, after a
        rollback, its generation and checkpoint)."""
        with self.store.transaction():
            self.store.insert_layer(started.disk_layer, backing=backing)
            return self.store.update_session(
                session_id, state=SessionState.RUNNING, disk_layer=started.disk_layer,
                qemu_pid=started.machine.pid, aux_pids=started.aux_pids, generation=generation,
                parent_checkpoint=parent_checkpoint,
            )  # fmt: skip

    # -- lifetime ----------------------------------------------------------------------

    async def set_timeout(
        self, session: str, timeout_s: float | None, on_expiry: Expiry | str | None = None
    ) -> Session:
        """End the session's lifetime ``timeout_s`` seconds from now (None: never), and
        then remove or pause it (``on_expiry``; None: as it was). Every CLI call and the
        reaper of every long-lived door act on it (see :meth:`expire`).

        :raises NotFound: :raises InvalidInput: a lifetime out of range.
        """
        from forkpoint.requests import TimeoutRequest, parse

        request = parse(TimeoutRequest, timeout_s=timeout_s, on_expiry=on_expiry)
        record = await asyncio.to_thread(self.store.get_session, session)
        async with session_lock_async(self.home, record.id):
            record = await asyncio.to_thread(
                self.store.update_session, record.id,
                expires_at=expires_after(request.timeout_s),
                on_expiry=KEEP if request.on_expiry is None else request.on_expiry,
            )  # fmt: skip
        return await asyncio.to_thread(self.session_of, record)

    async def expire(self) -> list[str]:
        """End the lifetimes that are over: remove those sessions, or pause them; returns
        their ids. Every CLI call and the reaper of every long-lived door run it."""
        from .upkeep import due_to_pause

        ended = await asyncio.to_thread(self.upkeep)
        for session_id in await asyncio.to_thread(due_to_pause, self):
            try:
                await self.pause(session_id)
            except ForkpointError as error:  # the next round tries again
                _log.warning("forkpoint: pausing %s at its timeout: %s", session_id, error.message)
                continue
            ended.append(session_id)
        if ended:
            await asyncio.to_thread(self.collect_hidden_checkpoints)
        return ended

    # -- pause -------------------------------------------------------------------------

    async def pause(self, session: str) -> Session:
        """Checkpoint a running session (a hidden ``pause`` checkpoint) and stop its VM;
        :meth:`resume` brings it back as it was — same id, host ports, processes at the
        same PIDs. A paused session does not expire.

        :raises Conflict: it is not running.
        """
        record = await asyncio.to_thread(self.store.get_session, session)
        async with session_lock_async(self.home, record.id):
            await self._checkpoint_held(record.id, None, CheckpointKind.PAUSE)
            await asyncio.to_thread(self._stop_held, record.id, expires_at=None)
            record = await asyncio.to_thread(self.store.get_session, record.id)
        return await asyncio.to_thread(self.session_of, record)

    async def resume(self, session: str) -> Session:
        """Bring a paused session back from its pause checkpoint (a rollback to it); a
        crashed one from its latest checkpoint, as :meth:`rollback` would.

        :raises Conflict: it is neither paused nor crashed.
        """
        record = await asyncio.to_thread(self.store.get_session, session)
        paused_at = await asyncio.to_thread(self.paused_at, record.id)
        if paused_at is None and record.state != SessionState.CRASHED:
            raise Conflict(f"session {record.id} is {record.state}, not paused")
        return await self.rollback(record.id, paused_at)

    def paused_at(self, session: str) -> str | None:
        """The checkpoint a stopped session was paused at (None: it is not paused)."""
        record = self.store.get_session(session)
        if record.state != SessionState.STOPPED:
            return None
        own = self.store.list_checkpoints(session_id=record.id)
        if not own or own[-1].kind != CheckpointKind.PAUSE:
            return None  # stopped by hand, not paused
        return own[-1].id

    def collect_hidden_checkpoints(self) -> list[str]:
        """Delete the pause and fork checkpoints of sessions that are gone, once nothing
        depends on them (blocking); returns their ids."""
        live = {r.id for r in self.store.list_sessions()}
        gone = []
        for checkpoint in self.store.list_checkpoints(
            kind=(CheckpointKind.PAUSE, CheckpointKind.FORK)
        ):
            if checkpoint.session_id in live:
                continue
            try:
                self._remove_checkpoint_now(checkpoint.id)
            except ForkpointError:
                continue  # a fork still maps it
            gone.append(checkpoint.id)
        return gone

    # -- console -----------------------------------------------------------------------

    async def console(self, session: str, max_bytes: int = 64 << 10) -> str:
        """The serial console's latest output (at most ``max_bytes``). A running VM's
        console is a ring inside QEMU: it is drained into ``serial.log`` (capped) first.
        :raises NotFound:"""
        from forkpoint.vm.console import read_tail

        record = await asyncio.to_thread(self.store.get_session, session)
        files = self.files(record.id)
        async with session_lock_async(self.home, record.id):
            record = await asyncio.to_thread(self.store.get_session, record.id)
            record = await asyncio.to_thread(self._refresh, record, locked=True)
            if record.state == SessionState.RUNNING:
                machine = await Machine.adopt(files, record.qemu_pid or 0)
                try:
                    await machine.drain_console()
                finally:
                    await machine.close()
        return await asyncio.to_thread(read_tail, files, max_bytes)

    # -- delete ------------------------------------------------------------------------

    async def remove(self, session: str) -> None:
        """Kill the session's VM and delete its files. :raises NotFound:"""
        record = await asyncio.to_thread(self.store.get_session, session)
        async with session_lock_async(self.home, record.id):
            await self._destroy(await asyncio.to_thread(self.store.get_session, record.id))
        await asyncio.to_thread(self.collect_hidden_checkpoints)

    async def _destroy(self, record: SessionRecord) -> None:
        await asyncio.to_thread(self._destroy_now, record)

    def _destroy_now(self, record: SessionRecord) -> None:
        self.standbys.drop(record.id)
        destroy_session(self.home, self.store, self.files(record.id), record)

    async def stop(self, session: str) -> Session:
        """Kill the session's VM, keeping the session (``stopped``) to roll back later
        (idempotent). :raises NotFound:"""
        record = await asyncio.to_thread(self.store.get_session, session)
        async with session_lock_async(self.home, record.id):
            await asyncio.to_thread(self._stop_held, record.id)
            record = await asyncio.to_thread(self.store.get_session, record.id)
        return await asyncio.to_thread(self.session_of, record)

    def _stop_held(self, session_id: str, *, expires_at: str | None | Keep = KEEP) -> None:
        from .stop import stop_vm

        self.standbys.drop(session_id)  # a stopped VM holds nothing
        stop_vm(self.store, self.files(session_id), session_id, expires_at=expires_at)

    # -- checkpoint --------------------------------------------------------------------

    async def checkpoint(
        self, session: str, name: str | None = None, *, kind: CheckpointKind = CheckpointKind.USER
    ) -> Checkpoint:
        """Checkpoint a running session (memory, devices, disk). The VM pauses briefly.
        ``kind``: why (``user``, or one of forkpoint's own purposes, hidden from lists).

        :raises Conflict: the session is not running; :raises QemuError: QEMU failed (the
            session keeps running and no checkpoint is recorded).
        """
        record = await asyncio.to_thread(self.store.get_session, session)
        validate_name(name, "checkpoint")
        if name is not None and await asyncio.to_thread(self._checkpoint_named, name):
            raise Conflict(f"checkpoint name {name!r} is already taken")
        async with session_lock_async(self.home, record.id):
            created = await self._checkpoint_held(record.id, name, kind)
        self._standby_in_background(record.id)
        return await asyncio.to_thread(self.checkpoint_of, created)

    async def _checkpoint_held(
        self, session_id: str, name: str | None, kind: CheckpointKind
    ) -> CheckpointRecord:
        """:meth:`checkpoint`'s work, under the session's lock."""
        record = await asyncio.to_thread(self.require_running, session_id)
        await asyncio.to_thread(
            require_space, self.home, checkpoint_bytes(record.memory_mib), "a checkpoint"
        )
        image, shape = await asyncio.to_thread(
            self._machine, record.image_hash, record.memory_mib, record.cpus
        )
        machine = await Machine.adopt(self.files(record.id), record.qemu_pid or 0)
        try:
            await machine.resume_if_paused()
            layer = await self._sync_disk_layer(machine, record)
            origin = CheckpointOrigin(
                session_id=record.id, name=name, kind=kind, image=image,
                shape=shape, parent=record.parent_checkpoint,
                guest_ports=tuple(p.guest_port for p in record.ports),
            )  # fmt: skip
            return await self._checkpoints.write(machine, self._ram_base(record), layer, origin)
        finally:
            await machine.close()

    async def _sync_disk_layer(self, machine: Machine, record: SessionRecord) -> str:
        """The layer the VM really writes to. A forkpoint process killed between QEMU's
        disk snapshot and its store update leaves the VM on a layer the store has not
        recorded yet (stacked on the recorded one): adopt it."""
        active = (await machine.active_disk()).name
        if active != record.disk_layer:
            await asyncio.to_thread(self._adopt_layer, record, active)
        return active

    def _adopt_layer(self, record: SessionRecord, active: str) -> None:
        with self.store.transaction():
            self.store.insert_layer(active, backing=record.disk_layer)
            self.store.update_session(record.id, disk_layer=active)

    def _ram_base(self, record: SessionRecord) -> Path:
        """The RAM file the session's VM maps: that of the checkpoint it was restored from
        (which therefore cannot be deleted while the session lives)."""
        if record.parent_checkpoint is None:
            raise InternalError(f"session {record.id} has no checkpoint to map its RAM from")
        return self.checkpoint_files(record.parent_checkpoint).ram

    def _checkpoint_named(self, name: str) -> bool:
        try:
            self.store.get_checkpoint(name)
        except NotFound:
            return False
        return True

    async def remove_checkpoint(self, checkpoint: str) -> None:
        """Delete a checkpoint. :raises InUse: sessions or checkpoints depend on it."""
        await asyncio.to_thread(self._remove_checkpoint_now, checkpoint)

    def _remove_checkpoint_now(self, checkpoint: str) -> None:
        from .diffs import ScanCache

        record = self.store.get_checkpoint(checkpoint)
        self._checkpoints.delete(record.id)
        ScanCache(self.home.root / "scans").forget(record.id)
        self.gc()

    def verify_checkpoint(self, checkpoint: str) -> list[FileCheck]:
        """Hash every file of a checkpoint against its manifest (blocking; reads the whole
        RAM file's data: ≈ 0.1 s per 100 MiB written). A file that differs is reported,
        not raised. :raises NotFound: :raises DamagedCheckpoint: its manifest is."""
        from .integrity import verify_files

        record = self.store.get_checkpoint(checkpoint)
        return verify_files(self.checkpoint_files(record.id), record.manifest)

    async def recover(self) -> list[Session | ForkpointError]:
        """Bring back every ``crashed`` session from its latest checkpoint (a rollback:
        same id, same ports), e.g. after the host restarted; one slot per session."""
        crashed = [
            s.id
            for s in await asyncio.to_thread(self.list_sessions)
            if s.state == SessionState.CRASHED
        ]
        out: list[Session | ForkpointError] = []
        for session_id in crashed:  # one at a time: each restore is CPU-bound
            try:
                out.append(await self.rollback(session_id))
            except ForkpointError as error:
                out.append(error)
        return out

    # -- portable checkpoints ----------------------------------------------------------

    def _portable(self) -> Local:
        from .portable.common import Local

        def shape_here(image_hash: str, memory_mib: int, cpus: int) -> MachineShape:
            return self._machine(image_hash, memory_mib, cpus)[1]

        return Local(self.home, self.store, shape_here)

    async def push_checkpoint(
        self, checkpoint: str, to: str, *, endpoint: str | None = None,
        progress: Progress | None = None,
    ) -> CheckpointTransfer:  # fmt: skip
        """Upload a checkpoint to ``s3://BUCKET/PREFIX`` with the part of its lineage the
        bucket lacks (a child: the RAM pages that differ from its parent's). Its id and
        name become refs to its digest. Credentials: the usual AWS variables.

        :raises NotFound: no such checkpoint; :raises InvalidInput: not an S3 URL.
        """
        from .portable.service import push_checkpoint

        return await asyncio.to_thread(
            push_checkpoint, self._portable(), self.checkpoint_of, checkpoint, to, endpoint,
            progress or _quiet,
        )  # fmt: skip

    async def pull_checkpoint(
        self, ref: str, source: str, *, endpoint: str | None = None,
        progress: Progress | None = None,
    ) -> CheckpointTransfer:  # fmt: skip
        """Download the checkpoint ``ref`` (a digest, or a ref: an id or name it was
        pushed under) from ``s3://BUCKET/PREFIX``, with what this home lacks of its
        lineage. Fail-closed: every object is verified before anything becomes visible.

        :raises IncompatibleCheckpoint: this host cannot restore it (checked before any
            RAM is downloaded); :raises DamagedCheckpoint: an object does not match its
            digest; :raises NotFound: no such checkpoint there.
        """
        from .portable.service import pull_checkpoint

        return await asyncio.to_thread(
            pull_checkpoint, self._portable(), self.checkpoint_of, ref, source, endpoint,
            progress or _quiet,
        )  # fmt: skip

    async def export_checkpoint(
        self, checkpoint: str, path: Path, *, progress: Progress | None = None
    ) -> CheckpointTransfer:
        """Write a checkpoint and its whole lineage into one archive (``import`` reads it)."""
        from .portable.service import export_checkpoint

        return await asyncio.to_thread(
            export_checkpoint, self._portable(), self.checkpoint_of, checkpoint, path,
            progress or _quiet,
        )  # fmt: skip

    async def import_checkpoint(
        self, path: Path, *, progress: Progress | None = None
    ) -> CheckpointTransfer:
        """Read an archive written by :meth:`export_checkpoint` (checked as a pull is)."""
        from .portable.service import import_checkpoint

        return await asyncio.to_thread(
            import_checkpoint, self._portable(), self.checkpoint_of, path, progress or _quiet
        )

    # -- images ------------------------------------------------------------------------

    async def remove_image(self, name: str) -> list[str]:
        """Delete every build of image ``name`` and its templates; returns their hashes.

        :raises NotFound: no such image. :raises InUse: a session or checkpoint needs it.
        """
        from .image_removal import remove_image

        removed = await asyncio.to_thread(
            remove_image, self.home, self.store, self._checkpoints, name
        )
        await asyncio.to_thread(self.gc)
        return removed

    # -- fork & rollback ---------------------------------------------------------------

    async def fork(self, checkpoint: str, count: int = 1) -> list[Session | ForkpointError]:
        """Start ``count`` new sessions from a checkpoint, in parallel.

        Each gets a new id and its own host ports for the checkpoint's forwarded guest
        ports. A fork that fails is reported in its slot; the others still run.
        """
        from forkpoint.requests import ForkRequest, parse

        parse(ForkRequest, count=count)
        record, source = await asyncio.to_thread(self._fork_source, checkpoint)
        await asyncio.to_thread(self._require_room, count)
        target = await self._fork_target(record, source)
        egress = policy_of(source).to_json() if source else {}
        together = ResumeTogether(count)

        async def one_fork() -> Session:
            warm = await asyncio.to_thread(self.warm.take, target)  # `warm --from` started
            async with together.member() as loaded:
                return await self._start_session(
                    record, target.image, target.shape, name=None,
                    guest_ports=target.guest_ports, network=target.network, egress=egress,
                    loaded=loaded, warm=warm,
                    disk_mib=source.disk_mib if source else None,  # its disk is that size
                )  # fmt: skip

        results = await asyncio.gather(
            *(one_fork() for _ in range(count)),
            return_exceptions=True,
        )
        out: list[Session | ForkpointError] = []
        for result in results:
            if isinstance(result, ForkpointError | Session):
                out.append(result)
            elif isinstance(result, BaseException):
                raise result
        return out

    async def _fork_target(
        self, record: CheckpointRecord, source: SessionRecord | None
    ) -> WarmTarget:
        """What forks of ``record`` start: its image, machine shape, network (the
        session it was taken of, if that still exists, else ``user``) and forwarded ports.
        :raises IncompatibleCheckpoint: it was made by another QEMU build or shape;
        :raises DamagedCheckpoint:"""
        manifest = Manifest.from_dict(record.manifest, checkpoint_id=record.id)
        image, shape = await asyncio.to_thread(
            self._machine, record.image_hash, manifest.shape.memory_mib, manifest.shape.cpus
        )
        await asyncio.to_thread(self._manifest, record.id, shape)
        network = source.network if source else Network.USER
        return WarmTarget(record, image, shape, network, manifest.ports)

    async def scratch_fork(self, checkpoint: str) -> Session:
        """A session restored from ``checkpoint`` only to look at (a diff): no network,
        no ports, in :attr:`scratch_sessions` until the caller removes it."""
        record = await asyncio.to_thread(self.store.get_checkpoint, checkpoint)
        target = await self._fork_target(record, None)
        session = await self._start_session(
            record, target.image, target.shape, name=None, guest_ports=(),
            network=Network.NONE, egress=EgressPolicy.of((), ()).to_json(),
        )  # fmt: skip
        self.scratch_sessions.add(session.id)
        return session

    def _fork_source(self, checkpoint: str) -> tuple[CheckpointRecord, SessionRecord | None]:
        """The checkpoint, and the session it was taken of if that still exists."""
        record = self.store.get_checkpoint(checkpoint)
        try:
            return record, self.store.get_session(record.session_id)
        except NotFound:
            return record, None

    async def rollback(self, session: str, checkpoint: str | None = None) -> Session:
        """Reset a session — same id, same host ports — to a checkpoint of its lineage
        (default: its latest own checkpoint, else the one it started from). Works on a
        crashed session too.

        :raises Conflict: the checkpoint is not in the session's lineage.
        """
        record = await asyncio.to_thread(self.store.get_session, session)
        async with session_lock_async(self.home, record.id):
            record = await asyncio.to_thread(self.store.get_session, record.id)
            if record.state != SessionState.RUNNING:  # a stopped one starts running again
                await asyncio.to_thread(self._require_count, 1, f"reviving {record.id}")
            target, image, shape = await asyncio.to_thread(self._rollback_plan, record, checkpoint)
            record, started = await self._replace_vm(record, target, image, shape)
            faults.point("rollback.recorded")
            # A checkpoint from before the disk grew (the template) brings the old size.
            try:
                grew = record.disk_mib is not None and await grow_block_device(
                    started.machine, record.disk_mib, at_create=False
                )
            finally:
                await started.machine.close()
        if grew:
            await grow_filesystem(self, record.id)
        # The layers it ran on (no checkpoint or session went: nothing else to collect).
        await asyncio.to_thread(collect_layers, self.home, self.store)
        self._standby_in_background(record.id)
        return await asyncio.to_thread(self.session_of, record)

    def _rollback_plan(
        self, record: SessionRecord, checkpoint: str | None
    ) -> tuple[CheckpointRecord, Image, MachineShape]:
        """Where a rollback of ``record`` goes and on which machine, checked (blocking)."""
        target = rollback_target(self.store, record, checkpoint)
        image, shape = self._machine(target.image_hash, record.memory_mib, record.cpus)
        self._manifest(target.id, shape)
        return target, image, shape

    async def _replace_vm(
        self, record: SessionRecord, target: CheckpointRecord, image: Image, shape: MachineShape
    ) -> tuple[SessionRecord, Started]:
        """A rollback's work under the session's lock: its VM replaced by one restored
        from ``target`` — same id, uid and host ports, the next generation — and recorded.
        On failure the session is left ``crashed`` (nothing of the new VM lingers)."""
        files = self.files(record.id)
        standby = await asyncio.to_thread(
            self.standbys.take, record.id, target.id, standby_key(shape, record.network)
        )  # started ahead: see .standby
        # The old QEMU's exit (freeing its memory) overlaps the new one's start or load.
        old_vm = await asyncio.to_thread(
            kill_session_processes, files, record, standby.tag if standby else None,
            wait_vm=False,
        )  # fmt: skip
        try:
            faults.point("rollback.old-vm-killed")
            # Its ports, unless another program took one while it was down (host restart).
            if await asyncio.to_thread(self._ports.keep_or_move, record.id):
                record = await asyncio.to_thread(self.store.get_session, record.id)
            generation = record.generation + 1
            spec = RestoreSpec(
                files=files, checkpoint=self.checkpoint_files(target.id),
                checkpoint_layer=target.disk_layer, shape=shape, boot=boot_files(image, shape),
                network=record.network,
                forwards=tuple((p.host_port, p.guest_port) for p in record.ports),
                hostname=guest_hostname(record.name, record.id),
                token=identity_token(record.id, generation),
                jail=jail_of(record), egress=policy_of(record),
            )  # fmt: skip
            try:
                started = await start_restored(self.home, spec, standby=standby)
            except ForkpointError:
                await asyncio.to_thread(
                    self.store.update_session,
                    record.id,
                    state=SessionState.CRASHED,
                    qemu_pid=None,
                )
                raise
        finally:
            await asyncio.to_thread(old_vm.wait)  # gone: it has exited by now
        record = await asyncio.to_thread(
            self._record_running, record.id, started, target.disk_layer,
            generation=generation, parent_checkpoint=target.id,
        )  # fmt: skip
        return record, started

    async def prepare_rollback(
        self, session: str, checkpoint: str | None = None, *, limit: int | None = None
    ) -> bool:
        """Start a standby QEMU for the session's next rollback (to ``checkpoint``, default
        its default target), so that rollback starts no QEMU, if at most ``limit`` sessions
        (default ``FORKPOINT_ROLLBACK_STANDBYS``) then keep one; True if one started. See
        :mod:`.standby`. :raises NotFound: :raises Conflict: as :meth:`rollback`."""
        limit = host_limits().rollback_standbys if limit is None else limit
        record = await asyncio.to_thread(self.store.get_session, session)
        if limit == 0 and await asyncio.to_thread(self.standbys.rows.get, record.id) is None:
            return False
        async with session_lock_async(self.home, record.id):
            record = await asyncio.to_thread(self.store.get_session, record.id)
            if record.state != SessionState.RUNNING:
                return False
            target, image, shape = await asyncio.to_thread(self._rollback_plan, record, checkpoint)
            return await self.standbys.prepare(record, target, image, shape, limit)

    def _standby_in_background(self, session_id: str) -> None:
        """A server prepares the next rollback once a checkpoint or rollback is done."""
        if self.refill_in_background and host_limits().rollback_standbys:
            self._in_background(_quietly(self.prepare_rollback(session_id)))

    # -- diff --------------------------------------------------------------------------

    async def diff(
        self,
        a: str,
        b: str | None = None,
        *,
        include_tmp: bool = False,
        exclude: Sequence[str] = (),
        patch: bool = False,
    ) -> StateDiff:
        """Files added/removed/modified, processes started/gone and listening ports
        opened/closed from ``a`` to ``b`` (checkpoints or sessions). ``a`` a checkpoint and
        no ``b``: against its session now; ``a`` a session: from the checkpoint ``rollback``
        would restore. ``patch``: unified diffs of small text files. A checkpoint is looked
        at through a short-lived fork (its scan is kept: checkpoints never change).

        :raises NotFound: :raises Conflict: a session to compare is not running.
        """
        from .inspect import diff_states

        return await diff_states(
            self, a, b, include_tmp=include_tmp, exclude=tuple(exclude), patch=patch
        )

    def diff_forks(self, a: str, b: str | None = None) -> int:
        """How many short-lived forks :meth:`diff` of ``a`` and ``b`` may start (0–2)."""
        from .inspect import scratch_forks

        return scratch_forks(self, a, b)

    async def rollback_preview(
        self, session: str, checkpoint: str | None = None, *, patch: bool = False
    ) -> StateDiff:
        """What ``rollback(session, checkpoint)`` would undo (the diff from that checkpoint
        to the session now); changes nothing."""
        from .inspect import rollback_preview

        return await rollback_preview(self, session, checkpoint, patch=patch)

    # -- history -----------------------------------------------------------------------

    async def _step(self, session: str, label: str | Sequence[str]) -> None:
        """Before a step: a labelled checkpoint if the session keeps a history."""
        from .history import label_of, record_step

        await record_step(self, session, label_of(label))

    def history(self, session: str) -> list[HistoryStep]:
        """The steps of a session created with ``history`` (blocking), oldest first.
        :raises Conflict: it keeps no history."""
        from .history import history_of

        return history_of(self, session)

    def step_labels(self) -> dict[str, str]:
        """Checkpoint id → step label, for every history step not undone (blocking)."""
        from forkpoint.store.history import HistoryStore

        return HistoryStore(self.store).labels()

    def disk_bytes(self, session: str) -> int:
        """Disk the session's own writable layer takes (allocated bytes; blocking)."""
        record = self.store.get_session(session)
        try:
            return (self.home.layers / record.disk_layer).stat().st_blocks * 512
        except OSError:
            return 0

    async def undo(self, session: str, steps: int = 1) -> Session:
        """Roll back to before the last ``steps`` steps, processes included.
        :raises Conflict: no history, or fewer steps than that."""
        from .history import undo

        return await undo(self, session, steps)

    # -- ports -------------------------------------------------------------------------

    async def forward_port(self, session: str, guest_port: int) -> Port:
        """Forward ``guest_port`` to a free port on the host's 127.0.0.1 (idempotent)."""
        from forkpoint.requests import PortRequest, parse

        parse(PortRequest, guest_port=guest_port)
        record = await asyncio.to_thread(self.store.get_session, session)
        existing = record.port_for(guest_port)
        if existing:
            return Port(guest_port=existing.guest_port, host_port=existing.host_port)
        async with session_lock_async(self.home, record.id):
            record = await asyncio.to_thread(self.require_running, record.id)
            if record.network != Network.USER:
                raise Conflict(f"session {record.id} has no network (--network none)")
            host_port = await self._ports.allocate(record.id, guest_port)
            await asyncio.to_thread(self._ports.restart_network, self.files(record.id), record.id)
            return Port(guest_port=guest_port, host_port=host_port)

    # -- guest access ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def agent(self, session: str) -> AsyncIterator[AgentClient]:
        """The agent client of a running session. Concurrent users in this process share
        one connection (requests run side by side); another process waits until this
        one's users are done."""
        record = await asyncio.to_thread(self.require_running, session, locked=False)
        try:
            async with self._agents.use(
                record.id, record.generation, lambda: self._connect_agent(record)
            ) as client:
                yield client
        except AgentError as error:
            raise await self._explain_lost_agent(record, error) from error

    async def _explain_lost_agent(self, record: SessionRecord, error: AgentError) -> ForkpointError:
        """Why a session's agent went away mid-request: a rollback, undo or rm that ran
        meanwhile is the caller's race (404/409), not forkpoint's fault (500). Such an
        operation holds the session lock until the store says what it did."""
        with contextlib.suppress(Conflict):  # held too long: judge by the record as it is
            async with session_lock_async(self.home, record.id, timeout_s=_LOST_AGENT_WAIT_S):
                pass
        try:
            now = await asyncio.to_thread(self.store.get_session, record.id)
        except NotFound:
            return NotFound(f"session {record.id} was removed while the request ran")
        if now.generation != record.generation:
            return Conflict(f"session {record.id} was rolled back while the request ran")
        if now.state != SessionState.RUNNING:
            return Conflict(f"session {record.id} is {now.state} (it stopped during the request)")
        return error

    async def _connect_agent(self, record: SessionRecord) -> AgentClient:
        files = self.files(record.id)
        async with session_lock_async(self.home, record.id):
            if not is_running(record.qemu_pid, files.name):
                # Its QEMU exited since it was looked up (the guest rebooted or panicked).
                raise Conflict(
                    f"session {record.id} has crashed; roll it back: forkpoint rollback {record.id}"
                )
            # A forkpoint process killed mid-checkpoint leaves the VM paused: resume it.
            machine = await Machine.adopt(files, record.qemu_pid or 0)
            try:
                await machine.resume_if_paused()
            finally:
                await machine.close()
        # Every connection re-sends the session's identity: the guest applies it unless it
        # already did (the copy posted right after the restore may not have arrived).
        identity = fresh_identity(
            identity_token(record.id, record.generation), guest_hostname(record.name, record.id)
        )
        return await AgentClient.connect(
            files.agent_socket, timeout=AGENT_READY_TIMEOUT_S, identity=identity
        )

    async def exec(
        self,
        session: str,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        output_encoding: OutputEncoding = "text",
        user: str | None = None,
    ) -> CommandResult:
        """Run a command in the guest to completion (exit code passed through, not raised).

        Output streams to ``on_stdout``/``on_stderr`` as it comes (they run on the shared
        connection's reader: keep them quick), and is returned as ``output_encoding``
        (UTF-8 text, or base64 for the exact bytes). ``user``: the guest user to run as
        (None: the image's ``USER``, else root).
        :raises CommandTimeout: past ``timeout`` seconds (the command is killed).
        """
        await self._step(session, command)
        async with self.agent(session) as agent:
            r = await agent.exec(
                command, cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                on_stdout=on_stdout, on_stderr=on_stderr, user=user,
            )  # fmt: skip
        return CommandResult.of(
            exit_code=r.exit_code, signal=r.signal, stdout=r.stdout, stderr=r.stderr,
            truncated=r.truncated, duration_ms=r.duration_ms, pid=r.pid, encoding=output_encoding,
        )  # fmt: skip

    async def spawn(
        self,
        session: str,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> BackgroundProcess:
        """Start a detached background process; it survives checkpoints, forks, rollbacks."""
        await self._step(session, command)
        async with self.agent(session) as agent:
            return await agent.spawn(command, cwd=cwd, env=env)

    async def read_file(self, session: str, path: str) -> bytes:
        async with self.agent(session) as agent:
            return await agent.read_file(path)

    async def read_file_to(self, session: str, path: str, dest: IO[bytes]) -> int:
        """Stream a guest file into ``dest`` (bounded memory); returns bytes written."""
        async with self.agent(session) as agent:
            return await agent.read_file_to(path, dest)

    async def write_file(
        self,
        session: str,
        path: str,
        data: bytes | IO[bytes],
        mode: int = 0o644,
        *,
        user: str | None = None,
    ) -> None:
        """Write a guest file (parents created; streamed when ``data`` is a file).
        ``user``: the file and the parents it creates belong to that guest user."""
        await self._step(session, f"write {path}")
        async with self.agent(session) as agent:
            await agent.write_file(path, data, mode=mode, user=user)

    async def list_files(self, session: str, path: str, *, depth: int = 1) -> list[FileEntry]:
        """Entries sorted by path; ``depth`` 2 adds the subdirectories' entries, ..."""
        async with self.agent(session) as agent:
            return await agent.list_dir(path, depth=depth)

    async def stat(self, session: str, path: str, *, follow_symlinks: bool = True) -> FileStat:
        """Type, size, mode, mtime, owner and group (ids and names), symlink target.
        :raises NotFound:"""
        async with self.agent(session) as agent:
            return await agent.stat(path, follow_symlinks=follow_symlinks)

    async def make_dir(self, session: str, path: str, user: str | None = None) -> bool:
        """``mkdir -p``; what it creates belongs to ``user``. False if it existed.
        :raises InvalidInput: a file is in the way; :raises NotFound: no such user."""
        async with self.agent(session) as agent:
            return await agent.make_dir(path, user=user)

    async def rename(self, session: str, src: str, dst: str, user: str | None = None) -> None:
        """Move ``src`` to ``dst`` (with ``user``: only where that user may write).
        :raises NotFound: :raises InvalidInput:"""
        await self._step(session, f"rename {src} {dst}")
        async with self.agent(session) as agent:
            await agent.rename(src, dst, user=user)

    async def remove_file(self, session: str, path: str) -> None:
        await self._step(session, f"remove {path}")
        async with self.agent(session) as agent:
            await agent.remove(path)

    async def ps(self, session: str) -> list[Process]:
        async with self.agent(session) as agent:
            return await agent.ps()

    async def kill_process(self, session: str, pid: int, signal: int | str = "TERM") -> None:
        async with self.agent(session) as agent:
            await agent.kill(pid, signal)

    # -- processes the agent owns (E2B's envd model; see runtime/processes.py) ---------

    def start_process(
        self,
        session: str,
        cmd: str,
        args: Sequence[str] = (),
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        stdin: bool = False,
        tag: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[ProcessEvent]:
        """Start ``cmd args`` in the guest: events ``start`` (the pid, first), then
        ``stdout``/``stderr`` as produced, then ``end``.

        Closing the iterator early does not kill it (``attach_process`` resumes).
        ``timeout`` (s; None/0: none) bounds its life, attached or not: its process group
        is killed. ``user``: run as that guest user (HOME, USER, groups; cwd defaults to
        its home); None: root. ``stdin``: keep stdin open for ``send_stdin``.
        :raises NotFound: no such command, cwd or user (from the first ``__anext__``).
        """
        return processes.process_events(
            self.agent(session),
            lambda agent: agent.start_process(
                [cmd, *args], cwd=cwd, env=env, user=user, stdin=stdin, tag=tag, timeout=timeout
            ),
        )

    def attach_process(self, session: str, pid: int) -> AsyncIterator[ProcessEvent]:
        """Re-attach: ``start``, then new output and ``end`` (at once if it has ended).
        :raises NotFound: no process ``pid`` was started with ``start_process``."""
        return processes.process_events(
            self.agent(session), lambda agent: agent.attach_process(pid)
        )

    async def send_stdin(self, session: str, pid: int, data: bytes) -> None:
        """:raises NotFound: :raises Conflict: started without stdin, or it was closed."""
        async with self.agent(session) as agent:
            await agent.send_stdin(pid, data)

    async def close_stdin(self, session: str, pid: int) -> None:
        """:raises NotFound: :raises Conflict: started without stdin."""
        async with self.agent(session) as agent:
            await agent.close_stdin(pid)

    async def signal_process(self, session: str, pid: int, signal: int | str) -> None:
        """Signal the process group of a ``start_process`` process (number or "KILL").
        :raises NotFound: unknown, or it has ended."""
        async with self.agent(session) as agent:
            await agent.signal_process(pid, signal)

    async def list_processes(self, session: str) -> list[TrackedProcess]:
        """``start_process`` processes: running ones, then recently ended ones."""
        async with self.agent(session) as agent:
            infos = await agent.list_processes()
        return [processes.tracked_process(i) for i in infos]

    def tcp_tunnel(
        self, session: str, guest_port: int
    ) -> contextlib.AbstractAsyncContextManager[tuple[TunnelReader, TunnelWriter]]:
        """A byte stream to ``127.0.0.1:guest_port`` inside the guest, over the agent
        channel (any port, no forward, no passt restart), flow-controlled both ways.
        :raises NotFound: nothing listens on that guest port (on enter)."""
        return processes.tcp_tunnel(self, session, guest_port)
