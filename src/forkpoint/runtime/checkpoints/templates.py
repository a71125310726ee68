"""Image templates: each image booted once per machine shape, then checkpointed.

Creating a session is a fork of its image's template, so the guest boot (seconds under
TCG) happens once per image and shape, not once per session.
"""

from __future__ import annotations

import asyncio
import shutil

from forkpoint.agent_client import AgentClient
from forkpoint.config import Home
from forkpoint.errors import ForkpointError, InternalError
from forkpoint.images import Image
from forkpoint.models import CheckpointKind
from forkpoint.protocol import SpawnResult
from forkpoint.runtime.checkpoints.writer import Checkpointer, CheckpointOrigin
from forkpoint.runtime.sessions.limits import prepare_cgroup, remove_cgroup
from forkpoint.runtime.sessions.machines import SESSIONLESS, boot_files, new_layer_name
from forkpoint.store import CheckpointRecord, Store, global_lock_async
from forkpoint.vm import Machine, MachineShape, VmFiles, create_overlay, qemu_build

__all__ = ["Templates"]

_BOOT_TIMEOUT_S = 180.0
_LOCK_TIMEOUT_S = 300.0
#: How long a started image command may take to open a listening socket before the
#: template is checkpointed anyway (a server's first request then waits for the rest).
_LISTEN_WAIT_S = 30.0
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp
#: How long an image's service may take to pass its ready check (a Jupyter kernel importing
#: pandas and matplotlib takes about a minute under TCG).
_READY_WAIT_S = 300.0


class Templates:
    """The template checkpoints of one home, booted on first use."""

    def __init__(self, home: Home, store: Store, checkpointer: Checkpointer) -> None:
        self.home = home
        self.store = store
        self.checkpointer = checkpointer

    async def get(self, image: Image, shape: MachineShape) -> CheckpointRecord:
        """The checkpoint of ``image`` booted to agent-ready on this machine shape (booted
        now if there is none; another process booting it is waited for).

        :raises InternalError: the boot failed (with the VM's log tail).
        """
        if (existing := await asyncio.to_thread(self._existing, image, shape)) is not None:
            return existing
        async with global_lock_async(self.home, f"template-{image.hash}", _LOCK_TIMEOUT_S):
            if (existing := await asyncio.to_thread(self._existing, image, shape)) is not None:
                return existing
            # gc must not collect the template's base layer before the template refers to it
            async with global_lock_async(self.home, "gc", _LOCK_TIMEOUT_S):
                return await self._boot(image, shape)

    def _existing(self, image: Image, shape: MachineShape) -> CheckpointRecord | None:
        checkpoint_id = self.store.get_template(image.hash, shape.key)
        if checkpoint_id is None or not self.checkpointer.files(checkpoint_id).complete():
            return None
        return self.store.get_checkpoint(checkpoint_id)

    async def _boot(self, image: Image, shape: MachineShape) -> CheckpointRecord:
        origin = CheckpointOrigin(
            session_id=f"template-{image.hash}", name=None, kind=CheckpointKind.TEMPLATE,
            image=image, shape=shape, parent=None, guest_ports=(),
        )  # fmt: skip
        try:
            record = await self.boot(image, shape, origin, f"template-{image.hash}-{shape.key}")
        except ForkpointError as error:
            raise InternalError(
                f"booting image {image.name} to build its template failed: {error.message}",
                log_tail=error.log_tail,
            ) from error
        await asyncio.to_thread(self.store.set_template, image.hash, shape.key, record.id)
        return record

    async def boot(
        self,
        image: Image,
        shape: MachineShape,
        origin: CheckpointOrigin,
        name: str,
        disk: str | None = None,
    ) -> CheckpointRecord:
        """Boot ``image`` to agent-ready with its service started and checkpoint it as
        ``origin`` says; the VM is gone on return. Its disk: a new layer on the image's
        root filesystem, or on layer ``disk`` (a paused session's, to boot it anew).
        ``name``: its VM directory's and cgroup's. The caller holds the ``gc`` lock.

        :raises ForkpointError: the boot failed (with the VM's log tail).
        """
        directory = self.home.sessions / name
        files = VmFiles(directory, f"forkpoint-{directory.name}")
        await asyncio.to_thread(shutil.rmtree, files.dir, ignore_errors=True)
        files.ensure()
        base = new_layer_name()
        backing = image.rootfs if disk is None else self.home.layers / disk
        await asyncio.to_thread(create_overlay, backing, self.home.layers / base)
        await asyncio.to_thread(self.store.insert_layer, base, disk)
        cgroup = await asyncio.to_thread(prepare_cgroup, self.home, directory.name, shape)
        machine = await Machine.start(
            qemu_build(), shape, boot_files(image, shape), files, self.home.layers / base,
            # Our own image, bounded by the boot timeout: its console stays a file, so a
            # boot that panics leaves it to read (a session's is a capped ring).
            jail=SESSIONLESS, cgroup=cgroup, console_file=True,
        )  # fmt: skip
        try:
            async with await AgentClient.connect(
                files.agent_socket, timeout=_BOOT_TIMEOUT_S
            ) as agent:
                await agent.hello()
                await _start_image_command(agent, image)
            return await self.checkpointer.write(machine, base, origin)
        except ForkpointError as error:
            error.log_tail = files.log_tail() or error.log_tail  # read before it is deleted
            raise
        finally:
            await machine.kill()
            await asyncio.to_thread(shutil.rmtree, files.dir, ignore_errors=True)
            await asyncio.to_thread(remove_cgroup, directory.name)


# Only the shell's builtins: an image may have no ``cat``.
_READ_LISTENERS = (
    'for f in /proc/net/tcp /proc/net/tcp6 "/proc/$0/stat"; do [ -r "$f" ] && '
    'while read -r l || [ -n "$l" ]; do echo "$l"; done <"$f"; done; true'
)


async def _listeners(agent: AgentClient, pid: int) -> tuple[int, bool] | None:
    """Listening TCP sockets in the guest, and whether ``pid`` still runs (None: could
    not tell)."""
    try:
        argv = ["/bin/sh", "-c", _READ_LISTENERS, str(pid)]
        result = await agent.exec(argv, user="root", timeout=10)
    except ForkpointError:
        return None
    rows = [line.split() for line in result.stdout.decode(errors="replace").splitlines()]
    count = sum(1 for r in rows if len(r) > 3 and r[0].endswith(":") and r[3] == _LISTEN)
    alive = any(r and r[0] == str(pid) for r in rows)
    return count, alive


async def _start_image_command(agent: AgentClient, image: Image) -> None:
    """Start an image's service — an OCI image's ``ENTRYPOINT``/``CMD`` (as its ``USER``,
    in its ``WORKDIR``), a known image's ``start`` — in the background, so every session of
    the template has it running. Wait until its ready check passes (a known image's), or
    (bounded) until it listens on a new TCP port, so a fresh session's server answers at
    once."""
    config = image.config or {}
    argv = [str(a) for a in config.get("start") or []]
    if not argv:
        return
    before = await _listeners(agent, 0)
    started = await agent.spawn(argv)
    if config.get("ready"):
        await _wait_ready(agent, image, started, str(config["ready"]))
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _LISTEN_WAIT_S
    while before is not None and loop.time() < deadline:
        now = await _listeners(agent, started.pid)
        if now is None or now[0] > before[0] or not now[1]:
            return
        await asyncio.sleep(0.2)


async def _wait_ready(agent: AgentClient, image: Image, service: SpawnResult, ready: str) -> None:
    """Run ``ready`` until it exits 0.

    :raises InternalError: the service exited, or was not ready in time (with the last
        line it wrote).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _READY_WAIT_S
    while True:
        check = await agent.exec(["/bin/sh", "-c", ready], user="root", timeout=30)
        if check.exit_code == 0:
            return
        listed = await _listeners(agent, service.pid)
        exited = listed is not None and not listed[1]
        if exited or loop.time() > deadline:
            log = await agent.exec(["tail", "-n", "1", service.log_path], user="root")
            last = log.stdout.decode(errors="replace").strip() or "no output"
            state = "exited" if exited else "was not ready in time"
            raise InternalError(
                f"image {image.name}: its service {state} (ready check: {ready}): {last}"
            )
        await asyncio.sleep(0.25)
