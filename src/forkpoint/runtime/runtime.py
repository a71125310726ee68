"""The runtime: sessions, checkpoints, forks, rollback, ports and garbage collection.

The only module that combines the VM engine, the agent client, images and the store.
The store is the truth; every operation on a session holds that session's inter-process
lock, so two CLIs and a server can work side by side. QEMU processes outlive the process
that started them and are re-adopted through the pid kept in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

from forkpoint.agent_client import AgentClient, OutputCallback, fresh_identity
from forkpoint.agent_client.tunnel import TunnelReader, TunnelWriter
from forkpoint.config import Home, home
from forkpoint.errors import Conflict, ForkpointError, InternalError, NotFound
from forkpoint.images import Image, get_image
from forkpoint.models import (
    BackgroundProcess,
    Checkpoint,
    CheckpointKind,
    CommandResult,
    FileEntry,
    FileStat,
    Network,
    OutputEncoding,
    Port,
    Process,
    ProcessEvent,
    Session,
    SessionState,
    TrackedProcess,
)
from forkpoint.store import (
    CheckpointRecord,
    SessionRecord,
    Store,
    global_lock,
    global_lock_async,
    new_checkpoint_id,
    session_lock_async,
    validate_name,
)
from forkpoint.vm import (
    BootFiles,
    Machine,
    MachineShape,
    QemuBuild,
    VmFiles,
    detect_accel,
    guest_cmdline,
    host_tsc_khz,
    qemu_build,
)
from forkpoint.vm.disk import blank_overlay_of, create_overlay
from forkpoint.vm.net import passt_log, start_passt, stop_passt
from forkpoint.vm.process import is_running, kill_and_wait, pids_with_arg

from . import processes
from .machines import (
    AGENT_READY_TIMEOUT_S,
    ResumeTogether,
    identity_token,
    new_layer_name,
    start_restored,
)
from .manifest import RAM, STATE, check_compatible, read_manifest, write_manifest
from .models import checkpoint_of, session_of

__all__ = ["Runtime"]

_TEMPLATE_BOOT_TIMEOUT_S = 180.0


class Runtime:
    """In-process forkpoint. Open with :meth:`open`; every method is safe to call from
    several processes at once. Errors are :class:`~forkpoint.errors.ForkpointError`."""

    def __init__(self, home_: Home, store: Store) -> None:
        self.home = home_
        self.store = store
        # Forks in this process queue here instead of polling the inter-process lock.
        self._ports_lock = asyncio.Lock()

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

    # -- helpers -----------------------------------------------------------------------

    def files(self, session_id: str) -> VmFiles:
        return VmFiles(self.home.sessions / session_id, f"forkpoint-{session_id}")

    def _shape(self, image: Image, memory_mib: int, cpus: int) -> MachineShape:
        accel = detect_accel(self.build, self.home.cache, image.kernel)
        return MachineShape.for_build(self.build, accel, memory_mib, cpus)

    def _boot(self, image: Image, shape: MachineShape) -> BootFiles:
        return BootFiles(image.kernel, image.initrd, guest_cmdline(shape.accel, host_tsc_khz()))

    def _checkpoint_dir(self, checkpoint_id: str) -> Path:
        return self.home.checkpoints / checkpoint_id

    def _refresh(self, record: SessionRecord) -> SessionRecord:
        """Notice a QEMU that died behind our back: the session becomes ``crashed``."""
        files = self.files(record.id)
        if record.state == SessionState.RUNNING and not is_running(record.qemu_pid, files.name):
            self._kill_processes(record)  # its passt has nothing left to serve
            return self.store.update_session(record.id, state=SessionState.CRASHED, qemu_pid=None)
        return record

    # -- queries -----------------------------------------------------------------------

    def get(self, session: str) -> Session:
        """The session with this id or name. :raises NotFound:"""
        return session_of(self._refresh(self.store.get_session(session)))

    def list_sessions(self) -> list[Session]:
        return [session_of(self._refresh(r)) for r in self.store.list_sessions()]

    def get_checkpoint(self, checkpoint: str) -> Checkpoint:
        return checkpoint_of(self.store.get_checkpoint(checkpoint))

    def list_checkpoints(self, session: str | None = None) -> list[Checkpoint]:
        session_id = self.store.get_session(session).id if session else None
        records = self.store.list_checkpoints(session_id=session_id, kind=CheckpointKind.USER)
        return [checkpoint_of(r) for r in records]

    # -- create ------------------------------------------------------------------------

    async def create(
        self,
        *,
        image: str = "default",
        memory_mib: int = 512,
        cpus: int = 1,
        name: str | None = None,
        ports: Sequence[int] = (),
        network: Network | str = Network.USER,
    ) -> Session:
        """Create a session by forking the image's template (booted once, then cached).

        :raises InvalidInput: bad sizes, ports or network; :raises NotFound: no such image.
        """
        from forkpoint.requests import CreateSessionRequest, parse  # pydantic: only when used

        request = parse(
            CreateSessionRequest, image=image, memory_mib=memory_mib, cpus=cpus, name=name,
            ports=tuple(ports), network=network,
        )  # fmt: skip
        img = get_image(request.image)
        shape = self._shape(img, request.memory_mib, request.cpus)
        template = await self._template(img, shape)
        return await self._start_session(
            template, img, shape, name=request.name, guest_ports=list(request.ports),
            network=request.network,
        )  # fmt: skip

    async def prepare(self, image: str = "default", memory_mib: int = 512, cpus: int = 1) -> float:
        """Make sure the image's template exists (booting it once if needed); returns ms.

        ``create`` does this itself; call it first to keep that one-time boot out of a
        measurement.
        """
        started = time.perf_counter()
        img = get_image(image)
        await self._template(img, self._shape(img, memory_mib, cpus))
        return (time.perf_counter() - started) * 1000

    async def _template(self, image: Image, shape: MachineShape) -> CheckpointRecord:
        """The checkpoint of ``image`` booted to agent-ready for this machine shape."""
        existing = self.store.get_template(image.hash, shape.key)
        if existing and (self._checkpoint_dir(existing) / STATE).exists():
            return self.store.get_checkpoint(existing)
        async with global_lock_async(self.home, f"template-{image.hash}", timeout_s=300):
            existing = self.store.get_template(image.hash, shape.key)
            if existing and (self._checkpoint_dir(existing) / STATE).exists():
                return self.store.get_checkpoint(existing)
            async with global_lock_async(self.home, "gc", timeout_s=300):
                return await self._boot_template(image, shape)

    async def _boot_template(self, image: Image, shape: MachineShape) -> CheckpointRecord:
        directory = self.home.sessions / f"template-{image.hash}-{shape.key}"
        files = VmFiles(directory, f"forkpoint-{directory.name}")
        shutil.rmtree(files.dir, ignore_errors=True)
        files.ensure()
        base = new_layer_name()
        await asyncio.to_thread(create_overlay, image.rootfs, self.home.layers / base)
        self.store.insert_layer(base)
        machine = await Machine.start(
            self.build, shape, self._boot(image, shape), files, self.home.layers / base
        )
        try:
            agent = await AgentClient.connect(files.agent_socket, timeout=_TEMPLATE_BOOT_TIMEOUT_S)
            async with agent:
                await agent.hello()
            record = await self._write_checkpoint(
                machine, files.boot_ram, base, session_id=f"template-{image.hash}",
                name=None, kind=CheckpointKind.TEMPLATE, image=image, shape=shape,
                parent=None, guest_ports=[],
            )  # fmt: skip
            self.store.set_template(image.hash, shape.key, record.id)
            return record
        except ForkpointError as error:
            raise InternalError(
                f"booting image {image.name} to build its template failed: {error.message}",
                log_tail=files.log_tail(),
            ) from None
        finally:
            await machine.kill()
            shutil.rmtree(files.dir, ignore_errors=True)

    async def _start_session(
        self,
        checkpoint: CheckpointRecord,
        image: Image,
        shape: MachineShape,
        *,
        name: str | None,
        guest_ports: list[int],
        network: Network,
        loaded: Callable[[], Awaitable[None]] | None = None,
    ) -> Session:
        manifest = read_manifest(self._checkpoint_dir(checkpoint.id))
        check_compatible(checkpoint.id, manifest, shape)
        # The session row needs a layer row to point at; the checkpoint's own frozen
        # layer is a valid placeholder until the VM runs on its own top layer.
        record = self.store.insert_session(
            SessionRecord.new(
                image=image.name, image_hash=image.hash, disk_layer=checkpoint.disk_layer,
                memory_mib=shape.memory_mib, cpus=shape.cpus, network=network, name=name,
                parent_checkpoint=checkpoint.id,
            )
        )  # fmt: skip
        files = self.files(record.id)
        try:
            async with session_lock_async(self.home, record.id):
                forwards = [(await self._allocate_host_port(record.id, g), g) for g in guest_ports]
                started = await start_restored(
                    self.home, files, self._checkpoint_dir(checkpoint.id), checkpoint.disk_layer,
                    shape, self._boot(image, shape), forwards,
                    network == Network.USER, name or record.id, identity_token(record.id, 0),
                    loaded,
                )  # fmt: skip
                with self.store.transaction():
                    self.store.insert_layer(started.disk_layer, backing=checkpoint.disk_layer)
                    record = self.store.update_session(
                        record.id, state=SessionState.RUNNING, disk_layer=started.disk_layer,
                        qemu_pid=started.machine.pid,
                        aux_pids=[started.passt_pid] if started.passt_pid else [],
                    )  # fmt: skip
                await started.machine.close()
        except BaseException:
            await self._destroy(record)
            raise
        return session_of(record)

    # -- delete ------------------------------------------------------------------------

    async def remove(self, session: str) -> None:
        """Kill the session's VM and delete its files. :raises NotFound:"""
        record = self.store.get_session(session)
        async with session_lock_async(self.home, record.id):
            await self._destroy(self.store.get_session(record.id))

    async def _destroy(self, record: SessionRecord) -> None:
        files = self.files(record.id)
        await asyncio.to_thread(self._kill_processes, record)
        with contextlib.suppress(NotFound):
            self.store.delete_session(record.id)
        shutil.rmtree(files.dir, ignore_errors=True)
        shutil.rmtree(files.sock_dir, ignore_errors=True)
        self.gc()

    async def stop(self, session: str) -> Session:
        """Kill the session's VM, keeping the session (``stopped``) to roll back later."""
        from .stop import stop_session

        return await stop_session(self, session)

    def _kill_processes(self, record: SessionRecord) -> None:
        files = self.files(record.id)
        kill_and_wait(record.qemu_pid, files.name)
        for pid in record.aux_pids:
            stop_passt(files, pid)
        # Also those never recorded: a forkpoint process killed while restoring the VM.
        ours = {files.name, str(passt_log(files))}
        for pid, arg in pids_with_arg(ours.__contains__):
            kill_and_wait(pid, arg)

    def gc(self) -> list[str]:
        """Delete disk layers nothing depends on any more; returns their names.

        Opportunistic: skipped while another process builds an image template (its base
        layer has no referrer until the template checkpoint exists).
        """
        removed: list[str] = []
        try:
            with global_lock(self.home, "gc", timeout_s=0):
                while names := [n for n in self.store.unreferenced_layers() if n not in removed]:
                    for name in names:
                        try:
                            self.store.delete_layer(name)
                        except ForkpointError:
                            continue
                        (self.home.layers / name).unlink(missing_ok=True)
                        blank_overlay_of(self.home.layers / name).unlink(missing_ok=True)
                        removed.append(name)
        except Conflict:
            pass  # busy: the next gc collects
        return removed

    # -- checkpoint --------------------------------------------------------------------

    async def checkpoint(self, session: str, name: str | None = None) -> Checkpoint:
        """Checkpoint a running session (memory, devices, disk). The VM pauses briefly.

        :raises Conflict: the session is not running; :raises QemuError: QEMU failed (the
            session keeps running and no checkpoint is recorded).
        """
        record = self.store.get_session(session)
        validate_name(name, "checkpoint")
        if name is not None and self._checkpoint_named(name):
            raise Conflict(f"checkpoint name {name!r} is already taken")
        async with session_lock_async(self.home, record.id):
            record = self._require_running(self.store.get_session(record.id))
            image = get_image(record.image_hash)
            shape = self._shape(image, record.memory_mib, record.cpus)
            files = self.files(record.id)
            machine = await Machine.adopt(files, record.qemu_pid or 0)
            try:
                await machine.resume_if_paused()
                layer = await self._sync_disk_layer(machine, record)
                created = await self._write_checkpoint(
                    machine, self._ram_base(record), layer,
                    session_id=record.id, name=name, kind=CheckpointKind.USER, image=image,
                    shape=shape, parent=record.parent_checkpoint,
                    guest_ports=[p.guest_port for p in record.ports],
                )  # fmt: skip
            finally:
                await machine.close()
            return checkpoint_of(created)

    async def _write_checkpoint(
        self,
        machine: Machine,
        ram_base: Path,
        layer: str,
        *,
        session_id: str,
        name: str | None,
        kind: CheckpointKind,
        image: Image,
        shape: MachineShape,
        parent: str | None,
        guest_ports: list[int],
    ) -> CheckpointRecord:
        started = time.perf_counter()
        checkpoint_id = new_checkpoint_id()
        tmp = self.home.checkpoints / f".tmp-{checkpoint_id}"
        tmp.mkdir()
        new_top = new_layer_name()
        try:
            try:
                stats = await machine.checkpoint(
                    self.home.layers / new_top, tmp / STATE, ram_base, tmp / RAM
                )
            finally:
                # Whatever happened, record the layer the VM now writes to.
                if (self.home.layers / new_top).exists():
                    with self.store.transaction():
                        self.store.insert_layer(new_top, backing=layer)
                        if kind == CheckpointKind.USER:
                            self.store.update_session(session_id, disk_layer=new_top)
            duration_ms = (time.perf_counter() - started) * 1000
            manifest = {
                "id": checkpoint_id, "session_id": session_id, "name": name, "kind": str(kind),
                "machine": shape.to_dict(), "qemu_version": self.build.version,
                "image": image.name, "image_hash": image.hash, "disk_layer": layer,
                "parent_checkpoint": parent, "ports": guest_ports,
                "ram_bytes": stats.ram_bytes, "state_bytes": stats.state_bytes,
                "written_bytes": stats.written_bytes, "pause_ms": stats.pause_ms,
                "base_copy_ms": stats.base_copy_ms, "device_state_ms": stats.device_state_ms,
                "written_ms": stats.written_ms, "duration_ms": duration_ms,
            }  # fmt: skip
            write_manifest(tmp, manifest)
            _fsync_dir(tmp)
            final = self._checkpoint_dir(checkpoint_id)
            os.rename(tmp, final)  # atomic: a checkpoint is all there or not at all
            _fsync_dir(self.home.checkpoints)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        record = CheckpointRecord.new(
            session_id=session_id, disk_layer=layer, image=image.name, image_hash=image.hash,
            manifest=read_manifest(final), size_bytes=stats.ram_bytes + stats.state_bytes,
            name=name, kind=kind, parent_checkpoint=parent,
        )  # fmt: skip
        record = replace(record, id=checkpoint_id)
        try:
            return self.store.insert_checkpoint(record)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise

    async def _sync_disk_layer(self, machine: Machine, record: SessionRecord) -> str:
        """The layer the VM really writes to. A forkpoint process killed between QEMU's
        disk snapshot and its store update leaves the VM on a layer the store has not
        recorded yet (stacked on the recorded one): adopt it."""
        active = (await machine.active_disk()).name
        if active != record.disk_layer:
            with self.store.transaction():
                self.store.insert_layer(active, backing=record.disk_layer)
                self.store.update_session(record.id, disk_layer=active)
        return active

    def _ram_base(self, record: SessionRecord) -> Path:
        """The RAM file the session's VM maps: that of the checkpoint it was restored from
        (which therefore cannot be deleted while the session lives)."""
        if record.parent_checkpoint is None:
            raise InternalError(f"session {record.id} has no checkpoint to map its RAM from")
        return self._checkpoint_dir(record.parent_checkpoint) / RAM

    def _checkpoint_named(self, name: str) -> bool:
        try:
            self.store.get_checkpoint(name)
        except NotFound:
            return False
        return True

    async def remove_checkpoint(self, checkpoint: str) -> None:
        """Delete a checkpoint. :raises InUse: sessions or checkpoints depend on it."""
        record = self.store.get_checkpoint(checkpoint)
        self.store.delete_checkpoint(record.id)
        shutil.rmtree(self._checkpoint_dir(record.id), ignore_errors=True)
        self.gc()

    # -- fork & rollback ---------------------------------------------------------------

    async def fork(self, checkpoint: str, count: int = 1) -> list[Session | ForkpointError]:
        """Start ``count`` new sessions from a checkpoint, in parallel.

        Each gets a new id and its own host ports for the checkpoint's forwarded guest
        ports. A fork that fails is reported in its slot; the others still run.
        """
        from forkpoint.requests import ForkRequest, parse

        parse(ForkRequest, count=count)
        record = self.store.get_checkpoint(checkpoint)
        source = self._source_session(record)
        image = get_image(record.image_hash)
        memory, cpus = _shape_of(record)
        shape = self._shape(image, memory, cpus)
        check_compatible(record.id, read_manifest(self._checkpoint_dir(record.id)), shape)
        network = Network(source.network) if source else Network.USER
        guest_ports = [int(p) for p in record.manifest.get("ports", [])]
        together = ResumeTogether(count)

        async def one_fork() -> Session:
            async with together.member() as loaded:
                return await self._start_session(
                    record, image, shape, name=None, guest_ports=guest_ports,
                    network=network, loaded=loaded,
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

    def _source_session(self, record: CheckpointRecord) -> SessionRecord | None:
        try:
            return self.store.get_session(record.session_id)
        except NotFound:
            return None

    def lineage(self, record: SessionRecord) -> list[str]:
        """Checkpoints a session may roll back to: its own, and those it descends from."""
        own = [c.id for c in self.store.list_checkpoints(session_id=record.id)]
        ancestors: list[str] = []
        current = record.parent_checkpoint
        while current and current not in ancestors:
            ancestors.append(current)
            try:
                current = self.store.get_checkpoint(current).parent_checkpoint
            except NotFound:
                break
        return own + ancestors

    async def rollback(self, session: str, checkpoint: str | None = None) -> Session:
        """Reset a session — same id, same host ports — to a checkpoint of its lineage
        (default: its latest own checkpoint, else the one it started from). Works on a
        crashed session too.

        :raises Conflict: the checkpoint is not in the session's lineage.
        """
        record = self.store.get_session(session)
        async with session_lock_async(self.home, record.id):
            record = self.store.get_session(record.id)
            if checkpoint is None:
                own = self.store.list_checkpoints(session_id=record.id)
                latest = own[-1].id if own else record.parent_checkpoint
                if latest is None:
                    raise Conflict(f"session {record.id} has no checkpoint to roll back to")
                target = self.store.get_checkpoint(latest)
            else:
                target = self.store.get_checkpoint(checkpoint)
                if target.id not in self.lineage(record):
                    raise Conflict(
                        f"checkpoint {target.id} is not in the lineage of session {record.id}; "
                        f"use `forkpoint fork {target.id}` to start a new session from it"
                    )
            image = get_image(target.image_hash)
            shape = self._shape(image, record.memory_mib, record.cpus)
            check_compatible(target.id, read_manifest(self._checkpoint_dir(target.id)), shape)
            await asyncio.to_thread(self._kill_processes, record)
            files = self.files(record.id)
            generation = record.generation + 1
            try:
                started = await start_restored(
                    self.home, files, self._checkpoint_dir(target.id), target.disk_layer, shape,
                    self._boot(image, shape),
                    [(p.host_port, p.guest_port) for p in record.ports],
                    record.network == Network.USER, record.name or record.id,
                    identity_token(record.id, generation),
                )  # fmt: skip
            except ForkpointError:
                self.store.update_session(record.id, state=SessionState.CRASHED, qemu_pid=None)
                raise
            with self.store.transaction():
                self.store.insert_layer(started.disk_layer, backing=target.disk_layer)
                record = self.store.update_session(
                    record.id, state=SessionState.RUNNING, disk_layer=started.disk_layer,
                    qemu_pid=started.machine.pid, generation=generation,
                    parent_checkpoint=target.id,
                    aux_pids=[started.passt_pid] if started.passt_pid else [],
                )  # fmt: skip
            await started.machine.close()
        self.gc()
        return session_of(record)

    # -- ports -------------------------------------------------------------------------

    async def forward_port(self, session: str, guest_port: int) -> Port:
        """Forward ``guest_port`` to a free port on the host's 127.0.0.1 (idempotent)."""
        from forkpoint.requests import PortRequest, parse

        parse(PortRequest, guest_port=guest_port)
        record = self.store.get_session(session)
        existing = record.port_for(guest_port)
        if existing:
            return Port(guest_port=existing.guest_port, host_port=existing.host_port)
        async with session_lock_async(self.home, record.id):
            record = self._require_running(self.store.get_session(record.id))
            if record.network != Network.USER:
                raise Conflict(f"session {record.id} has no network (--network none)")
            host_port = await self._allocate_host_port(record.id, guest_port)
            record = self.store.get_session(record.id)
            files = self.files(record.id)
            for pid in record.aux_pids:
                await asyncio.to_thread(stop_passt, files, pid)
            forwards = [(p.host_port, p.guest_port) for p in record.ports]
            pid = await asyncio.to_thread(start_passt, files, forwards)
            self.store.update_session(record.id, aux_pids=[pid])
            return Port(guest_port=guest_port, host_port=host_port)

    async def _allocate_host_port(self, session_id: str, guest_port: int) -> int:
        async with self._ports_lock, global_lock_async(self.home, "ports"):
            taken = self.store.allocated_host_ports()
            for _ in range(100):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    port = int(probe.getsockname()[1])
                if port not in taken:
                    self.store.add_port(session_id, guest_port, port)
                    return port
        raise InternalError("no free host port found on 127.0.0.1")

    # -- guest access ------------------------------------------------------------------

    def _require_running(self, record: SessionRecord) -> SessionRecord:
        record = self._refresh(record)
        if record.state != SessionState.RUNNING:
            hint = "; roll it back: forkpoint rollback " + record.id
            raise Conflict(
                f"session {record.id} is {record.state}"
                + (hint if record.state == SessionState.CRASHED else "")
            )
        return record

    @contextlib.asynccontextmanager
    async def agent(self, session: str) -> AsyncIterator[AgentClient]:
        """A connected agent client for a running session (one at a time per session)."""
        record = self._require_running(self.store.get_session(session))
        files = self.files(record.id)
        async with session_lock_async(self.home, record.id):
            # A forkpoint process killed mid-checkpoint leaves the VM paused: resume it.
            machine = await Machine.adopt(files, record.qemu_pid or 0)
            try:
                await machine.resume_if_paused()
            finally:
                await machine.close()
        async with global_lock_async(self.home, f"agent-{record.id}", timeout_s=600):
            # Every connection re-sends the session's identity: the guest applies it unless
            # it already did (the copy posted right after the restore may not have arrived).
            identity = fresh_identity(
                identity_token(record.id, record.generation), record.name or record.id
            )
            client = await AgentClient.connect(
                files.agent_socket, timeout=AGENT_READY_TIMEOUT_S, identity=identity
            )
            async with client:
                yield client

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
    ) -> CommandResult:
        """Run a command in the guest to completion (exit code passed through, not raised).

        Output streams to ``on_stdout``/``on_stderr`` as it comes, and is returned as
        ``output_encoding`` (UTF-8 text, or base64 for the exact bytes).
        :raises CommandTimeout: past ``timeout`` seconds (the command is killed).
        """
        async with self.agent(session) as agent:
            r = await agent.exec(
                command, cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                on_stdout=on_stdout, on_stderr=on_stderr,
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
        async with self.agent(session) as agent:
            await agent.rename(src, dst, user=user)

    async def remove_file(self, session: str, path: str) -> None:
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


def _shape_of(record: CheckpointRecord) -> tuple[int, int]:
    machine = record.manifest.get("machine", {})
    return int(machine.get("memory_mib", 512)), int(machine.get("cpus", 1))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
