"""envd's ``filesystem.Filesystem`` service (unary calls) on the runtime's file operations.

Entries are E2B's ``EntryInfo``; owners are names (``user`` for uid 1000, ``root`` for 0);
a file's metadata (its ``user.e2b.*`` extended attributes) comes along.
Watchers answer ``unimplemented``.
"""

from __future__ import annotations

import contextlib
import posixpath
import stat as stat_mod
from datetime import UTC, datetime
from typing import Any

from forkpoint.errors import NotFound

from .connect import ConnectError
from .context import EnvdCall

__all__ = ["UNARY", "entry_info"]

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


async def _unimplemented(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    raise ConnectError("unimplemented", "directory watchers are not supported by forkpoint")


UNARY = {
    "Stat": _stat,
    "ListDir": _list_dir,
    "MakeDir": _make_dir,
    "Move": _move,
    "Remove": _remove,
    "CreateWatcher": _unimplemented,
    "GetWatcherEvents": _unimplemented,
    "RemoveWatcher": _unimplemented,
}
