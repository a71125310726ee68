"""What every service of the runtime shares: one home, its store and the reads of it, the
QEMU build, the pools of VMs started ahead, and the work a long-lived door runs in the
background.

Each service (``sessions``, ``checkpoints``, ``restore``, ``guest``, ``history``,
``inspection``, ``housekeeping``) receives this and the services it uses; none imports
:mod:`forkpoint.runtime.runtime`, the façade that builds them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any

from forkpoint.config import Home
from forkpoint.errors import LimitExceeded
from forkpoint.images import Image, get_image
from forkpoint.models import SessionState
from forkpoint.runtime.capacity import SESSION_BYTES, host_limits, require_space
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles, Manifest
from forkpoint.runtime.checkpoints.templates import Templates
from forkpoint.runtime.checkpoints.writer import Checkpointer
from forkpoint.runtime.hostfit import check_host_fits
from forkpoint.runtime.queries import Queries
from forkpoint.runtime.restore.standby import Standbys
from forkpoint.runtime.sessions.ports import HostPorts
from forkpoint.runtime.sessions.warm import WarmPool
from forkpoint.store import Store
from forkpoint.vm import MachineShape, QemuBuild, detect_accel, qemu_build
from forkpoint.vm.files import VmFiles

__all__ = ["RuntimeContext"]

_log = logging.getLogger(__name__)


class RuntimeContext:
    """The state and helpers of one runtime (one process, one home)."""

    def __init__(self, home: Home, store: Store) -> None:
        self.home = home
        self.store = store
        self.queries = Queries(home, store)
        self.checkpointer = Checkpointer(home, store)
        self.templates = Templates(home, store, self.checkpointer)
        self.ports = HostPorts(home, store)
        self.warm = WarmPool(home, store)
        self.standbys = Standbys(home, store)
        #: A long-lived door refills warm VMs after a create and prepares rollback
        #: standbys after a checkpoint or rollback in the background; a CLI process does
        #: so once it has printed its result (``fill_warm``, ``prepare_rollback``).
        self.refill_in_background = False
        self.background: set[asyncio.Task[object]] = set()
        #: Per session, the checkpoint it took that is still being written (a history
        #: step's: the step returns once the VM's state is captured; see ``settled``).
        self.finishing: dict[str, asyncio.Task[object]] = {}
        #: Sessions this process forked only to look at a checkpoint (diffs), from before
        #: their row exists until they are gone: the page never shows them.
        self.scratch_sessions: set[str] = set()

    @functools.cached_property
    def build(self) -> QemuBuild:
        """The QEMU in use; identified on first need (it hashes the binary), not by the
        queries a CLI call makes (``ls``, ``show``, ``exec``)."""
        return qemu_build()

    def files(self, session_id: str) -> VmFiles:
        return self.queries.files(session_id)

    def checkpoint_files(self, checkpoint_id: str) -> CheckpointFiles:
        """Where a checkpoint's RAM, device state and manifest are."""
        return self.checkpointer.files(checkpoint_id)

    def machine(self, image: str, memory_mib: int, cpus: int) -> tuple[Image, MachineShape]:
        """The image and the machine shape to run it on (blocking: may probe KVM).

        :raises Conflict: the host has less memory (RAM + swap) or fewer CPUs than that.
        """
        check_host_fits(memory_mib, cpus)
        found = get_image(image, self.home.images)
        accel = detect_accel(self.build, self.home.cache, found.kernel)
        return found, MachineShape.for_build(self.build, accel, memory_mib, cpus)

    def manifest(self, checkpoint_id: str, shape: MachineShape) -> Manifest:
        """The checkpoint's manifest, checked to restore on ``shape`` (blocking).

        :raises IncompatibleCheckpoint: :raises DamagedCheckpoint: (before any guest starts)
        """
        from forkpoint.runtime.checkpoints.integrity import check_before_restore

        files = self.checkpoint_files(checkpoint_id)
        check_before_restore(files, self.store.get_checkpoint(checkpoint_id).manifest)
        manifest = Manifest.load(files)
        manifest.check_compatible(shape)
        return manifest

    def in_background(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def finish_later(self, session_id: str, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` (the end of a checkpoint of ``session_id``) in the background."""
        task = asyncio.get_running_loop().create_task(work)
        self.finishing[session_id] = task

        def forget(done: asyncio.Task[object]) -> None:
            if self.finishing.get(session_id) is done:
                del self.finishing[session_id]
            if not done.cancelled() and done.exception() is not None:
                error = done.exception()
                _log.warning("a checkpoint of %s was not finished: %s", session_id, error)

        task.add_done_callback(forget)

    async def settled(self, session_id: str | None = None) -> None:
        """Until the checkpoints still finishing (of ``session_id``, or all) are done. One
        that failed is logged where it ran, not raised here: its step is not recorded."""
        tasks = list(self.finishing.values()) if session_id is None else [
            t for t in (self.finishing.get(session_id),) if t is not None
        ]  # fmt: skip
        if tasks:
            await asyncio.wait(tasks)

    def require_room(self, sessions: int) -> None:
        """Refuse to start ``sessions`` more when the disk reserve or the session count
        would be crossed (before anything is made; the store re-checks the count when it
        inserts each one, so racing creates cannot both pass).

        :raises LimitExceeded:
        """
        what = "a new session" if sessions == 1 else f"{sessions} new sessions"
        require_space(self.home, sessions * SESSION_BYTES, what)
        self.require_count(sessions, what)

    def require_count(self, sessions: int, what: str) -> None:
        """:raises LimitExceeded: ``sessions`` more would pass FORKPOINT_MAX_SESSIONS."""
        most = host_limits().max_sessions
        # Queries.list_sessions notices dead VMs first: a crashed session does not count.
        active = sum(s.state == SessionState.RUNNING for s in self.queries.list_sessions())
        if active + sessions > most:
            raise LimitExceeded(
                f"{what} would make {active + sessions} running sessions, more than "
                f"FORKPOINT_MAX_SESSIONS={most}: remove or stop some first"
            )
