"""Watching directories: inotify, streamed to the host as ``fs`` events.

Each ``watch_dir`` request owns an inotify descriptor and runs in its request thread until
the host cancels it or the directory goes away. Events are named relative to the watched
directory and typed as fsnotify (and so E2B's envd) types them: create (also moved here),
write, remove, rename (moved away), chmod (mode, owner, extended attributes).

The agent's own uploads write a temp file and rename it over the target; a watcher
reports that as what it means — the target created (create, chmod, write, as envd's
in-place write shows) or written — and never shows the temp file. Every file op of the
agent drains all watchers before it answers, so a host that changed something and then
asks for events (``watch_flush``) has them, and a directory made by ``make_dir`` is
watched (recursive) before a file can be written into it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import struct
import threading

from ..protocol import (
    Empty,
    ErrorCode,
    EventKind,
    WatchDirArgs,
    WatchEndResult,
    WatchEvent,
    WatchFlushArgs,
    to_wire,
)
from .context import ConnectionGone, Context, GuestError
from .files import UPLOAD_SUFFIX, FileOps, entry_at
from .streams import Stream, StreamRegistry

__all__ = ["WatchOps"]

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_MASK = (
    IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF
)  # fmt: skip
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, name length
_POLL_MS = 500  # re-check cancellation this often

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str, path: str = "") -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}", path or None)
    return result


def _is_upload_temp(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.startswith(".") and base.endswith(UPLOAD_SUFFIX)


class _Watch:
    """One inotify descriptor and the directories it watches (wd -> relative path)."""

    def __init__(self, args: WatchDirArgs, stream: Stream, files: FileOps) -> None:
        self.args = args
        self.stream = stream
        self._files = files
        self.fd = _check(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")
        self._dirs: dict[int, str] = {}
        self._upload_cookies: set[int] = set()
        self.lock = threading.Lock()
        self.ended: str | None = None
        self._add(args.path, "")
        if args.recursive:
            self._add_tree(args.path, "", report=False)

    def close(self) -> None:
        """Caller holds ``lock``."""
        self.ended = self.ended or "cancelled"
        os.close(self.fd)

    def _add(self, path: str, rel: str) -> None:
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), _MASK | IN_ONLYDIR)
        if wd < 0:
            code = ctypes.get_errno()
            if rel and code in (errno.ENOENT, errno.ENOTDIR):
                return  # a subdirectory gone meanwhile
            if code == errno.ENOTDIR:
                raise GuestError(ErrorCode.INVALID_INPUT, f"not a directory: {path}")
            if code == errno.ENOSPC:
                raise GuestError(ErrorCode.TOO_LARGE, f"too many directories to watch: {path}")
            raise OSError(code, os.strerror(code), path)
        self._dirs[wd] = rel

    def _add_tree(self, path: str, rel: str, *, report: bool) -> None:
        """Watch the subdirectories of ``path``; ``report``: its entries are news (a
        directory made or moved here after the watch began) and reported as created."""
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            if report and not _is_upload_temp(entry.name):
                self._emit(child, "create")
            if entry.is_dir(follow_symlinks=False):
                self._add(entry.path, child)
                self._add_tree(entry.path, child, report=report)

    def drain(self) -> None:
        """Send every event the kernel has queued (without waiting for more)."""
        with self.lock:
            while self.ended is None:
                try:
                    data = os.read(self.fd, 64 * 1024)
                except BlockingIOError:
                    return
                self._handle_all(data)

    def _handle_all(self, data: bytes) -> None:
        offset = 0
        while offset < len(data):
            wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            name = data[offset : offset + length].rstrip(b"\0").decode(errors="surrogateescape")
            offset += length
            self._handle(wd, mask, cookie, name)

    def _handle(self, wd: int, mask: int, cookie: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self.ended = "overflow"
            return
        rel = self._dirs.get(wd)
        if rel is None:
            return
        if mask & IN_IGNORED:
            del self._dirs[wd]
            if rel == "":
                self.ended = "removed"
            return
        if not name:  # the watched directory itself; its parent's watch reports it
            if rel == "" and mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                self.ended = "removed"
            return
        path = f"{rel}/{name}" if rel else name
        if _is_upload_temp(name):
            if mask & IN_MOVED_FROM:
                self._upload_cookies.add(cookie)
            return
        if mask & IN_MOVED_TO and cookie in self._upload_cookies:
            self._upload_cookies.discard(cookie)
            full = os.path.join(self.args.path, path)
            if self._files.replaced.get(full, True):
                self._emit(path, "write")
            else:
                for kind in ("create", "chmod", "write"):
                    self._emit(path, kind)
            return
        if mask & (IN_CREATE | IN_MOVED_TO):
            self._emit(path, "create")
            if mask & IN_ISDIR and self.args.recursive:
                full = os.path.join(self.args.path, path)
                self._add(full, path)
                self._add_tree(full, path, report=True)
        if mask & IN_MODIFY:
            self._emit(path, "write")
        if mask & IN_ATTRIB:
            self._emit(path, "chmod")
        if mask & IN_DELETE:
            self._emit(path, "remove")
        if mask & IN_MOVED_FROM:
            self._emit(path, "rename")

    def _emit(self, name: str, kind: str) -> None:
        entry = None
        if self.args.entries:
            entry = entry_at(os.path.join(self.args.path, name), name.rsplit("/", 1)[-1])
        event = WatchEvent(name=name, type=kind, entry=entry)
        if not self.stream.send(EventKind.FS, json.dumps(to_wire(event)).encode()):
            self.ended = "cancelled"


class WatchOps:
    """Handlers of watch_dir and watch_flush, and the hook file ops call."""

    def __init__(self, streams: StreamRegistry, files: FileOps) -> None:
        self._streams = streams
        self._files = files
        self._watches: dict[tuple[int, int], _Watch] = {}
        self._lock = threading.Lock()
        files.after_change = self.drain_all

    def watch(self, ctx: Context, args: WatchDirArgs) -> WatchEndResult:
        """``start`` once watching, then events until cancelled or the directory is gone.
        Raises OSError (missing), GuestError (not a directory)."""
        if not os.path.isdir(args.path):
            os.stat(args.path)  # FileNotFoundError names the path
            raise GuestError(ErrorCode.INVALID_INPUT, f"not a directory: {args.path}")
        stream = self._streams.open(ctx, args.window)
        try:
            watch = _Watch(args, stream, self._files)
        except BaseException:
            self._streams.close(stream)
            raise
        key = (ctx.generation, ctx.rid)
        with self._lock:
            self._watches[key] = watch
        try:
            if not stream.send(EventKind.START, b""):
                raise ConnectionGone
            return self._follow(ctx, watch)
        finally:
            with self._lock:
                self._watches.pop(key, None)
            self._streams.close(stream)
            with watch.lock:
                watch.close()

    def _follow(self, ctx: Context, watch: _Watch) -> WatchEndResult:
        poller = select.poll()
        poller.register(watch.fd, select.POLLIN)
        while watch.ended is None and not watch.stream.cancelled:
            if not ctx.alive:
                raise ConnectionGone
            if poller.poll(_POLL_MS):
                watch.drain()
        if watch.ended == "overflow":
            raise GuestError(ErrorCode.TOO_LARGE, "too many changes at once: events were lost")
        return WatchEndResult(reason=watch.ended or "cancelled")

    def flush(self, ctx: Context, args: WatchFlushArgs) -> Empty:
        """Send watch ``request_id``'s queued events before this answer."""
        with self._lock:
            watch = self._watches.get((ctx.generation, args.request_id))
        if watch is None:
            raise GuestError(ErrorCode.NOT_FOUND, f"no such watch: {args.request_id}")
        watch.drain()
        return Empty()

    def drain_all(self) -> None:
        with self._lock:
            watches = list(self._watches.values())
        for watch in watches:
            watch.drain()
