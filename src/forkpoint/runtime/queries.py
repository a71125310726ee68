"""What the runtime knows without starting anything: sessions and checkpoints as they are.

:class:`Queries` is the part of :class:`~forkpoint.runtime.Runtime` that reads: the store,
and whether each session's QEMU still lives. It loads neither the VM engine nor asyncio,
so the CLI's quick path (``forkpoint ls --json``) uses it alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from forkpoint.config import Home
from forkpoint.errors import Conflict, ForkpointError, NotFound
from forkpoint.models import (
    Checkpoint,
    CheckpointKind,
    HostStatus,
    Metric,
    Network,
    Session,
    SessionState,
)
from forkpoint.runtime.models import checkpoint_of, session_of
from forkpoint.runtime.usage import (
    checkpoint_disk_bytes,
    checkpoint_shared_bytes,
    session_disk_bytes,
)
from forkpoint.store import CheckpointRecord, SessionRecord, Store, session_lock
from forkpoint.vm.files import VmFiles
from forkpoint.vm.process import is_running

__all__ = ["LISTED_KINDS", "Queries"]

#: The checkpoints a list shows: the user's own, and the steps of a history.
LISTED_KINDS = (CheckpointKind.USER, CheckpointKind.HISTORY)


class Queries:
    """Reads of one home's sessions and checkpoints (blocking; safe across processes)."""

    def __init__(self, home_: Home, store: Store) -> None:
        self.home = home_
        self.store = store

    def files(self, session_id: str) -> VmFiles:
        return VmFiles(self.home.sessions / session_id, f"forkpoint-{session_id}")

    def refresh(self, record: SessionRecord, *, locked: bool = False) -> SessionRecord:
        """Notice a QEMU that died behind our back: the session becomes ``crashed``; so
        does a ``creating`` one whose creator was killed (its lock is free).

        Only with the session's lock (``locked``: the caller holds it; else it is tried
        without waiting): a rollback or restore holding it has killed the old QEMU and
        is starting the new one, which a query must neither call a crash nor kill.
        """
        files = self.files(record.id)
        if record.state == SessionState.CREATING:
            pass  # its creator holds the lock while it lives: without it, it died
        elif record.state != SessionState.RUNNING:
            return record
        elif is_running(record.qemu_pid, files.name):
            if record.network != Network.USER or any(
                is_running(pid, files.name) for pid in record.aux_pids
            ):
                return record
            return self._restart_network(record, locked=locked)
        if not locked:
            try:
                with session_lock(self.home, record.id, timeout_s=0):
                    return self.refresh(self.store.get_session(record.id), locked=True)
            except Conflict:
                return record  # an operation is under way: it decides
        from forkpoint.runtime.sessions.cleanup import kill_session_processes
        from forkpoint.store.standby import StandbyStore  # rare: not loaded for every query

        standby = StandbyStore(self.store).get(record.id)  # kept for the rollback to come
        # Its passt has nothing left to serve.
        kill_session_processes(files, record, standby.tag if standby else None)
        return self.store.update_session(record.id, state=SessionState.CRASHED, qemu_pid=None)

    def _restart_network(self, record: SessionRecord, *, locked: bool) -> SessionRecord:
        """Its QEMU runs but its passt died (killed, out of memory): the guest would stay
        cut off for good (found by the fault campaign). Start a new one, as a port
        forward does; with the session's lock, like a crash."""
        if not locked:
            try:
                with session_lock(self.home, record.id, timeout_s=0):
                    return self.refresh(self.store.get_session(record.id), locked=True)
            except Conflict:
                return record  # an operation is under way: it decides
        from forkpoint.runtime.sessions.ports import HostPorts  # rare: not loaded for every query

        try:
            HostPorts(self.home, self.store).restart_network(self.files(record.id), record.id)
        except ForkpointError:
            return record  # the next query tries again
        return self.store.get_session(record.id)

    def require_running(self, session: str, *, locked: bool = True) -> SessionRecord:
        """The running session's record. ``locked``: the caller holds its lock.
        :raises Conflict: it is not running."""
        record = self.refresh(self.store.get_session(session), locked=locked)
        if record.state != SessionState.RUNNING:
            hint = "; roll it back: forkpoint rollback " + record.id
            raise Conflict(
                f"session {record.id} is {record.state}"
                + (hint if record.state == SessionState.CRASHED else "")
            )
        return record

    def upkeep(self) -> list[str]:
        """Remove sessions past their timeout, keep logs capped; returns the ids removed
        (every CLI call and the server's reaper run it; see :mod:`.upkeep`)."""
        from forkpoint.runtime.housekeeping.upkeep import upkeep

        return upkeep(self)

    # -- queries (blocking) ------------------------------------------------------------

    def get(self, session: str) -> Session:
        """The session with this id or name. :raises NotFound:"""
        return self.session_of(self.refresh(self.store.get_session(session)))

    def list_sessions(self) -> list[Session]:
        listed = []
        for record in self.store.list_sessions():
            try:
                listed.append(self.session_of(self.refresh(record)))
            except NotFound:
                continue  # removed by another process since the list was read
        return listed

    def get_checkpoint(self, checkpoint: str) -> Checkpoint:
        return self.checkpoint_of(self.store.get_checkpoint(checkpoint))

    def host_status(self) -> HostStatus:
        """The host's room now against the limits (sessions, memory, disk, VMs ahead)."""
        from .capacity import host_status

        return host_status(self.home, self.store)

    def latest_metrics(self) -> dict[str, Metric]:
        """Each session's last metrics sample (taken while a long-lived door runs), by id."""
        from forkpoint.store.metrics import MetricsStore

        return MetricsStore(self.store).latest()

    def list_checkpoints(
        self, session: str | None = None, *, kinds: Sequence[CheckpointKind] = LISTED_KINDS
    ) -> list[Checkpoint]:
        """Checkpoints, oldest first (of one session): by default the user's and the
        history steps, not forkpoint's own (templates, pauses, forks)."""
        session_id = self.store.get_session(session).id if session else None
        records = self.store.list_checkpoints(session_id=session_id, kind=kinds)
        return [self.checkpoint_of(r) for r in records]

    def session_of(self, record: SessionRecord) -> Session:
        """The record as users see it, with the disk it uses now."""
        usage = session_disk_bytes(self.home, self.files(record.id).dir, record)
        return session_of(record, usage)

    def checkpoint_of(self, record: CheckpointRecord) -> Checkpoint:
        return checkpoint_of(
            record,
            checkpoint_disk_bytes(self.home, record),
            checkpoint_shared_bytes(self.home, record),
        )
