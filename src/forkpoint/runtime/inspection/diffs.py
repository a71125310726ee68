"""Diffs of two machine states: files, processes and listening ports.

A state is read by the guest agent's ``scan`` (one walk of the tree, the process list and
the listening sockets). A session is scanned as it runs. A checkpoint is scanned through a
short-lived fork of it (no network, no ports): a fork costs ≈ 70–150 ms here, far less than
the walk itself, and it is the only way to see a checkpoint's *processes* and sockets
(they exist only in its RAM); reading the frozen qcow2 layers offline would need an ext4
reader on the host and still show no process. A checkpoint never changes, so its scan is
kept (``$FORKPOINT_HOME/scans/``) and the next diff against it scans only the live side.
"""

from __future__ import annotations

import array
import base64
import difflib
import hashlib
import json
import os
import stat
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from forkpoint.errors import InvalidInput
from forkpoint.models import FileChange, PortChange, ProcessChange, StateDiff
from forkpoint.models.history import DEFAULT_DIFF_EXCLUDE, FileType
from forkpoint.protocol import ListeningSocket, ProcessInfo, ScanResult, from_wire, to_wire

__all__ = [
    "PATCH_MAX_BYTES",
    "FileMeta",
    "Scan",
    "ScanCache",
    "compare",
    "exclusions",
    "parse_scan",
    "unified_patch",
]

#: Files larger than this get no ``patch`` (and neither do binary ones).
PATCH_MAX_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class FileMeta:
    kind: FileType
    size: int
    mode: int
    fingerprint: tuple[int, int]  # inode, ctime (ns)


@dataclass(frozen=True)
class Scan:
    files: dict[str, FileMeta]
    processes: list[ProcessInfo]
    listening: list[ListeningSocket]


def exclusions(include_tmp: bool, exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The paths a diff leaves out. :raises InvalidInput: one is not absolute."""
    for path in exclude:
        if not path.startswith("/") or "\0" in path:
            raise InvalidInput(f"--exclude wants absolute guest paths, not {path!r}")
    base = [p for p in DEFAULT_DIFF_EXCLUDE if not (include_tmp and p == "/tmp")]
    return tuple(sorted({*base, *(p.rstrip("/") or "/" for p in exclude)}))


def parse_scan(result: ScanResult, exclude: tuple[str, ...] = ()) -> Scan:
    """The agent's packed walk as a path → :class:`FileMeta` map (``exclude``d paths,
    which the walk lists but does not enter, left out)."""
    paths = zlib.decompress(base64.b64decode(result.paths)).split(b"\0")
    numbers = array.array("q")
    numbers.frombytes(zlib.decompress(base64.b64decode(result.numbers)))
    if sys.byteorder != "little":
        numbers.byteswap()
    files: dict[str, FileMeta] = {}
    skip = set(exclude)
    for i in range(min(result.count, len(numbers) // 4, len(paths))):
        path = paths[i].decode("utf-8", "surrogateescape")
        if path in skip:
            continue
        size, mode, ino, ctime_ns = numbers[i * 4 : i * 4 + 4]
        files[path] = FileMeta(_type(mode), size, stat.S_IMODE(mode), (ino, ctime_ns))
    return Scan(files, list(result.processes), list(result.listening))


def _type(mode: int) -> FileType:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _mode(mode: int) -> str:
    return f"{stat.S_IMODE(mode):04o}"


def _printable(path: str) -> str:
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def compare(
    a: Scan, b: Scan, *, source: str, target: str, excluded: tuple[str, ...], duration_ms: float
) -> StateDiff:
    """What changed from ``a`` to ``b``. A directory counts as modified only when its mode
    changed (its mtime follows its entries, which are listed themselves)."""
    changes: list[FileChange] = []
    for path in sorted(a.files.keys() | b.files.keys()):
        old, new = a.files.get(path), b.files.get(path)
        shown = _printable(path)
        if old is None and new is not None:
            changes.append(FileChange(shown, "added", new.kind, new.size, _mode(new.mode)))
        elif new is None and old is not None:
            changes.append(FileChange(shown, "removed", old.kind, old.size, _mode(old.mode)))
        elif old is not None and new is not None and old != new:
            if old.kind == new.kind == "dir" and old.mode == new.mode:
                continue
            changes.append(
                FileChange(
                    shown,
                    "modified",
                    new.kind,
                    new.size,
                    _mode(new.mode),
                    old_size=old.size,
                    old_mode=_mode(old.mode),
                )  # fmt: skip
            )
    commands = {p.pid: p.cmd for p in (*a.processes, *b.processes)}
    old_procs = {(p.pid, p.cmd) for p in a.processes}
    new_procs = {(p.pid, p.cmd) for p in b.processes}
    processes = [
        *(ProcessChange("gone", pid, cmd) for pid, cmd in sorted(old_procs - new_procs)),
        *(ProcessChange("started", pid, cmd) for pid, cmd in sorted(new_procs - old_procs)),
    ]
    old_ports = {(s.port, s.address): s.pid for s in a.listening}
    new_ports = {(s.port, s.address): s.pid for s in b.listening}
    ports = [
        *(
            PortChange("closed", port, addr, pid, commands.get(pid, ""))
            for (port, addr), pid in sorted(old_ports.items())
            if (port, addr) not in new_ports
        ),
        *(
            PortChange("opened", port, addr, pid, commands.get(pid, ""))
            for (port, addr), pid in sorted(new_ports.items())
            if (port, addr) not in old_ports
        ),
    ]
    return StateDiff(
        source=source, target=target, files=tuple(changes), processes=tuple(processes),
        ports=tuple(ports), excluded=excluded, entries=len(b.files),
        duration_ms=round(duration_ms, 1),
    )  # fmt: skip


def patch_candidates(diff: StateDiff) -> list[FileChange]:
    """Regular files small enough for a ``patch``."""
    return [
        c
        for c in diff.files
        if c.type == "file" and max(c.size, c.old_size or 0) <= PATCH_MAX_BYTES
    ]


def unified_patch(path: str, old: bytes | None, new: bytes | None) -> str | None:
    """A unified diff of two versions (None: absent), or None when either is binary."""
    texts: list[list[str]] = []
    for data in (old, new):
        if data is None:
            texts.append([])
            continue
        if b"\0" in data:
            return None
        try:
            texts.append(data.decode("utf-8").splitlines(keepends=True))
        except UnicodeDecodeError:
            return None
    lines = difflib.unified_diff(
        texts[0], texts[1],
        fromfile="/dev/null" if old is None else f"a{path}",
        tofile="/dev/null" if new is None else f"b{path}",
    )  # fmt: skip
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


class ScanCache:
    """Scans of checkpoints (which never change), one file per checkpoint and walk."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, checkpoint_id: str, roots: list[str], exclude: tuple[str, ...]) -> Path:
        key = hashlib.sha256(json.dumps([roots, list(exclude)]).encode()).hexdigest()[:12]
        return self.directory / f"{checkpoint_id}-{key}.json"

    def get(
        self, checkpoint_id: str, roots: list[str], exclude: tuple[str, ...]
    ) -> ScanResult | None:
        try:
            data = json.loads(self._path(checkpoint_id, roots, exclude).read_bytes())
        except (OSError, ValueError):
            return None
        try:
            return from_wire(ScanResult, data)
        except Exception:  # a file of an older format: scan again
            return None

    def put(
        self, checkpoint_id: str, roots: list[str], exclude: tuple[str, ...], result: ScanResult
    ) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(checkpoint_id, roots, exclude)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(to_wire(result)))
        os.replace(tmp, path)

    def forget(self, checkpoint_id: str) -> None:
        for path in self.directory.glob(f"{checkpoint_id}-*.json"):
            path.unlink(missing_ok=True)
