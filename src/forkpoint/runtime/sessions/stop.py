"""Stopping a session's VM: its QEMU and passt end, the session stays (state ``stopped``).

Its disk layers, port allocations and checkpoints stay, so ``rollback`` to a checkpoint
brings it back with the same id and host ports (``pause`` checkpoints first, so that
``resume`` can).
"""

from __future__ import annotations

from forkpoint.models import SessionState
from forkpoint.runtime.sessions.cleanup import kill_session_processes
from forkpoint.store import KEEP, Keep, Store
from forkpoint.vm.files import VmFiles

__all__ = ["stop_vm"]


def stop_vm(
    store: Store, files: VmFiles, session_id: str, *, expires_at: str | None | Keep = KEEP
) -> None:
    """Kill the session's processes and record it stopped (and its new ``expires_at``);
    blocking, under the session's lock."""
    record = store.get_session(session_id)
    kill_session_processes(files, record)
    store.update_session(
        record.id, state=SessionState.STOPPED, qemu_pid=None, aux_pids=[], expires_at=expires_at
    )
