"""A checkpoint's integrity: what its manifest records of its files, checked before a
restore (cheaply) and by ``forkpoint checkpoint verify`` (fully).

A checkpoint's manifest carries ``files``: for ``state`` and ``ram``, the size, a SHA-256
of the content (holes of the sparse RAM file hashed as their length, so only the data is
read) and the RAM file's change time. Before every restore (create, fork, rollback):

- ``manifest.json`` must parse and equal the store's copy of it;
- ``state`` (device state, a few hundred KiB) is hashed in full;
- ``ram`` must have its size, and its ``ctime`` must be the one recorded. Anything
  written to the file since it was made moves ``ctime`` (which no user can set back), and
  then the whole RAM file is hashed once (and the result remembered next to it, in
  ``ram.verified``). So a restore costs a ``stat`` for the RAM, not a pass over it.

``verify`` hashes everything regardless: the one way to find damage that bypassed the
file system (media errors). Damage is :class:`~forkpoint.errors.DamagedCheckpoint`,
raised before any guest starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkpoint.errors import DamagedCheckpoint

from .manifest import CheckpointFiles

__all__ = ["FileCheck", "check_before_restore", "describe_files", "verify_files"]

_CHUNK = 4 << 20


def _digest(path: Path) -> str:
    """SHA-256 of ``path`` reading only its data: a hole is hashed as its length."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        offset = 0
        while offset < size:
            try:
                data = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                data = size
            if data > offset:
                h.update(f"hole:{data - offset};".encode())
            if data >= size:
                break
            end = os.lseek(fd, data, os.SEEK_HOLE)
            f.seek(data)
            left = end - data
            while left > 0:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
            offset = end
    return h.hexdigest()


def describe_files(files: CheckpointFiles) -> dict[str, dict[str, Any]]:
    """The ``files`` map of a freshly written checkpoint (its files are read-only now)."""
    out: dict[str, dict[str, Any]] = {}
    for key, path in (("state", files.state), ("ram", files.ram)):
        st = path.stat()
        out[key] = {"size": st.st_size, "sha256": _digest(path)}
        if key == "ram":
            out[key]["ctime_ns"] = st.st_ctime_ns
    return out


def _damaged(checkpoint_id: str, what: str) -> DamagedCheckpoint:
    return DamagedCheckpoint(
        f"damaged checkpoint {checkpoint_id}: {what}; it cannot be restored "
        f"(forkpoint checkpoint verify {checkpoint_id} checks it in full)"
    )


def check_manifest(files: CheckpointFiles, stored: dict[str, Any]) -> dict[str, Any]:
    """``manifest.json`` as the store recorded it; returns it.
    :raises DamagedCheckpoint: missing, unreadable or different."""
    cid = files.dir.name
    try:
        data = json.loads(files.manifest.read_bytes())
    except FileNotFoundError:
        raise _damaged(cid, "manifest.json is missing") from None
    except (OSError, ValueError) as error:
        raise _damaged(cid, f"manifest.json is unreadable ({type(error).__name__})") from None
    if data != stored:
        raise _damaged(cid, "manifest.json differs from the store's copy")
    return stored


@dataclass(frozen=True)
class FileCheck:
    """One file of a verified checkpoint."""

    name: str
    size: int
    ok: bool
    problem: str | None
    hashed: bool
    ms: float


def _check_one(files: CheckpointFiles, key: str, want: dict[str, Any], *, full: bool) -> FileCheck:
    path = files.dir / key
    started = time.perf_counter()
    try:
        st = path.stat()
    except OSError:
        return FileCheck(key, 0, False, f"{key} is missing", False, 0.0)

    def result(problem: str | None, hashed: bool) -> FileCheck:
        ms = (time.perf_counter() - started) * 1000
        return FileCheck(key, st.st_size, problem is None, problem, hashed, ms)

    if st.st_size != want.get("size"):
        return result(f"{key} has {st.st_size} bytes, {want.get('size')} were written", False)
    unchanged = key == "ram" and st.st_ctime_ns in (want.get("ctime_ns"), _remembered(files))
    if not full and unchanged:
        return result(None, False)
    if _digest(path) != want.get("sha256"):
        return result(f"{key}'s content differs from what was written", True)
    if key == "ram":
        _remember(files, st.st_ctime_ns)
    return result(None, True)


def _remembered(files: CheckpointFiles) -> int | None:
    try:
        return int((files.dir / "ram.verified").read_text())
    except (OSError, ValueError):
        return None


def _remember(files: CheckpointFiles, ctime_ns: int) -> None:
    try:
        (files.dir / "ram.verified").write_text(str(ctime_ns))
    except OSError:
        pass  # a read-only home: the next restore hashes again


def check_before_restore(files: CheckpointFiles, stored: dict[str, Any]) -> None:
    """The cheap check (see the module doc). :raises DamagedCheckpoint:"""
    manifest = check_manifest(files, stored)
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        return  # written before checkpoints recorded their files
    for key in ("state", "ram"):
        check = _check_one(files, key, recorded.get(key) or {}, full=False)
        if not check.ok:
            raise _damaged(files.dir.name, check.problem or key)


def verify_files(files: CheckpointFiles, stored: dict[str, Any]) -> list[FileCheck]:
    """Every file hashed in full. :raises DamagedCheckpoint: the manifest itself is."""
    started = time.perf_counter()
    manifest = check_manifest(files, stored)
    checks = [FileCheck("manifest.json", files.manifest.stat().st_size, True, None, True,
                        (time.perf_counter() - started) * 1000)]  # fmt: skip
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        return checks
    checks += [_check_one(files, k, recorded.get(k) or {}, full=True) for k in ("state", "ram")]
    return checks
