"""File ops: read (streamed in chunks), chunked atomic upload, list, stat, remove.

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
from dataclasses import dataclass, field

from ..protocol import (
    CHUNK_BYTES,
    DirEntry,
    Empty,
    ErrorCode,
    EventKind,
    ListDirResult,
    PathArgs,
    ReadFileResult,
    RemoveArgs,
    RemoveResult,
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

__all__ = ["FileOps", "file_type"]


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
        parent = os.path.dirname(args.path) or "/"
        if args.make_parents:
            os.makedirs(parent, exist_ok=True)
        elif not os.path.isdir(parent):
            raise FileNotFoundError(2, "No such file or directory", parent)
        fd, tmp_path = tempfile.mkstemp(
            dir=parent, prefix=f".{os.path.basename(args.path)}.", suffix=".fpupload"
        )
        handle = uuid.uuid4().hex
        with self._lock:
            self._uploads[handle] = _Upload(args.path, tmp_path, fd, args.mode, ctx.generation)
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
                os.fchmod(upload.fd, upload.mode)
                os.replace(upload.tmp_path, upload.path)
            except BaseException:
                upload.discard()
                raise
            upload.closed = True
            os.close(upload.fd)
        return WriteCommitResult(path=upload.path, size=size)

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

    def list_dir(self, ctx: Context, args: PathArgs) -> ListDirResult:
        """Entries sorted by name (not following symlinks)."""
        entries: list[DirEntry] = []
        with os.scandir(args.path) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                entries.append(
                    DirEntry(
                        name=e.name,
                        type=file_type(st.st_mode),
                        size=st.st_size,
                        mode=stat_mod.S_IMODE(st.st_mode),
                        mtime_ns=st.st_mtime_ns,
                    )
                )
        entries.sort(key=lambda d: d.name)
        return ListDirResult(entries=entries)

    def stat(self, ctx: Context, args: StatArgs) -> StatResult:
        st = os.stat(args.path, follow_symlinks=args.follow_symlinks)
        return StatResult(
            path=args.path,
            type=file_type(st.st_mode),
            size=st.st_size,
            mode=stat_mod.S_IMODE(st.st_mode),
            mtime_ns=st.st_mtime_ns,
            uid=st.st_uid,
            gid=st.st_gid,
        )

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
            return RemoveResult(path=args.path, type="dir")
        os.unlink(args.path)
        return RemoveResult(path=args.path, type=file_type(st.st_mode))
