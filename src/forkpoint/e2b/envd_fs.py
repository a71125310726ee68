"""envd's ``filesystem.Filesystem`` service (unary calls) on the runtime's file operations.

Entries are E2B's ``EntryInfo``; owners are names (``user`` for uid 1000, ``root`` for 0);
a file's metadata (its ``user.e2b.*`` extended attributes) comes along. Watchers are the
runtime's: polled ones (``CreateWatcher``/``GetWatcherEvents``/``RemoveWatcher``, the sync
SDK's) are held by it between calls; ``WatchDir`` (the async SDK's) streams a watch.
"""

from __future__ import annotations

import contextlib
import posixpath
import stat as stat_mod
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from forkpoint.errors import ForkpointError, NotFound
from forkpoint.models import FileEvent
from forkpoint.runtime.guest.watch import DirWatch

from .connect import ConnectError, Keepalive, end_stream, envelope, with_keepalives
from .context import EnvdCall, connect_error

__all__ = ["UNARY", "entry_info", "watch_dir"]

_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
_USERS = {0: "root", 1000: "user"}
_MAX_DEPTH = 16


def _path(message: dict[str, Any], key: str = "path") -> str:
    path = message.get(key)
    if not isinstance(path, str) or not path:
        raise ConnectError("invalid_argument", f"{key} is required")
    if not path.startswith("/"):
        path = posixpath.join("/home/user", path)
    return posixpath.normpath(path)


def _owner(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return _USERS.get(value, str(value))
    return ""


def entry_info(path: str, entry: Any) -> dict[str, Any]:
    """E2B's ``EntryInfo`` for a runtime directory entry or stat result at ``path``."""
    mode = int(entry.mode)
    kind = str(entry.type)
    type_bits = {"dir": stat_mod.S_IFDIR, "symlink": stat_mod.S_IFLNK}.get(kind, stat_mod.S_IFREG)
    info: dict[str, Any] = {
        "name": posixpath.basename(path) or "/",
        "type": _TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
        "path": path,
        "size": str(int(entry.size)),
        "mode": mode,
        "permissions": stat_mod.filemode(type_bits | mode),
        "owner": _owner(getattr(entry, "owner", None) or getattr(entry, "uid", None)),
        "group": _owner(getattr(entry, "group", None) or getattr(entry, "gid", None)),
        "modifiedTime": datetime.fromtimestamp(int(entry.mtime_ns) / 1e9, UTC)
        .isoformat()
        .replace("+00:00", "Z"),
    }
    target = getattr(entry, "target", None)
    if target:
        info["symlinkTarget"] = target
    metadata = getattr(entry, "metadata", None)
    if metadata:
        info["metadata"] = dict(metadata)
    return info


async def _stat_entry(call: EnvdCall, path: str) -> dict[str, Any]:
    """``path``'s entry; a symlink as envd tells it: what it points to (type, size, ...)
    with ``symlinkTarget`` the absolute path of the target (a dangling one as a link)."""
    result = await call.runtime.stat(call.sandbox_id, path, follow_symlinks=False)
    if result.type != "symlink" or not result.target:
        return entry_info(path, result)
    try:
        target = await call.runtime.stat(call.sandbox_id, path)
    except NotFound:
        return entry_info(path, result)
    info = entry_info(path, target)
    info["symlinkTarget"] = posixpath.normpath(
        posixpath.join(posixpath.dirname(path), result.target)
    )
    return info


async def _stat(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    return {"entry": await _stat_entry(call, _path(message))}


async def _list_dir(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    root = _path(message)
    depth = int(message.get("depth") or 1)
    if not 1 <= depth <= _MAX_DEPTH:
        raise ConnectError("invalid_argument", f"depth must be 1..{_MAX_DEPTH}")
    top = await _stat_entry(call, root)
    if top["type"] != "FILE_TYPE_DIRECTORY":
        raise ConnectError("invalid_argument", f"path {root} is not a directory")
    listed = await call.runtime.list_files(call.sandbox_id, root, depth=depth)
    return {"entries": [entry_info(e.path or posixpath.join(root, e.name), e) for e in listed]}


async def _make_dir(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    path = _path(message)
    if not await call.runtime.make_dir(call.sandbox_id, path, user=call.user):
        raise ConnectError("already_exists", f"directory {path} already exists")
    return {"entry": await _stat_entry(call, path)}


async def _move(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    source, destination = _path(message, "source"), _path(message, "destination")
    await call.runtime.rename(call.sandbox_id, source, destination, user=call.user)
    return {"entry": await _stat_entry(call, destination)}


async def _remove(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    """Removing a path that is not there succeeds, as envd's does."""
    with contextlib.suppress(NotFound):
        await call.runtime.remove_file(call.sandbox_id, _path(message))
    return {}


_EVENT_TYPES = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}


def _event(event: FileEvent) -> dict[str, Any]:
    """envd's ``FilesystemEvent``."""
    out: dict[str, Any] = {"name": event.name, "type": _EVENT_TYPES[event.type]}
    if event.entry is not None and event.entry.path:
        out["entry"] = entry_info(event.entry.path, event.entry)
    return out


def _watch_options(message: dict[str, Any]) -> dict[str, bool]:
    return {
        "recursive": bool(message.get("recursive")),
        "entries": bool(message.get("includeEntry")),
    }


async def _create_watcher(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    path = _path(message)
    watcher = await call.runtime.create_watcher(call.sandbox_id, path, **_watch_options(message))
    return {"watcherId": watcher.id}


def _watcher_id(message: dict[str, Any]) -> str:
    watcher = message.get("watcherId")
    if not isinstance(watcher, str) or not watcher:
        raise ConnectError("invalid_argument", "watcherId is required")
    return watcher


async def _get_watcher_events(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    events = await call.runtime.watcher_events(call.sandbox_id, _watcher_id(message))
    return {"events": [_event(e) for e in events]}


async def _remove_watcher(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    await call.runtime.remove_watcher(call.sandbox_id, _watcher_id(message))
    return {}


async def watch_dir(
    call: EnvdCall, message: dict[str, Any], keepalive_s: float
) -> AsyncIterator[bytes]:
    """``WatchDir``: start, then each change, keepalives in silences, until the client
    hangs up or the directory is gone. Errors before the start raise ConnectError."""
    path = _path(message)
    watching = call.runtime.watch_dir(call.sandbox_id, path, **_watch_options(message))
    try:
        watch = await watching.__aenter__()
    except ForkpointError as error:
        raise connect_error(error) from None
    return _watch_envelopes(watching, watch, keepalive_s)


async def _watch_envelopes(
    watching: contextlib.AbstractAsyncContextManager[DirWatch],
    watch: DirWatch,
    keepalive_s: float,
) -> AsyncIterator[bytes]:
    try:
        # WatchDirResponse's oneof is named `event`, but a oneof's name is not in its JSON
        yield envelope({"start": {}})
        try:
            async for item in with_keepalives(aiter(watch), keepalive_s):
                if isinstance(item, Keepalive):
                    yield envelope({"keepalive": {}})
                else:
                    yield envelope({"filesystem": _event(item)})
        except ForkpointError as error:
            yield end_stream(connect_error(error))
            return
        yield end_stream()
    finally:
        await watching.__aexit__(None, None, None)


UNARY = {
    "Stat": _stat,
    "ListDir": _list_dir,
    "MakeDir": _make_dir,
    "Move": _move,
    "Remove": _remove,
    "CreateWatcher": _create_watcher,
    "GetWatcherEvents": _get_watcher_events,
    "RemoveWatcher": _remove_watcher,
}
