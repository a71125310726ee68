"""A checkpoint's integrity: what its manifest records of its files, checked before a
restore (cheaply) and by ``forkpoint checkpoint verify`` (fully).

A checkpoint's manifest carries ``files``: for ``state``, its size and SHA-256; for
``ram``, its size, its change time and a *page sum*: the sum modulo 2^128 of XXH3-128
(each non-zero 4 KiB page, seeded with its index; 64 KiB blocks in checkpoints of older
forkpoints, still verified). xxHash rather than SHA-256: six times faster here, and what
it guards against is damage, not a forger who can write the home anyway. A sum, because a
checkpoint's RAM file is its base file (the one its VM maps: the session's previous
checkpoint's, see ``vm.rebase``) plus the pages written since: its sum is the base's,
minus the pages written over, plus their new contents — hashing only what changed, not
the 100+ MiB a guest holds (SHA-256 over a whole RAM file took 250–330 ms here, more than the
checkpoint itself). Zero blocks (holes) add nothing. Before every restore (create, fork,
rollback):

- ``manifest.json`` must parse and equal the store's copy of it;
- ``state`` (the device state, ≈ 18 KiB) is hashed in full;
- ``ram`` must have its size, and its ``ctime`` must be the one recorded. Anything
  written to the file since it was made moves ``ctime`` (which no user can set back), and
  then the whole RAM file's page sum is computed once (and the change time it was
  computed at remembered next to it, ``ram.verified``). So a restore costs a ``stat`` for
  the RAM, not a pass over it.

``verify`` hashes everything regardless: the one way to find damage that bypassed the
file system (media errors). Damage is :class:`~forkpoint.errors.DamagedCheckpoint`,
raised before any guest starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import xxhash

from forkpoint.errors import DamagedCheckpoint
from forkpoint.models import FileCheck
from forkpoint.runtime.checkpoints.manifest import CheckpointFiles

__all__ = [
    "SUM_KEY",
    "FileCheck",
    "check_before_restore",
    "describe_files",
    "page_sum",
    "remember_sum",
    "verify_files",
]

_CHUNK = 4 << 20


def _digest(path: Path) -> str:
    """SHA-256 of a (small) file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# The sum's unit: 4 KiB pages. It was 64 KiB blocks while a checkpoint re-hashed every
# page written since the restore (hundreds of MiB: a Python step per 4 KiB page cost more
# than the hashing); now a checkpoint hashes what changed since the previous one, mostly
# scattered pages, and a 64 KiB block per written page read 16 times too much (the blocks'
# unwritten parts from disk). Sums of the older kind are still verified.
_PAGE = 4 << 10
SUM_KEY = "xxh3_4k_sum"
"""The RAM file's sum in the manifest, named by its algorithm and block size: a base whose
sum is of another kind (or none) makes the next checkpoint sum its RAM file in full."""
_BLOCK_OF_KEY = {SUM_KEY: _PAGE, "xxh3_64k_sum": 64 << 10}
_MOD = 1 << 128
_READ = 1 << 20  # bytes read at once; hashed a block at a time


def _page_terms(fd: int, ranges: list[tuple[int, int]], block: int = _PAGE) -> int:
    """The page sum's terms of the blocks in ``ranges`` (block-aligned) of file ``fd``.
    Read with ``pread``, not through a mapping: a mapping's read of a hole in a tmpfs file
    allocates a page, and on a full tmpfs that is a SIGBUS (the fault campaign's full disk
    killed a checkpoint so); ``pread`` reads holes as zeros without allocating."""
    size = os.fstat(fd).st_size
    if size == 0 or not ranges:
        return 0
    total = 0
    digest = xxhash.xxh3_128_intdigest
    zero = bytes(block)
    buffer = memoryview(bytearray(max(_READ, block)))  # reused: no allocation per read
    for start, length in ranges:
        end = min(start + length, size)
        for at in range(start, end, len(buffer)):
            got = _read_block(fd, buffer[: min(len(buffer), end - at)], at)
            for i in range(0, got, block):
                data = buffer[i : min(i + block, got)]
                if data != (zero if len(data) == block else bytes(len(data))):
                    total += digest(data, seed=(at + i) // block)
    return total % _MOD


def _read_block(fd: int, buffer: memoryview, offset: int) -> int:
    """Fill ``buffer`` from ``offset`` (less at the end of the file); returns the bytes read."""
    done = 0
    while done < len(buffer):
        n = os.preadv(fd, [buffer[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _data_ranges(fd: int, block: int = _PAGE) -> list[tuple[int, int]]:
    """The blocks holding the file's data (holes read as zeros: they add nothing)."""
    size = os.fstat(fd).st_size
    out: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            data = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            break
        end = os.lseek(fd, data, os.SEEK_HOLE)
        out.append((data, end - data))
        offset = end
    return _blocks(tuple(out), block)  # widened to blocks and merged: each counted once


def page_sum(path: Path, key: str = SUM_KEY) -> int:
    """The page sum of a whole RAM file (reads its data only), of the kind ``key``."""
    block = _BLOCK_OF_KEY[key]
    fd = os.open(path, os.O_RDONLY)
    try:
        return _page_terms(fd, _data_ranges(fd, block), block)
    finally:
        os.close(fd)


def recorded_page_sum(ram: Path) -> int | None:
    """The page sum a checkpoint's manifest records for its ``ram`` (None: not a
    checkpoint's RAM file, or one written before sums were recorded)."""
    try:
        files = json.loads((ram.parent / "manifest.json").read_bytes())["files"]
        return int(files["ram"][SUM_KEY], 16)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _blocks(written: tuple[tuple[int, int], ...], block: int = _PAGE) -> list[tuple[int, int]]:
    """Byte ranges widened to whole blocks, merged (a block two ranges touch counts once:
    found by the campaign's verify of a whole checkpoint)."""
    out: list[tuple[int, int]] = []
    for start, length in sorted(written):
        lo, hi = start - start % block, -(-(start + length) // block) * block
        if out and lo <= out[-1][0] + out[-1][1]:
            prev = out[-1][0]
            out[-1] = (prev, max(out[-1][0] + out[-1][1], hi) - prev)
        else:
            out.append((lo, hi - lo))
    return out


def updated_page_sum(
    base: Path | None, dest: Path, written: tuple[tuple[int, int], ...],
    remembered_in: Path | None = None,
) -> int:  # fmt: skip
    """The page sum of ``dest``: a copy of ``base`` with the ``written`` runs of pages
    replaced (a checkpoint's RAM file). Reads only those pages, from both files. The
    base's sum is its manifest's, or else (its checkpoint deleted) what
    :func:`remember_sum` kept of it in ``remembered_in``."""
    known = None if base is None else recorded_page_sum(base)
    if base is not None and known is None and remembered_in is not None:
        known = _remembered_sum(remembered_in, base)
    if base is None or known is None:
        return page_sum(dest)  # a boot's empty RAM file, or an old checkpoint: in full
    fds = os.open(base, os.O_RDONLY), os.open(dest, os.O_RDONLY)
    try:
        ranges = _blocks(written)
        return (known - _page_terms(fds[0], ranges) + _page_terms(fds[1], ranges)) % _MOD
    finally:
        for fd in fds:
            os.close(fd)


def remember_sum(directory: Path, ram: Path, recorded: str) -> None:
    """Keep ``ram``'s ``recorded`` sum (a checkpoint's RAM file, which a VM maps, and its
    manifest's ``SUM_KEY``) in ``directory`` (the VM's): if its checkpoint is deleted, the
    VM's next checkpoint still updates that sum instead of summing its whole RAM."""
    for old in directory.glob("ram-sum-*"):
        old.unlink(missing_ok=True)
    _sum_file(directory, ram).write_text(f"{SUM_KEY} {recorded}")


def _remembered_sum(directory: Path, ram: Path) -> int | None:
    try:
        key, value = _sum_file(directory, ram).read_text().split()
        return int(value, 16) if key == SUM_KEY else None
    except (OSError, ValueError):
        return None


def _sum_file(directory: Path, ram: Path) -> Path:
    """Named by the RAM file's inode: its identity even once it is deleted."""
    return directory / f"ram-sum-{os.stat(ram).st_ino}"


def describe_files(
    files: CheckpointFiles, ram_base: Path | None, written: tuple[tuple[int, int], ...],
    remembered_in: Path | None = None,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The ``files`` map of a freshly written checkpoint (its files are read-only now),
    whose RAM file is a copy of ``ram_base`` with the ``written`` runs replaced (see
    :func:`updated_page_sum` for ``remembered_in``)."""
    state, ram = files.state.stat(), files.ram.stat()
    return {
        "state": {"size": state.st_size, "sha256": _digest(files.state)},
        "ram": {
            "size": ram.st_size,
            SUM_KEY: f"{updated_page_sum(ram_base, files.ram, written, remembered_in):032x}",
            "ctime_ns": ram.st_ctime_ns,
        },
    }


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
    sum_key = next((k for k in _BLOCK_OF_KEY if k in want), None)
    if key == "ram" and sum_key is None:
        return result(None, False)  # a sum of another kind: the size is all we can check
    if key == "ram" and sum_key is not None:
        same = f"{page_sum(path, sum_key):032x}" == want[sum_key]
    else:
        same = _digest(path) == want.get("sha256")
    if not same:
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
