"""``scan``: the file tree, processes and listening TCP sockets, for a diff on the host.

The walk is the cost (one ``lstat`` per entry; ≈ 1.5–2 s for 18,000 entries under TCG), so
it sends no content hashes: inode and ctime are the fingerprint. Any write, rename,
chmod or chown changes a file's ctime, and ctime cannot be set from user space, so two
scans of one filesystem lineage (a session and a fork of its checkpoint) see equal
fingerprints exactly where nothing was touched. The paths and the numbers are packed
(NUL-terminated bytes; int64 arrays), zlib-compressed and streamed as chunk events (no
frame limit on the tree's size): the walk does no formatting.
"""

from __future__ import annotations

import array
import os
import stat
import time
import zlib

from ..protocol import CHUNK_BYTES, Empty, EventKind, ListeningSocket, ScanArgs, ScanResult
from .context import ConnectionGone, Context
from .procs import ProcessOps

__all__ = ["ScanOps", "listening_sockets", "walk"]

_TCP_LISTEN = "0A"


def walk(roots: list[str], exclude: list[str]) -> tuple[bytes, bytes, int]:
    """Every entry under ``roots`` (the roots included): the paths, each followed by a
    NUL, and per entry four int64s (native order): size, ``st_mode``, inode, ctime (ns)
    (no mtime: writing a file changes its ctime too). Kept to the bare loop: under TCG
    each Python operation per entry shows."""
    skip = {os.fsencode(p.rstrip("/") or "/") for p in exclude}
    paths: list[bytes] = []
    nums = array.array("q")
    todo: list[bytes] = []
    add_path, add_nums, is_dir = paths.append, nums.extend, stat.S_ISDIR
    for root in roots:
        broot = os.fsencode(root.rstrip("/") or "/")
        try:
            st = os.lstat(broot)
        except OSError:
            continue
        add_path(broot)
        add_nums((st.st_size, st.st_mode, st.st_ino, st.st_ctime_ns))
        if is_dir(st.st_mode) and broot not in skip:
            todo.append(broot)
    while todo:
        directory = todo.pop()
        try:
            it = os.scandir(directory)
        except OSError:
            continue  # unreadable, or gone meanwhile
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                path = entry.path
                add_path(path)
                add_nums((st.st_size, st.st_mode, st.st_ino, st.st_ctime_ns))
                if is_dir(st.st_mode) and path not in skip:
                    todo.append(path)
    paths.append(b"")
    return b"\0".join(paths), nums.tobytes(), len(nums) // 4


def _socket_owners() -> dict[str, int]:
    """socket inode → pid, from ``/proc/*/fd``."""
    owners: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners.setdefault(target[8:-1], int(entry))
    return owners


def _address(hex_addr: str) -> str:
    if len(hex_addr) == 8:  # IPv4, little-endian
        return ".".join(str(int(hex_addr[i : i + 2], 16)) for i in (6, 4, 2, 0))
    words = [hex_addr[i : i + 8] for i in range(0, 32, 8)]
    raw = b"".join(bytes.fromhex(w)[::-1] for w in words)
    groups = [raw[i : i + 2].hex() for i in range(0, 16, 2)]
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(str(b) for b in raw[12:])
    text = ":".join(g.lstrip("0") or "0" for g in groups)
    return "::" if text == "0:0:0:0:0:0:0:0" else text


def listening_sockets() -> list[ListeningSocket]:
    """Listening TCP sockets (IPv4 and IPv6), sorted by port and address."""
    found: dict[tuple[int, str], str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            hex_addr, _, hex_port = fields[1].partition(":")
            found[(int(hex_port, 16), _address(hex_addr))] = fields[9]
    owners = _socket_owners() if found else {}
    return [
        ListeningSocket(address=addr, port=port, pid=owners.get(inode, 0))
        for (port, addr), inode in sorted(found.items())
    ]


class ScanOps:
    def __init__(self, procs: ProcessOps) -> None:
        self._procs = procs

    def scan(self, ctx: Context, args: ScanArgs) -> ScanResult:
        started = time.monotonic()
        processes = self._procs.ps(ctx, Empty()).processes  # before the walk: fewer races
        listening = listening_sockets()
        paths, numbers, count = walk(list(args.roots), list(args.exclude))
        packed_paths, packed_numbers = zlib.compress(paths, 1), zlib.compress(numbers, 1)
        data = packed_paths + packed_numbers
        for offset in range(0, len(data), CHUNK_BYTES):
            if not ctx.emit(EventKind.CHUNK, data[offset : offset + CHUNK_BYTES]):
                raise ConnectionGone
        return ScanResult(
            count=count,
            processes=processes,
            listening=listening,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
            paths_bytes=len(packed_paths),
            numbers_bytes=len(packed_numbers),
        )
