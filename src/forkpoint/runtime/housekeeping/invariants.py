"""What must hold of a home after any fault: the checks the fault campaign runs after
every injected crash, and the tests too (one function, so both check the same thing).

In ``src``, not ``tests``: it knows the home's layout and the store's rules exactly as the
runtime does (``orphans``, ``integrity``), and stays type-checked with them.

- the store and the files agree: every checkpoint record has its files, whole (the cheap
  integrity check of a restore); no checkpoint, layer or session file without a record;
  every layer record has its file, and every layer a session or checkpoint names is
  recorded;
- every session is ``running`` (its QEMU alive, and passt if it has a network) or
  honestly ``crashed``/``stopped`` with a checkpoint to roll back to; none is left
  ``creating`` with nobody creating it;
- no QEMU or passt of this home that no running session (or warm VM or standby row)
  owns, and no egress proxy of its uids that no session holds;
- (the caller's ledger) nothing a completed operation reported is gone.

Restoring every checkpoint and looking at its marker needs VMs: :func:`check_restores`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from forkpoint.config import Home
from forkpoint.errors import Conflict, ForkpointError
from forkpoint.models import Network, SessionState
from forkpoint.runtime.checkpoints.integrity import check_before_restore
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles
from forkpoint.runtime.housekeeping.orphans import open_paths, orphan_files
from forkpoint.store import Store, session_lock
from forkpoint.store.db import session_uids
from forkpoint.store.standby import StandbyStore
from forkpoint.store.warm import WarmStore
from forkpoint.vm.egress_proxies import proxy_uids
from forkpoint.vm.process import is_running, pids_with_arg

__all__ = ["Ledger", "check_home", "check_restores", "home_processes"]

_VM_NAME_RE = re.compile(r"forkpoint-(s-[0-9a-f]+)")


@dataclass
class Ledger:
    """What completed operations reported: checkpoint id → the marker its session held
    when it was taken; sessions reported made and not removed; every session id seen."""

    checkpoints: dict[str, str] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)


def home_processes(home: Home, session_ids: Iterable[str]) -> list[tuple[int, str]]:
    """``(pid, session id)`` of every QEMU of this home (its pidfile is under it) and
    every passt of ``session_ids`` (its log path names the VM, not the home)."""
    ids = set(session_ids)
    root = str(home.root)
    found: list[tuple[int, str]] = []
    for pid, arg in pids_with_arg(lambda a: a.startswith(root) or "forkpoint-passt-" in a):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        match = _VM_NAME_RE.search(cmdline)
        if match and (arg.startswith(root) or match.group(1) in ids):
            found.append((pid, match.group(1)))
    return found


def check_home(home: Home, store: Store, ledger: Ledger | None = None) -> list[str]:
    """Every violation found, one line each (empty: all invariants hold). Blocking."""
    problems: list[str] = []
    layers = store.layer_names()
    checkpoints = store.list_checkpoints()
    sessions = store.list_sessions()
    for c in checkpoints:
        try:
            check_before_restore(CheckpointFiles.of(home, c.id), c.manifest)
        except ForkpointError as error:
            problems.append(f"checkpoint {c.id}: {error.message}")
        if c.disk_layer not in layers:
            problems.append(f"checkpoint {c.id}: its disk layer {c.disk_layer} is not recorded")
    for name in layers:
        if not (home.layers / name).exists():
            problems.append(f"layer {name} is recorded but its file is missing")
    running: dict[str, set[int]] = {}
    for s in sessions:
        files_name = f"forkpoint-{s.id}"
        if s.disk_layer not in layers:
            problems.append(f"session {s.id}: its disk layer {s.disk_layer} is not recorded")
        if s.state == SessionState.CREATING:
            try:
                with session_lock(home, s.id, timeout_s=0):
                    problems.append(f"session {s.id} is left creating, its creator gone")
            except Conflict:
                pass  # being created right now
        elif s.state == SessionState.RUNNING:
            if not is_running(s.qemu_pid, files_name):
                problems.append(f"session {s.id} says running but its QEMU is gone")
            elif s.network == Network.USER and not any(
                is_running(p, files_name) for p in s.aux_pids
            ):
                problems.append(f"session {s.id} runs without its passt")
            running[s.id] = {p for p in (s.qemu_pid, *s.aux_pids) if p}
        elif s.parent_checkpoint is None and not any(c.session_id == s.id for c in checkpoints):
            problems.append(f"session {s.id} is {s.state} with no checkpoint to recover from")
    busy = _held_open(home)
    for path in orphan_files(home, store):
        if str(path) in busy:
            continue  # a VM's layer its killed checkpoint did not record: adopted next time
        problems.append(f"{path.relative_to(home.root)} has no record")
    for warm in WarmStore(store).all():  # paused, waiting for a create: owned by its row
        running[warm.id] = warm.pids
    for standby in StandbyStore(store).all():  # paused, waiting for a rollback: its row's
        running.setdefault(standby.session_id, set()).update(
            {standby.qemu_pid} if standby.qemu_pid else set()
        )
    seen = {s.id for s in sessions} | set(running) | (ledger.seen if ledger else set())
    for pid, session_id in home_processes(home, seen):
        if pid not in running.get(session_id, set()):
            problems.append(f"process {pid} of {session_id} belongs to no running session")
    held = {s.uid for s in sessions}
    for uid in proxy_uids(session_uids(home.root)):
        if uid not in held:
            problems.append(f"the egress proxy of uid {uid} belongs to no session")
    if ledger is not None:
        ids = {c.id for c in checkpoints}
        problems += [
            f"checkpoint {c} was reported but is gone" for c in ledger.checkpoints if c not in ids
        ]
        alive = {s.id for s in sessions}
        problems += [
            f"session {s} was reported but is gone" for s in ledger.sessions if s not in alive
        ]
    return problems


def _held_open(home: Home) -> set[str]:
    return {p for p in open_paths() if p.startswith(str(home.layers))}


async def check_restores(
    ledger: Ledger, read_marker: Callable[[str], Awaitable[str | None]]
) -> list[str]:
    """Restore every checkpoint of the ledger (``read_marker(checkpoint)`` forks it and
    returns the marker the fork shows, or None) and compare the markers."""
    problems = []
    for checkpoint, marker in sorted(ledger.checkpoints.items()):
        try:
            shown = await read_marker(checkpoint)
        except ForkpointError as error:
            problems.append(f"checkpoint {checkpoint} does not restore: {error.message}")
            continue
        if shown != marker:
            problems.append(f"checkpoint {checkpoint} shows {shown!r}, not {marker!r}")
    return problems
