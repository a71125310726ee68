"""What changed between two states of a machine, and a session's step history. Part of
:mod:`forkpoint.models` (import them from there)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_DIFF_EXCLUDE",
    "FileChange",
    "HistoryStep",
    "PortChange",
    "ProcessChange",
    "StateDiff",
]

#: Paths a diff leaves out unless asked: kernel and runtime filesystems that change all
#: the time (``/tmp`` can be put back with ``include_tmp``), and ``/etc/hostname``, which
#: every restored VM (each fork, each rollback) rewrites with its own name.
DEFAULT_DIFF_EXCLUDE: tuple[str, ...] = ("/proc", "/sys", "/dev", "/run", "/tmp", "/etc/hostname")

FileType = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True)
class FileChange:
    """A path added, removed or modified from ``source`` to ``target``. ``size`` and
    ``mode`` (octal text, e.g. ``"0644"``) are the target's (the source's when removed),
    ``old_size``/``old_mode`` the source's when modified. ``patch``: a unified diff, when
    asked for and both sides are text under the size limit."""

    path: str
    change: Literal["added", "removed", "modified"]
    type: FileType
    size: int
    mode: str
    old_size: int | None = None
    old_mode: str | None = None
    patch: str | None = None


@dataclass(frozen=True)
class ProcessChange:
    """A process running in ``target`` but not in ``source`` (``started``), or the
    reverse (``gone``). A pid that runs another command counts as gone and started."""

    change: Literal["started", "gone"]
    pid: int
    command: str


@dataclass(frozen=True)
class PortChange:
    """A listening TCP socket that appeared (``opened``) or disappeared (``closed``);
    ``pid``/``command`` of its owner when known (0 / ``""`` otherwise)."""

    change: Literal["opened", "closed"]
    port: int
    address: str
    pid: int = 0
    command: str = ""


@dataclass(frozen=True)
class StateDiff:
    """From ``source`` to ``target`` (checkpoint or session ids): files, processes and
    listening ports. ``excluded``: paths left out; ``entries``: paths compared in the
    target; ``duration_ms``: the time it took."""

    source: str
    target: str
    files: tuple[FileChange, ...]
    processes: tuple[ProcessChange, ...]
    ports: tuple[PortChange, ...]
    excluded: tuple[str, ...]
    entries: int
    duration_ms: float

    @property
    def empty(self) -> bool:
        return not (self.files or self.processes or self.ports)


@dataclass(frozen=True)
class HistoryStep:
    """One automatic (or named) checkpoint of a session with history. ``step`` counts
    from 1; ``label`` is the command or the path written; ``size_bytes`` is what the
    checkpoint itself costs on disk (its RAM and device state, less what its RAM file
    shares with other checkpoints: the pages that did not change); ``forks``: sessions
    started from it."""

    step: int
    checkpoint: str
    label: str
    created_at: str
    size_bytes: int
    automatic: bool
    forks: tuple[str, ...] = ()
