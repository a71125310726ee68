"""Files a killed forkpoint process left behind with no record: found and removed by GC.

The store is the truth, and every operation records what it made right after making it;
a process SIGKILLed in between leaves a file no record names (found by the fault
campaign, see ``docs/reliability.md``): a restore's new disk layer, a checkpoint's staging
directory (or, killed between its rename and its insert, a whole checkpoint directory),
a session directory whose row ``rm`` had already deleted. Nothing else would ever delete
them.

An orphan is only taken when it cannot be work in progress: GC holds the ``gc`` lock (an
image template build holds it too), the file is older than ``FORKPOINT_ORPHAN_GRACE_S``
(default 600 s; every operation records its files well within that), and a layer file
is open in no process — a VM running on a layer its checkpoint had not recorded yet (the
checkpoint was killed) keeps it open, and the next checkpoint adopts it. Directories are
not held back by open files: a VM whose checkpoint was killed keeps the staging
directory's device-state file open in its fd set (found by the campaign), and would
otherwise pin that half checkpoint — RAM copy included — for its whole life.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from forkpoint.config import Home
from forkpoint.store import Store
from forkpoint.store.standby import StandbyStore
from forkpoint.store.warm import WarmStore

__all__ = ["GRACE_ENV", "open_paths", "orphan_files", "sweep_orphans"]

GRACE_ENV = "FORKPOINT_ORPHAN_GRACE_S"
_DEFAULT_GRACE_S = 600.0
_LAYER_RE = re.compile(r"^[0-9a-f]{16}\.qcow2$")
_CHECKPOINT_RE = re.compile(r"^(\.tmp-)?(c-[0-9a-f]+)$")
_SESSION_RE = re.compile(r"^s-[0-9a-f]+$")


def grace_s() -> float:
    try:
        return max(0.0, float(os.environ.get(GRACE_ENV, _DEFAULT_GRACE_S)))
    except ValueError:
        return _DEFAULT_GRACE_S


def orphan_files(home: Home, store: Store) -> list[Path]:
    """Layer files, checkpoint directories and session directories no record names,
    whatever their age (the invariant checker's view; :func:`sweep_orphans` filters)."""
    warm = WarmStore(store).all()  # a warm VM's directory and layer: a session's to be
    standbys = {s.disk_layer for s in StandbyStore(store).all()}  # a rollback's to be
    layers = store.layer_names() | {w.disk_layer for w in warm} | standbys
    checkpoints = {r.id for r in store.list_checkpoints()}
    sessions = {r.id for r in store.list_sessions()} | {w.id for w in warm}
    found: list[Path] = []
    for path in _entries(home.layers):
        name = path.name.removesuffix(".blank")
        if _LAYER_RE.match(name) and name not in layers:
            found.append(path)
    for path in _entries(home.checkpoints):
        match = _CHECKPOINT_RE.match(path.name)
        if match and (match.group(1) or match.group(2) not in checkpoints):
            found.append(path)
    for path in _entries(home.sessions):
        if _SESSION_RE.match(path.name) and path.name not in sessions:
            found.append(path)
    return found


def sweep_orphans(home: Home, store: Store) -> list[str]:
    """Delete the orphans old enough and open nowhere (the caller holds the gc lock);
    returns their names."""
    candidates = orphan_files(home, store)
    oldest = time.time() - grace_s()
    candidates = [p for p in candidates if _mtime(p) <= oldest]
    if not candidates:
        return []
    layers = [p for p in candidates if p.parent == home.layers]
    busy = open_paths() if layers else set()
    removed: list[str] = []
    for path in candidates:
        if str(path) in busy:
            continue  # a VM writes it: a layer its killed checkpoint had not recorded
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def open_paths() -> set[str]:
    """Every file some process has open (only read when there are candidates)."""
    paths: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                paths.add(os.readlink(fd))
            except OSError:
                continue
    return paths
