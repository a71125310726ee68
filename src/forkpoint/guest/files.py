"""File ops: read (streamed in chunks), chunked atomic upload, list, stat, remove, make_dir,
rename.

Memory stays bounded by one chunk per request in flight: downloads stream ``chunk``
events, uploads arrive as ``write_chunk`` requests written with ``pwrite`` to a temp file
next to the target, which ``write_commit`` renames into place.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat as stat_mod
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..protocol import (
    CHUNK_BYTES,
    DirEntry,
    Empty,
    ErrorCode,
    EventKind,
    ListDirArgs,
    ListDirResult,
    MakeDirArgs,
    MakeDirResult,
    PathArgs,
    ReadFileResult,
    RemoveArgs,
    RemoveResult,
    RenameArgs,
    StatArgs,
    StatResult,
    WriteBeginArgs,
    WriteBeginResult,
    WriteChunkArgs,
    WriteChunkResult,
    WriteCommitArgs,
    WriteCommitResult,
    WriteHandleArgs,
)
from .context import ConnectionGone, Context, GuestError
from .users import Account, account, chown_to, group_name, may_write, owner_name

__all__ = ["MAX_LIST_ENTRIES", "UPLOAD_SUFFIX", "FileOps", "entry_at", "file_type", "make_dirs"]

#: An upload's temp file is ``.<name>.<random>`` + this, next to its target.
UPLOAD_SUFFIX = ".fpupload"
_REPLACED_KEPT = 256

MAX_LIST_ENTRIES = 10_000  # keeps a listing's answer well under the frame limit


def file_type(mode: int) -> str:
    """``file``, ``dir``, ``symlink`` or ``other`` for an ``st_mode``."""
    if stat_mod.S_ISREG(mode):
        return "file"
    if stat_mod.S_ISDIR(mode):
        return "dir"
    if stat_mod.S_ISLNK(mode):
        return "symlink"
    return "other"


@dataclass
class _Upload:
    path: str
    tmp_path: str
    fd: int
    mode: int
    generation: int
    owner: Account | None = None
    metadata: dict[str, str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False

    def discard(self) -> None:
        """Close and delete the temp file (idempotent; caller holds ``lock``)."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)
            try:
                os.unlink(self.tmp_path)
            except FileNotFoundError:
                pass


class FileOps:
    """Handlers for the file ops. Uploads belong to the host connection that opened them."""

    def __init__(self) -> None:
        self._uploads: dict[str, _Upload] = {}
        self._lock = threading.Lock()
        # path -> did it exist before the latest upload replaced it (oldest first)
        self.replaced: dict[str, bool] = {}
        # Called after each change made here, before answering: watchers take in its
        # events first, so a host that changed a file and then asks sees them.
        self.after_change: Callable[[], None] = lambda: None

    def read_file(self, ctx: Context, args: PathArgs) -> ReadFileResult:
        """Stream the file as chunk events. Raises OSError (missing, directory, ...)."""
        st = os.stat(args.path)
        if stat_mod.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "Is a directory", args.path)
        if not stat_mod.S_ISREG(st.st_mode):  # a FIFO or device could block or never end
            raise GuestError(ErrorCode.INVALID_INPUT, f"not a regular file: {args.path}")
        size = 0
        with open(args.path, "rb", buffering=0) as f:
            while chunk := f.read(CHUNK_BYTES):
                if not ctx.emit(EventKind.CHUNK, chunk):
                    raise ConnectionGone
                size += len(chunk)
        return ReadFileResult(size=size)

    def write_begin(self, ctx: Context, args: WriteBeginArgs) -> WriteBeginResult:
        """Create the temp file (and parent directories with ``make_parents``)."""
        if os.path.isdir(args.path):
            raise IsADirectoryError(21, "Is a directory", args.path)
        owner = account(args.user) if args.user is not None else None
        parent = os.path.dirname(args.path) or "/"
        if args.make_parents:
            if make_dirs(parent, owner):
                self.after_change()  # a recursive watcher watches them before the write
        elif not os.path.isdir(parent):
            raise FileNotFoundError(2, "No such file or directory", parent)
        fd, tmp_path = tempfile.mkstemp(
            dir=parent, prefix=f".{os.path.basename(args.path)}.", suffix=UPLOAD_SUFFIX
        )
        handle = uuid.uuid4().hex
        upload = _Upload(args.path, tmp_path, fd, args.mode, ctx.generation, owner, args.metadata)
        with self._lock:
            self._uploads[handle] = upload
        return WriteBeginResult(handle=handle)

    def _upload(self, handle: str) -> _Upload:
        with self._lock:
            upload = self._uploads.get(handle)
        if upload is None:
            raise GuestError(ErrorCode.NOT_FOUND, f"no such upload (expired?): {handle}")
        return upload

    def write_chunk(self, ctx: Context, args: WriteChunkArgs) -> WriteChunkResult:
        upload = self._upload(args.handle)
        with upload.lock:
            if upload.closed:
                raise GuestError(ErrorCode.NOT_FOUND, f"upload was aborted: {args.handle}")
            view = memoryview(args.data)
            offset = args.offset
            while view:
                n = os.pwrite(upload.fd, view, offset)
                view, offset = view[n:], offset + n
        return WriteChunkResult(written=len(args.data))

    def write_commit(self, ctx: Context, args: WriteCommitArgs) -> WriteCommitResult:
        """Check the size, set the mode, rename over the target. Aborts on any error."""
        upload = self._upload(args.handle)
        with self._lock:
            self._uploads.pop(args.handle, None)
        with upload.lock:
            if upload.closed:
                raise GuestError(ErrorCode.NOT_FOUND, f"upload was aborted: {args.handle}")
            try:
                size = os.fstat(upload.fd).st_size
                if size != args.size:
                    raise GuestError(
                        ErrorCode.INVALID_INPUT,
                        f"upload incomplete: got {size} bytes, expected {args.size}",
                    )
                if upload.owner is not None:
                    os.fchown(upload.fd, upload.owner.uid, upload.owner.gid)
                os.fchmod(upload.fd, upload.mode)
                for key, value in (upload.metadata or {}).items():
                    os.setxattr(upload.fd, METADATA_XATTR + key.lower(), value.encode())
                self._note_replacing(upload.path)
                os.replace(upload.tmp_path, upload.path)
            except BaseException:
                upload.discard()
                raise
            upload.closed = True
            os.close(upload.fd)
        self.after_change()
        return WriteCommitResult(path=upload.path, size=size)

    def _note_replacing(self, path: str) -> None:
        """Remember whether ``path`` existed before an upload replaced it (watchers
        report the rename of the temp file as the write it is)."""
        with self._lock:
            self.replaced.pop(path, None)
            self.replaced[path] = os.path.lexists(path)
            while len(self.replaced) > _REPLACED_KEPT:
                del self.replaced[next(iter(self.replaced))]

    def write_abort(self, ctx: Context, args: WriteHandleArgs) -> Empty:
        with self._lock:
            upload = self._uploads.pop(args.handle, None)
        if upload is not None:
            with upload.lock:
                upload.discard()
        return Empty()

    def abort_stale(self, generation: int) -> None:
        """Drop uploads opened on connections older than ``generation``."""
        with self._lock:
            stale = [h for h, u in self._uploads.items() if u.generation < generation]
            uploads = [self._uploads.pop(h) for h in stale]
        for upload in uploads:
            with upload.lock:
                upload.discard()

    def list_dir(self, ctx: Context, args: ListDirArgs) -> ListDirResult:
        """Entries sorted by path (not following symlinks), ``depth`` levels deep, at most
        ``MAX_LIST_ENTRIES``."""
        entries: list[DirEntry] = []
        names = _Names()
        todo = [(args.path, 1)]
        while todo:
            directory, level = todo.pop()
            try:
                it = os.scandir(directory)
            except OSError:
                if directory == args.path:
                    raise
                continue  # a subdirectory we may not read, or gone meanwhile
            with it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if len(entries) >= MAX_LIST_ENTRIES:
                        raise GuestError(
                            ErrorCode.TOO_LARGE,
                            f"more than {MAX_LIST_ENTRIES} entries under {args.path}",
                        )
                    entries.append(_entry(e.path, e.name, st, names))
                    if level < args.depth and stat_mod.S_ISDIR(st.st_mode):
                        todo.append((e.path, level + 1))
        entries.sort(key=lambda d: d.path or d.name)
        return ListDirResult(entries=entries)

    def stat(self, ctx: Context, args: StatArgs) -> StatResult:
        st = os.stat(args.path, follow_symlinks=args.follow_symlinks)
        names = _Names()
        return StatResult(
            path=args.path,
            type=file_type(st.st_mode),
            size=st.st_size,
            mode=stat_mod.S_IMODE(st.st_mode),
            mtime_ns=st.st_mtime_ns,
            uid=st.st_uid,
            gid=st.st_gid,
            owner=names.owner(st.st_uid),
            group=names.group(st.st_gid),
            target=_link_target(args.path, st),
            metadata=_metadata(args.path, st),
        )

    def make_dir(self, ctx: Context, args: MakeDirArgs) -> MakeDirResult:
        """Create the directory and missing parents (owned by ``user``). Raises
        FileExistsError when a non-directory is in the way."""
        owner = account(args.user) if args.user is not None else None
        if os.path.isdir(args.path):
            return MakeDirResult(created=False)
        created = bool(make_dirs(args.path, owner, args.mode))
        self.after_change()
        return MakeDirResult(created=created)

    def rename(self, ctx: Context, args: RenameArgs) -> Empty:
        """Move ``src`` to ``dst``; with ``user``, only where that user may write."""
        if args.user is not None:
            acct = account(args.user)
            for path in (args.src, args.dst):
                directory = os.path.dirname(path.rstrip("/")) or "/"
                if os.path.isdir(directory) and not may_write(acct, directory):
                    raise GuestError(
                        ErrorCode.PERMISSION_DENIED,
                        f"user {acct.name} may not write to {directory}",
                    )
        os.lstat(args.src)  # FileNotFoundError names src, not dst
        os.rename(args.src, args.dst)
        self.after_change()
        return Empty()

    def remove(self, ctx: Context, args: RemoveArgs) -> RemoveResult:
        st = os.lstat(args.path)
        if stat_mod.S_ISDIR(st.st_mode):
            if args.recursive:
                shutil.rmtree(args.path)
            else:
                try:
                    os.rmdir(args.path)
                except OSError as e:
                    if e.errno == errno.ENOTEMPTY:
                        raise GuestError(
                            ErrorCode.INVALID_INPUT,
                            f"directory not empty (use recursive): {args.path}",
                        ) from None
                    raise
            self.after_change()
            return RemoveResult(path=args.path, type="dir")
        os.unlink(args.path)
        self.after_change()
        return RemoveResult(path=args.path, type=file_type(st.st_mode))


def make_dirs(path: str, owner: Account | None, mode: int = 0o755) -> list[str]:
    """``mkdir -p``; the directories it creates belong to ``owner``. Returns them."""
    missing: list[str] = []
    current = os.path.normpath(path)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue
        chown_to(directory, owner)
    return missing


class _Names:
    """uid/gid -> name lookups, cached for one request."""

    def __init__(self) -> None:
        self._owners: dict[int, str] = {}
        self._groups: dict[int, str] = {}

    def owner(self, uid: int) -> str:
        if uid not in self._owners:
            self._owners[uid] = owner_name(uid)
        return self._owners[uid]

    def group(self, gid: int) -> str:
        if gid not in self._groups:
            self._groups[gid] = group_name(gid)
        return self._groups[gid]


#: The extended attributes that hold a file's metadata (E2B's convention).
METADATA_XATTR = "user.e2b."


def _metadata(path: str, st: os.stat_result) -> dict[str, str] | None:
    """The file's ``user.e2b.*`` attributes; None without any (or where the filesystem
    has no user attributes, or on a symlink, which cannot carry them)."""
    if stat_mod.S_ISLNK(st.st_mode):
        return None
    try:
        names = [n for n in os.listxattr(path) if n.startswith(METADATA_XATTR)]
        found = {n[len(METADATA_XATTR) :]: os.getxattr(path, n).decode() for n in names}
    except OSError:
        return None
    return found or None


def _link_target(path: str, st: os.stat_result) -> str | None:
    if not stat_mod.S_ISLNK(st.st_mode):
        return None
    try:
        return os.readlink(path)
    except OSError:
        return None


def entry_at(path: str, name: str) -> DirEntry | None:
    """The entry of ``path`` (not following a symlink), None if it is gone."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return _entry(path, name, st, _Names())


def _entry(path: str, name: str, st: os.stat_result, names: _Names) -> DirEntry:
    return DirEntry(
        name=name,
        type=file_type(st.st_mode),
        size=st.st_size,
        mode=stat_mod.S_IMODE(st.st_mode),
        mtime_ns=st.st_mtime_ns,
        path=path,
        owner=names.owner(st.st_uid),
        group=names.group(st.st_gid),
        target=_link_target(path, st),
        metadata=_metadata(path, st),
    )
