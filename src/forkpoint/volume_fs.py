"""File operations inside a volume's directory that cannot leave it.

A volume's files are written by guests too, so any name in it may be a symlink planted to
point elsewhere on the host. Every path is therefore walked one component at a time from
the volume's root with ``O_NOFOLLOW`` (a symlink is never followed, at any depth), after
being normalised as an absolute path (``..`` cannot climb above the root). What the walk
ends on is acted on through its parent's descriptor (``dir_fd``), never by a host path.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from forkpoint.errors import Conflict, InvalidInput, NotFound
from forkpoint.models import VolumeEntry

__all__ = [
    "MAX_LIST_DEPTH",
    "open_dir",
    "parts_of",
    "list_dir",
    "make_dir",
    "normalize",
    "read_file",
    "remove",
    "set_metadata",
    "stat_path",
    "write_file",
]

#: How deep a listing may reach below the directory listed.
MAX_LIST_DEPTH = 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def normalize(path: str) -> str:
    """``path`` as an absolute, normalised volume path (``a/../b`` → ``/b``)."""
    if "\0" in path:
        raise InvalidInput("a volume path cannot contain a NUL byte")
    normal = posixpath.normpath("/" + path.strip())
    return "/" if normal == "//" else normal


def parts_of(path: str) -> list[str]:
    """The names along ``path`` (normalised: never ``..``)."""
    return [p for p in normalize(path).split("/") if p]


def open_dir(root: Path, parts: list[str]) -> int:
    """A descriptor of the directory ``parts`` below ``root``, no symlink followed (an
    ``OSError`` as the kernel says it: ENOENT, ENOTDIR, ELOOP for a symlink)."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def _dir(root: Path, parts: list[str], shown: str) -> Iterator[int]:
    """:func:`open_dir` with forkpoint's errors, closed on leaving."""
    try:
        fd = open_dir(root, parts)
    except FileNotFoundError:
        raise NotFound(f"no such path in the volume: {shown}") from None
    except OSError as e:
        raise Conflict(f"{shown}: a part of it is not a directory") from e
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def _parent(root: Path, path: str) -> Iterator[tuple[int, str]]:
    """The parent directory's descriptor and the last name of a path that is not ``/``."""
    parts = parts_of(path)
    if not parts:  # 409: a well-formed path; what is there decides (as a file that exists)
        raise Conflict("the volume's root cannot be the target of this operation")
    with _dir(root, parts[:-1], normalize(path)) as fd:
        yield fd, parts[-1]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "symlink" if stat.S_ISLNK(mode) else "unknown"


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def _entry(path: str, st: os.stat_result) -> VolumeEntry:
    return VolumeEntry(
        name=posixpath.basename(path) or "/", path=path, type=_kind(st.st_mode),
        size=st.st_size, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid,
        atime=_iso(st.st_atime), mtime=_iso(st.st_mtime), ctime=_iso(st.st_ctime),
    )  # fmt: skip


def _lstat(fd: int, name: str, shown: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        raise NotFound(f"no such path in the volume: {shown}") from None


def stat_path(root: Path, path: str) -> VolumeEntry:
    """What is at ``path`` (a symlink is described, not followed)."""
    shown = normalize(path)
    if shown == "/":
        return _entry("/", os.stat(root))
    with _parent(root, path) as (fd, name):
        return _entry(shown, _lstat(fd, name, shown))


def list_dir(root: Path, path: str, depth: int = 1) -> list[VolumeEntry]:
    """The entries below directory ``path``, ``depth`` levels deep, sorted by path."""
    if not 1 <= depth <= MAX_LIST_DEPTH:
        raise InvalidInput(f"depth must be 1 to {MAX_LIST_DEPTH}")
    shown = normalize(path)
    with _dir(root, parts_of(path), shown) as fd:
        return sorted(_walk(fd, shown, depth), key=lambda e: e.path)


def _walk(fd: int, path: str, depth: int) -> Iterator[VolumeEntry]:
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        child = posixpath.join(path, name)
        yield _entry(child, st)
        if depth > 1 and stat.S_ISDIR(st.st_mode):
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                yield from _walk(sub, child, depth - 1)
            finally:
                os.close(sub)


def read_file(root: Path, path: str, limit: int) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit`` of them)."""
    shown = normalize(path)
    with _parent(root, path) as (fd, name):
        try:
            # O_NONBLOCK: a FIFO planted by a guest must not hang the open.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            file_fd = os.open(name, flags, dir_fd=fd)
        except FileNotFoundError:
            raise NotFound(f"no such file in the volume: {shown}") from None
        except OSError as e:
            raise Conflict(f"{shown} is not a regular file") from e
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise Conflict(f"{shown} is not a regular file")
    with os.fdopen(file_fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InvalidInput(f"{shown} is larger than {limit} bytes")
    return data


def write_file(
    root: Path, path: str, data: bytes, *, force: bool = False, mode: int | None = None,
    uid: int | None = None, gid: int | None = None,
) -> VolumeEntry:  # fmt: skip
    """Write ``data`` to ``path`` (its parent must exist; an existing file only with
    ``force``). The new content appears at once and whole (written aside, then renamed)."""
    shown = normalize(path)
    with _parent(root, path) as (fd, name):
        try:
            existing = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None:
            if not stat.S_ISREG(existing.st_mode):
                raise Conflict(f"{shown} exists and is not a regular file")
            if not force:
                raise Conflict(f"{shown} already exists (force replaces it)")
        aside = f".forkpoint-write-{uuid.uuid4().hex}"
        new = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            with os.fdopen(new, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), 0o644 if mode is None else mode & 0o7777)
                if uid is not None or gid is not None:
                    os.fchown(f.fileno(), -1 if uid is None else uid, -1 if gid is None else gid)
            os.rename(aside, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            os.unlink(aside, dir_fd=fd)
            raise
        return _entry(shown, _lstat(fd, name, shown))


def make_dir(
    root: Path, path: str, *, force: bool = False, mode: int | None = None,
    uid: int | None = None, gid: int | None = None,
) -> VolumeEntry:  # fmt: skip
    """Make directory ``path``; with ``force`` its missing parents too, and an existing
    directory is no error."""
    shown = normalize(path)
    parts = parts_of(path)
    if not parts:
        if force:
            return stat_path(root, "/")
        raise Conflict("the volume's root already exists")
    if force and len(parts) > 1:
        make_dir(root, "/".join(parts[:-1]), force=True, mode=mode, uid=uid, gid=gid)
    with _dir(root, parts[:-1], shown) as fd:
        try:
            os.mkdir(parts[-1], 0o755 if mode is None else mode & 0o7777, dir_fd=fd)
        except FileExistsError:
            st = _lstat(fd, parts[-1], shown)
            if not (force and stat.S_ISDIR(st.st_mode)):
                raise Conflict(f"{shown} already exists") from None
            return _entry(shown, st)
        if mode is not None:  # mkdir's mode is masked by the umask
            os.chmod(parts[-1], mode & 0o7777, dir_fd=fd, follow_symlinks=False)
        if uid is not None or gid is not None:
            os.chown(parts[-1], -1 if uid is None else uid, -1 if gid is None else gid,
                     dir_fd=fd, follow_symlinks=False)  # fmt: skip
        return _entry(shown, _lstat(fd, parts[-1], shown))


def set_metadata(
    root: Path, path: str, *, mode: int | None = None, uid: int | None = None,
    gid: int | None = None,
) -> VolumeEntry:  # fmt: skip
    """Change the mode and/or owner of ``path`` (a symlink: only its owner)."""
    shown = normalize(path)
    with _parent(root, path) as (fd, name):
        st = _lstat(fd, name, shown)
        if mode is not None and not stat.S_ISLNK(st.st_mode):
            os.chmod(name, mode & 0o7777, dir_fd=fd, follow_symlinks=False)
        if uid is not None or gid is not None:
            os.chown(name, -1 if uid is None else uid, -1 if gid is None else gid,
                     dir_fd=fd, follow_symlinks=False)  # fmt: skip
        return _entry(shown, _lstat(fd, name, shown))


def remove(root: Path, path: str) -> None:
    """Remove ``path``; a directory with everything in it."""
    shown = normalize(path)
    with _parent(root, path) as (fd, name):
        st = _lstat(fd, name, shown)
        if stat.S_ISDIR(st.st_mode):
            # rmtree with dir_fd walks by descriptors and never follows a symlink.
            shutil.rmtree(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
