"""Build directories: naming, staleness, and removal that never crosses a mount.

A build works in ``images/.tmp-<hash>-<pid>/`` and renames it into place when done.
A directory whose pid is dead belongs to a killed build: nothing reads it, and the
next build deletes it. Deletion first makes sure no filesystem is mounted below it
(mmdebstrap mounts /proc, /sys, /dev in its chroot), so it cannot reach the host's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from forkpoint.errors import ImageBuildError

__all__ = ["TMP_PREFIX", "build_dir", "mounts_under", "pid_alive", "remove_stale", "remove_tree"]

TMP_PREFIX = ".tmp-"


def build_dir(images: Path, recipe_hash: str, pid: int | None = None) -> Path:
    """``images/.tmp-<hash>-<pid>`` for this process (or ``pid``)."""
    return images / f"{TMP_PREFIX}{recipe_hash}-{os.getpid() if pid is None else pid}"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (zombies count as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def _unescape(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
    return field.encode().decode("unicode_escape")


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` (deepest first), from /proc/self/mountinfo."""
    root = os.path.realpath(path)
    found: list[Path] = []
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if point == root or point.startswith(root.rstrip("/") + "/"):
            found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove_tree(path: Path) -> None:
    """Delete ``path`` recursively, unmounting anything mounted below it first.

    Raises :class:`ImageBuildError` (and deletes nothing) if a mount cannot be removed.
    """
    if not path.exists() and not path.is_symlink():
        return
    for point in mounts_under(path):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
    left = mounts_under(path)
    if left:
        raise ImageBuildError(f"refusing to delete {path}: {left[0]} is still mounted")
    shutil.rmtree(path, ignore_errors=True)


def remove_stale(images: Path) -> list[Path]:
    """Delete every ``.tmp-*`` build dir under ``images`` whose builder is dead.

    Returns what was removed. Directories that cannot be removed safely are skipped.
    """
    removed: list[Path] = []
    if not images.is_dir():
        return removed
    for entry in images.iterdir():
        if not entry.name.startswith(TMP_PREFIX):
            continue
        pid_text = entry.name.rsplit("-", 1)[-1]
        if pid_text.isdigit() and pid_alive(int(pid_text)):
            continue
        try:
            remove_tree(entry)
        except ImageBuildError:
            continue
        removed.append(entry)
    return removed
