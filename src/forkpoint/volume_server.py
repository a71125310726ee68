"""The host side of a session's volume mounts: one process per VM, serving the guest's
filesystem requests (``guest/volumes.py``) on the VM's ``volumes`` virtio-serial port.

Run as ``python -m forkpoint.volume_server --socket S --volumes DIR --mount ID:/path …``
by the runtime once the VM's QEMU is up. It connects to the port's chardev socket, then
confines itself before it reads a single guest byte: chrooted into the home's volumes
directory and running as :data:`~forkpoint.models.VOLUME_UID` (when started as root), and
every path it is asked for is walked without following a symlink
(:func:`forkpoint.volume_fs.open_dir`) inside the volume the request names — a guest can
plant symlinks in its volume, never reach past it. It first tells the guest what to mount
where (mounts already in place, as after a fork or rollback, are kept), prints ``ready``
on stdout when the guest has answered, and ends when the VM does (its socket closes).

It holds no state between requests (no open files): a restored VM's guest simply sends
its requests to the next server.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import json
import os
import socket
import stat
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from forkpoint.models import VOLUME_UID
from forkpoint.protocol import (
    SYNC,
    SYNC_MAGIC,
    FrameDecoder,
    encode_frame,
)
from forkpoint.volume_fs import open_dir, parts_of

__all__ = ["main", "serve"]

_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Largest read the guest may ask for in one request (its FUSE max_write is 128 KiB).
_MAX_READ = 1 << 20


def _attr(st: os.stat_result) -> dict[str, int]:
    own = (VOLUME_UID, VOLUME_UID)
    uid, gid = (0, 0) if (st.st_uid, st.st_gid) == own else (st.st_uid, st.st_gid)
    return {
        "mode": st.st_mode, "size": st.st_size, "blocks": st.st_blocks, "nlink": st.st_nlink,
        "uid": uid, "gid": gid, "atime_ns": st.st_atime_ns, "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }  # fmt: skip


class Volumes:
    """The mounted volumes' directories (``root / id``) and the operations on them."""

    def __init__(self, root: Path, volume_ids: set[str]) -> None:
        self.root = root
        self.ids = volume_ids

    def _top(self, vol: str) -> Path:
        if vol not in self.ids:
            raise OSError(errno.EACCES, "not a volume of this session")
        return self.root / vol

    @contextlib.contextmanager
    def _at(self, vol: str, path: str) -> Iterator[tuple[int, str]]:
        """The parent directory's descriptor and the last name of ``path`` (not the root)."""
        parts = parts_of(path)
        if not parts:
            raise OSError(errno.EBUSY, "the volume's root")
        fd = open_dir(self._top(vol), parts[:-1])
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _file(self, vol: str, path: str, flags: int) -> Iterator[int]:
        """``path`` opened with ``flags`` (never through a symlink, never waiting on a FIFO)."""
        with self._at(vol, path) as (fd, name):
            file = os.open(name, flags | _NOFOLLOW, dir_fd=fd)
        try:
            yield file
        finally:
            os.close(file)

    @staticmethod
    def _stat(fd: int, name: str) -> dict[str, int]:
        return _attr(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def getattr(self, vol: str, path: str) -> dict[str, Any]:
        if not parts_of(path):
            return {"attr": _attr(os.stat(self._top(vol)))}
        with self._at(vol, path) as (fd, name):
            return {"attr": self._stat(fd, name)}

    def readdir(self, vol: str, path: str) -> dict[str, Any]:
        fd = open_dir(self._top(vol), parts_of(path))
        try:
            entries = [
                [entry.name, stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)]
                for entry in os.scandir(fd)
            ]
        finally:
            os.close(fd)
        return {"entries": entries}

    def read(self, vol: str, path: str, offset: int, size: int) -> dict[str, Any]:
        with self._file(vol, path, os.O_RDONLY) as file:
            data = os.pread(file, min(size, _MAX_READ), offset)
        return {"data": base64.b64encode(data).decode()}

    def write(self, vol: str, path: str, offset: int, data: str) -> dict[str, Any]:
        with self._file(vol, path, os.O_WRONLY) as file:
            return {"size": os.pwrite(file, base64.b64decode(data), offset)}

    def create(self, vol: str, path: str, mode: int, flags: int) -> dict[str, Any]:
        with self._at(vol, path) as (fd, name):
            extra = flags & (os.O_EXCL | os.O_TRUNC)
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | extra | _NOFOLLOW, mode, dir_fd=fd))
            return {"attr": self._stat(fd, name)}

    def mkdir(self, vol: str, path: str, mode: int) -> dict[str, Any]:
        with self._at(vol, path) as (fd, name):
            os.mkdir(name, mode, dir_fd=fd)
            return {"attr": self._stat(fd, name)}

    def symlink(self, vol: str, path: str, target: str) -> dict[str, Any]:
        with self._at(vol, path) as (fd, name):
            os.symlink(target, name, dir_fd=fd)  # followed by the guest, inside the guest
            return {"attr": self._stat(fd, name)}

    def readlink(self, vol: str, path: str) -> dict[str, Any]:
        with self._at(vol, path) as (fd, name):
            return {"target": os.readlink(name, dir_fd=fd)}

    def unlink(self, vol: str, path: str) -> dict[str, Any]:
        with self._at(vol, path) as (fd, name):
            os.unlink(name, dir_fd=fd)
        return {}

    def rmdir(self, vol: str, path: str) -> dict[str, Any]:
        with self._at(vol, path) as (fd, name):
            os.rmdir(name, dir_fd=fd)
        return {}

    def rename(self, vol: str, path: str, new: str, flags: int) -> dict[str, Any]:
        if flags & ~1:  # RENAME_NOREPLACE only; an exchange or whiteout is not offered
            raise OSError(errno.EINVAL, "unsupported rename flags")
        with self._at(vol, path) as (fd, name), self._at(vol, new) as (new_fd, new_name):
            if flags & 1:
                try:
                    os.stat(new_name, dir_fd=new_fd, follow_symlinks=False)
                except FileNotFoundError:
                    pass
                else:
                    raise OSError(errno.EEXIST, "exists")
            os.rename(name, new_name, src_dir_fd=fd, dst_dir_fd=new_fd)
        return {}

    def setattr(self, vol: str, path: str, **changes: int) -> dict[str, Any]:
        if "size" in changes:
            with self._file(vol, path, os.O_WRONLY) as file:
                os.ftruncate(file, changes["size"])
        with self._at(vol, path) as (fd, name):
            if "mode" in changes:
                os.chmod(name, changes["mode"] & 0o7777, dir_fd=fd, follow_symlinks=False)
            if "uid" in changes or "gid" in changes:
                os.chown(name, changes.get("uid", -1), changes.get("gid", -1), dir_fd=fd,
                         follow_symlinks=False)  # fmt: skip
            if "atime_ns" in changes or "mtime_ns" in changes:
                now = os.stat(name, dir_fd=fd, follow_symlinks=False)
                times = (changes.get("atime_ns", now.st_atime_ns),
                         changes.get("mtime_ns", now.st_mtime_ns))  # fmt: skip
                os.utime(name, ns=times, dir_fd=fd, follow_symlinks=False)
            return {"attr": self._stat(fd, name)}

    def statfs(self, vol: str, path: str) -> dict[str, Any]:
        st = os.statvfs(self._top(vol))
        return {"statfs": [st.f_blocks, st.f_bfree, st.f_bavail, st.f_files, st.f_ffree,
                           st.f_bsize, st.f_namemax, st.f_frsize]}  # fmt: skip

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply to one guest request: its ``id``, ``err`` (an errno, 0: done) and
        what the operation returns."""
        args = {k: v for k, v in request.items() if k not in ("id", "op")}
        handler = getattr(self, str(request.get("op")), None)
        if request.get("op") not in _OPS or handler is None:
            return {"id": request.get("id"), "err": errno.ENOSYS}
        try:
            return {"id": request.get("id"), "err": 0, **handler(**args)}
        except OSError as e:
            return {"id": request.get("id"), "err": e.errno or errno.EIO}
        except (TypeError, ValueError, KeyError):  # a malformed request: never a crash
            return {"id": request.get("id"), "err": errno.EINVAL}
        except Exception:  # a bug must cost one request, not every mount of the VM
            traceback.print_exc()
            return {"id": request.get("id"), "err": errno.EIO}


_OPS = frozenset({
    "getattr", "readdir", "read", "write", "create", "mkdir", "symlink", "readlink",
    "unlink", "rmdir", "rename", "setattr", "statfs",
})  # fmt: skip


def _confine(volumes_dir: Path) -> Path:
    """Chroot into the volumes directory and drop to the volumes' uid (as root); the
    volumes' root as this process now sees it."""
    if os.geteuid() != 0:
        return volumes_dir  # a user's own forkpoint: its volumes are its own files
    os.chroot(volumes_dir)
    os.chdir("/")
    os.setgroups([])
    os.setgid(VOLUME_UID)
    os.setuid(VOLUME_UID)
    return Path("/")


def serve(
    sock: socket.socket, volumes: Volumes, mounts: list[dict[str, str]], ready: IO[str]
) -> None:
    """Tell the guest its mounts, then answer its requests until the VM is gone; the
    guest's answer to the mounts (``{path: "mounted" | "kept" | "error: …"}``) goes to
    ``ready`` as a line of JSON."""
    sock.sendall(SYNC_MAGIC + encode_frame({"mounts": mounts}))
    decoder = FrameDecoder()
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return
        decoder.feed(data)
        while (message := decoder.next_valid()) is not None:
            if message is SYNC or not isinstance(message, dict):
                continue
            if "mounted" in message:  # the guest's answer to the mounts
                with contextlib.suppress(OSError, ValueError):  # no one waits any more
                    ready.write(json.dumps(message["mounted"]) + "\n")
                    ready.close()
                continue
            sock.sendall(encode_frame(volumes.answer(message)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forkpoint-volume-server", description=__doc__)
    parser.add_argument("--vm", required=True, help="the VM's name (marks this process)")
    parser.add_argument("--socket", required=True, help="the VM's volumes chardev socket")
    parser.add_argument("--ready-fd", type=int, help="where the guest's answer goes")
    parser.add_argument("--go-fd", type=int, help="connect once this has bytes (the VM runs)")
    parser.add_argument("--volumes", required=True, help="the home's volumes directory")
    parser.add_argument("--mount", action="append", default=[], help="VOLUME_ID:/guest/path")
    opts = parser.parse_args(argv)
    mounts = [dict(zip(("vol", "at"), m.split(":", 1), strict=True)) for m in opts.mount]
    if opts.go_fd is not None:  # spawned while the VM loads: wait until it runs
        with os.fdopen(opts.go_fd, "rb") as go:
            if not go.read(1):
                return 0  # the restore failed: its VM will never run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(opts.socket)  # before the chroot: the socket is outside it
    root = _confine(Path(opts.volumes))
    ready = os.fdopen(opts.ready_fd, "w") if opts.ready_fd is not None else sys.stdout
    try:
        serve(sock, Volumes(root, {m["vol"] for m in mounts}), mounts, ready)
    except (ConnectionError, OSError) as e:
        print(f"volume server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
