"""Volume mounts in the guest: a FUSE filesystem per mount, served by the host.

The kernel's FUSE requests (``/dev/fuse``) are turned into path-based requests to the
host's volume server (``forkpoint/volume_server.py``) over the virtio-serial port
``volumes``, as JSON frames; the host answers each with an errno and its result. The host
tells this bridge what to mount where when it connects; a mount already in place is kept.

Everything a mount needs lives here, in guest memory: the FUSE connection, the node ids
the kernel knows and their paths. A checkpoint therefore holds the mounts whole, and a
fork or rollback needs nothing but a new host server: when one connects (``SYNC``), a
request still waiting for its answer is sent again. The host keeps no state between
requests (no open files), so a request is answered the same by any server.

The guest's own permission checks are off (no ``default_permissions``): every user of the
guest may read and write a volume, as the host's volume user may.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import os
import posixpath
import stat
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from ..protocol import (
    SYNC,
    VOLUMES_PORT,
    FrameDecoder,
    encode_frame,
)
from .transport import Disconnected, Transport, TransportClosed

__all__ = ["VolumeBridge", "start_bridge"]

#: A request with no answer this long is sent again (a new host also triggers a resend).
RESEND_S = 30.0
#: Sent this many times without an answer, a request fails with EIO rather than hang the
#: guest's process for ever (a host whose server is gone).
SENDS = 4
#: What the kernel may cache of a name or its attributes (s): volumes are shared.
_VALID_S = 1
_MAX_WRITE = 128 * 1024
_IN_HEADER = struct.Struct("<IIQQIIIHH")  # fuse_in_header
_OUT_HEADER = struct.Struct("<IiQ")  # fuse_out_header
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
_ENTRY = struct.Struct("<QQQQII")  # fuse_entry_out, before its attr
_ATTR_OUT = struct.Struct("<QII")  # fuse_attr_out, before its attr
_OPEN_OUT = struct.Struct("<QII")
_SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
_DIRENT = struct.Struct("<QQII")

# Opcodes (linux/fuse.h).
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME = 8, 9, 10, 11, 12
OPEN, READ, WRITE, STATFS, RELEASE, FSYNC, FLUSH, INIT = 14, 15, 16, 17, 18, 20, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, ACCESS, CREATE = 27, 28, 29, 30, 34, 35
INTERRUPT, DESTROY, BATCH_FORGET, RENAME2 = 36, 38, 42, 45
_NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT})
_EMPTY_OK = frozenset({RELEASE, FSYNC, FLUSH, FSYNCDIR, ACCESS, DESTROY})
_FUSE_BIG_WRITES = 1 << 5
_MS_NOSUID, _MS_NODEV = 2, 4


class HostLink:
    """Requests to the host's volume server, answered by id; resent to a new host."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        # Frames go out whole: mounts' threads and the mount table's answer share the port.
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._next_id = 0
        self._host = 0  # counts host connections: a new one makes waiters send again

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        with self._cond:
            self._next_id += 1
            request_id = self._next_id
        frame = encode_frame({"op": op, "id": request_id, **args})
        for _ in range(SENDS):
            with self._cond:
                host = self._host
            self._send(frame)  # False with no host: the next one gets it
            deadline = time.monotonic() + RESEND_S
            with self._cond:
                while request_id not in self._replies and host == self._host:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if request_id in self._replies:
                    return self._replies.pop(request_id)
        return {"id": request_id, "err": errno.EIO}

    def tell(self, message: dict[str, Any]) -> None:
        self._send(encode_frame(message))

    def _send(self, frame: bytes) -> bool:
        with self._send_lock:
            return self._transport.send(frame)

    def connected(self) -> None:
        """A new host connected: what waits for an answer is sent again."""
        with self._cond:
            self._host += 1
            self._cond.notify_all()

    def answered(self, reply: dict[str, Any]) -> None:
        with self._cond:
            self._replies[int(reply["id"])] = reply
            self._cond.notify_all()


class VolumeBridge:
    """Reads the host's messages: mount tables and answers."""

    def __init__(self, transport: Transport) -> None:
        self.link = HostLink(transport)
        self._transport = transport
        self.mounts: dict[str, FuseMount] = {}
        self._mounting = threading.Lock()  # two mount tables in a row: one mount each

    def serve_forever(self) -> None:
        decoder = FrameDecoder(require_sync=True)
        while True:
            try:
                data = self._transport.recv()
            except Disconnected:
                decoder.reset(require_sync=True)
                continue
            except TransportClosed:
                return
            decoder.feed(data)
            while (message := decoder.next_valid()) is not None:
                if message is SYNC:
                    self.link.connected()
                elif isinstance(message, dict) and "mounts" in message:
                    threading.Thread(
                        target=self._mount_all, args=(message["mounts"],), daemon=True
                    ).start()
                elif isinstance(message, dict) and "id" in message:
                    self.link.answered(message)

    def _mount_all(self, mounts: list[dict[str, str]]) -> None:
        with self._mounting:
            outcome = self._mount_each(mounts)
        self.link.tell({"mounted": outcome})

    def _mount_each(self, mounts: list[dict[str, str]]) -> dict[str, str]:
        outcome: dict[str, str] = {}
        for mount in mounts:
            at = posixpath.normpath(mount["at"])
            if at in self.mounts:
                outcome[at] = "kept"
                continue
            try:
                self.mounts[at] = FuseMount.mount(self.link, mount["vol"], at)
                outcome[at] = "mounted"
            except OSError as e:
                outcome[at] = f"error: {e}"
        return outcome


def _mount_syscall(fd: int, at: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40755,user_id=0,group_id=0,allow_other".encode()
    flags = _MS_NOSUID | _MS_NODEV
    if libc.mount(b"forkpoint-volume", at.encode(), b"fuse", flags, options) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {at}: {os.strerror(code)}")


class FuseMount:
    """One FUSE mount: the kernel's requests read and answered on its own thread."""

    def __init__(self, link: HostLink, vol: str, fd: int) -> None:
        self.link = link
        self.vol = vol
        self.fd = fd
        self.paths: dict[int, str] = {1: "/"}
        self.nodes: dict[str, int] = {"/": 1}
        self.lookups: dict[int, int] = {}
        self._next_node = 2
        self.dirs: dict[int, list[tuple[str, int]]] = {}
        self._next_fh = 1

    @classmethod
    def mount(cls, link: HostLink, vol: str, at: str) -> FuseMount:
        os.makedirs(at, exist_ok=True)
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        try:
            _mount_syscall(fd, at)
        except BaseException:
            os.close(fd)
            raise
        mount = cls(link, vol, fd)
        threading.Thread(target=mount.serve, name=f"volume {at}", daemon=True).start()
        return mount

    # -- the kernel's side --------------------------------------------------------------

    def serve(self) -> None:
        while True:
            try:
                request = os.read(self.fd, _MAX_WRITE + 64 * 1024)
            except OSError as e:
                if e.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):
                    continue  # an interrupted request: the kernel dropped it
                return  # ENODEV: unmounted
            length, opcode, unique, node, _uid, _gid, _pid, _ext, _ = _IN_HEADER.unpack_from(
                request
            )
            body = request[_IN_HEADER.size : length]
            if opcode in _NO_REPLY:
                self._forget(opcode, node, body)
                continue
            try:
                out = self._handle(opcode, node, body)
                error = 0
            except OSError as e:
                out, error = b"", e.errno or errno.EIO
            except Exception:  # a malformed request or answer: that one fails, not the mount
                out, error = b"", errno.EIO
            try:
                os.write(self.fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(out), -error, unique)
                         + out)  # fmt: skip
            except OSError:
                pass  # the request was interrupted meanwhile
            if opcode == DESTROY:
                return

    def _host(self, op: str, path: str, **args: Any) -> dict[str, Any]:
        reply = self.link.call(op, vol=self.vol, path=path, **args)
        if reply.get("err"):
            raise OSError(int(reply["err"]), os.strerror(int(reply["err"])))
        return reply

    def _path(self, node: int) -> str:
        try:
            return self.paths[node]
        except KeyError:
            raise OSError(errno.ESTALE, "unknown node") from None

    def _child(self, node: int, name: bytes) -> str:
        return posixpath.join(
            self._path(node), name.split(b"\0", 1)[0].decode(errors="surrogateescape")
        )

    def _node_for(self, path: str) -> int:
        node = self.nodes.get(path)
        if node is None:
            node = self._next_node
            self._next_node += 1
            self.nodes[path], self.paths[node] = node, path
        self.lookups[node] = self.lookups.get(node, 0) + 1
        return node

    def _attr(self, node: int, a: dict[str, int]) -> bytes:
        sec = [a[k] // 1_000_000_000 for k in ("atime_ns", "mtime_ns", "ctime_ns")]
        nsec = [a[k] % 1_000_000_000 for k in ("atime_ns", "mtime_ns", "ctime_ns")]
        return _ATTR.pack(node, a["size"], a["blocks"], *sec, *nsec, a["mode"], a["nlink"],
                          a["uid"], a["gid"], 0, 4096, 0)  # fmt: skip

    def _entry(self, path: str, attr: dict[str, int]) -> bytes:
        node = self._node_for(path)
        return _ENTRY.pack(node, 0, _VALID_S, _VALID_S, 0, 0) + self._attr(node, attr)

    def _forget(self, opcode: int, node: int, body: bytes) -> None:
        if opcode == FORGET:
            pairs = [(node, struct.unpack_from("<Q", body)[0])]
        elif opcode == BATCH_FORGET:
            count = struct.unpack_from("<I", body)[0]
            pairs = [struct.unpack_from("<QQ", body, 8 + 16 * i) for i in range(count)]
        else:
            return
        for forgotten, times in pairs:
            left = self.lookups.get(forgotten, 0) - times
            if left > 0 or forgotten == 1:
                self.lookups[forgotten] = left
                continue
            self.lookups.pop(forgotten, None)
            path = self.paths.pop(forgotten, None)
            if path is not None and self.nodes.get(path) == forgotten:
                del self.nodes[path]

    def _renamed(self, old: str, new: str) -> None:
        """Move the names under ``old`` to ``new`` (the nodes the kernel holds stay)."""
        self.nodes.pop(new, None)
        for path in [p for p in self.nodes if p == old or p.startswith(old + "/")]:
            node = self.nodes.pop(path)
            moved = new + path[len(old) :]
            self.nodes[moved], self.paths[node] = node, moved

    def _handle(self, opcode: int, node: int, body: bytes) -> bytes:
        if opcode in _EMPTY_OK:
            return b""
        operation = _OPERATIONS.get(opcode)
        if operation is None:
            raise OSError(errno.ENOSYS, "not offered")
        return operation(self, opcode, node, body)

    # One method per request (``_OPERATIONS``): the reply's body, or an OSError.

    def _init(self, opcode: int, node: int, body: bytes) -> bytes:
        major, minor, readahead, flags = struct.unpack_from("<IIII", body)
        if major != 7:
            raise OSError(errno.EPROTO, "FUSE major version")
        return struct.pack("<IIIIHHIIHHI", 7, min(minor, 31), readahead,
                           flags & _FUSE_BIG_WRITES, 16, 12, _MAX_WRITE, 1, 0, 0, 0) + (
            bytes(28)
        )  # fmt: skip

    def _lookup(self, opcode: int, node: int, body: bytes) -> bytes:
        path = self._child(node, body)
        return self._entry(path, self._host("getattr", path)["attr"])

    def _getattr(self, opcode: int, node: int, body: bytes) -> bytes:
        attr = self._host("getattr", self._path(node))["attr"]
        return _ATTR_OUT.pack(_VALID_S, 0, 0) + self._attr(node, attr)

    def _readlink(self, opcode: int, node: int, body: bytes) -> bytes:
        return os.fsencode(self._host("readlink", self._path(node))["target"])

    def _symlink(self, opcode: int, node: int, body: bytes) -> bytes:
        name, target = body.split(b"\0")[:2]
        path = self._child(node, name)
        return self._entry(path, self._host("symlink", path, target=os.fsdecode(target))["attr"])

    def _create(self, opcode: int, node: int, body: bytes) -> bytes:
        """CREATE (open it too) and MKNOD (a regular file only, which must be new)."""
        flags, mode = (os.O_EXCL, struct.unpack_from("<I", body)[0]) if opcode == MKNOD else (
            struct.unpack_from("<II", body))  # fmt: skip
        umask = struct.unpack_from("<I", body, 8)[0]
        if not stat.S_ISREG(mode):
            raise OSError(errno.EPERM, "only regular files")
        path = self._child(node, body[16:])
        attr = self._host("create", path, mode=mode & ~umask & 0o7777, flags=flags)["attr"]
        entry = self._entry(path, attr)
        return entry + _OPEN_OUT.pack(0, 0, 0) if opcode == CREATE else entry

    def _mkdir(self, opcode: int, node: int, body: bytes) -> bytes:
        mode, umask = struct.unpack_from("<II", body)
        path = self._child(node, body[8:])
        return self._entry(path, self._host("mkdir", path, mode=mode & ~umask & 0o7777)["attr"])

    def _remove(self, opcode: int, node: int, body: bytes) -> bytes:
        path = self._child(node, body)
        self._host("unlink" if opcode == UNLINK else "rmdir", path)
        self.nodes.pop(path, None)
        return b""

    def _rename(self, opcode: int, node: int, body: bytes) -> bytes:
        new_dir, flags = (struct.unpack_from("<Q", body)[0], 0) if opcode == RENAME else (
            struct.unpack_from("<QI", body))  # fmt: skip
        names = body[8 if opcode == RENAME else 16 :].split(b"\0")
        old, new = self._child(node, names[0]), self._child(new_dir, names[1])
        self._host("rename", old, new=new, flags=flags)
        self._renamed(old, new)
        return b""

    def _open(self, opcode: int, node: int, body: bytes) -> bytes:
        if struct.unpack_from("<I", body)[0] & os.O_TRUNC:
            self._host("setattr", self._path(node), size=0)
        return _OPEN_OUT.pack(0, 0, 0)

    def _read(self, opcode: int, node: int, body: bytes) -> bytes:
        _fh, offset, size = struct.unpack_from("<QQI", body)
        data = self._host("read", self._path(node), offset=offset, size=size)["data"]
        return base64.b64decode(data)

    def _write(self, opcode: int, node: int, body: bytes) -> bytes:
        _fh, offset, size = struct.unpack_from("<QQI", body)
        data = base64.b64encode(body[40 : 40 + size]).decode()
        written = self._host("write", self._path(node), offset=offset, data=data)["size"]
        return struct.pack("<II", written, 0)

    def _statfs(self, opcode: int, node: int, body: bytes) -> bytes:
        blocks, bfree, bavail, files, ffree, bsize, namelen, frsize = self._host("statfs", "/")[
            "statfs"
        ]
        return struct.pack("<QQQQQIIII", blocks, bfree, bavail, files, ffree, bsize,
                           namelen, frsize, 0) + bytes(24)  # fmt: skip

    def _opendir(self, opcode: int, node: int, body: bytes) -> bytes:
        listing = self._host("readdir", self._path(node))["entries"]
        fh = self._next_fh
        self._next_fh += 1
        self.dirs[fh] = [(".", stat.S_IFDIR), ("..", stat.S_IFDIR)] + [
            (str(name), int(kind)) for name, kind in listing
        ]
        return _OPEN_OUT.pack(fh, 0, 0)

    def _releasedir(self, opcode: int, node: int, body: bytes) -> bytes:
        self.dirs.pop(struct.unpack_from("<Q", body)[0], None)
        return b""

    def _setattr(self, opcode: int, node: int, body: bytes) -> bytes:
        (valid, _, _fh, size, _lock, atime, mtime, _ctime, atimensec, mtimensec, _ctimensec,
         mode, _, uid, gid, _) = _SETATTR_IN.unpack_from(body)  # fmt: skip
        changes: dict[str, int] = {}
        if valid & 1:
            changes["mode"] = mode
        if valid & 2:
            changes["uid"] = uid
        if valid & 4:
            changes["gid"] = gid
        if valid & 8:
            changes["size"] = size
        if valid & (16 | 128):
            changes["atime_ns"] = time.time_ns() if valid & 128 else atime * 10**9 + atimensec
        if valid & (32 | 256):
            changes["mtime_ns"] = time.time_ns() if valid & 256 else mtime * 10**9 + mtimensec
        attr = self._host("setattr", self._path(node), **changes)["attr"]
        return _ATTR_OUT.pack(_VALID_S, 0, 0) + self._attr(node, attr)

    def _readdir(self, opcode: int, node: int, body: bytes) -> bytes:
        fh, offset, size = struct.unpack_from("<QQI", body)
        entries = self.dirs.get(fh, [])
        base = self._path(node)
        out = bytearray()
        for index in range(offset, len(entries)):
            name, kind = entries[index]
            raw = os.fsencode(name)
            path = posixpath.join(base, name)
            # A stable, non-zero inode number for names the kernel has not looked up.
            ino = self.nodes.get(path) or (
                zlib.crc32(path.encode(errors="surrogateescape")) | 1 << 40
            )
            record = _DIRENT.pack(ino, index + 1, len(raw), kind >> 12) + raw
            record += bytes(-len(record) % 8)
            if len(out) + len(record) > size:
                break
            out += record
        return bytes(out)


_Operation = Callable[[FuseMount, int, int, bytes], bytes]
_OPERATIONS: dict[int, _Operation] = {
    INIT: FuseMount._init, LOOKUP: FuseMount._lookup, GETATTR: FuseMount._getattr,
    SETATTR: FuseMount._setattr, READLINK: FuseMount._readlink, SYMLINK: FuseMount._symlink,
    MKNOD: FuseMount._create, CREATE: FuseMount._create, MKDIR: FuseMount._mkdir,
    UNLINK: FuseMount._remove, RMDIR: FuseMount._remove, RENAME: FuseMount._rename,
    RENAME2: FuseMount._rename, OPEN: FuseMount._open, READ: FuseMount._read,
    WRITE: FuseMount._write, STATFS: FuseMount._statfs, OPENDIR: FuseMount._opendir,
    READDIR: FuseMount._readdir, RELEASEDIR: FuseMount._releasedir,
}  # fmt: skip


def start_bridge() -> VolumeBridge | None:
    """In a guest: serve volume mounts on the ``volumes`` port, if the VM has one (a
    checkpoint from before volumes has not)."""
    from .transport import VirtioPortTransport, find_virtio_port

    try:
        port = find_virtio_port(VOLUMES_PORT, timeout=5.0)
    except FileNotFoundError:
        return None
    bridge = VolumeBridge(VirtioPortTransport(port))
    threading.Thread(target=bridge.serve_forever, name="volumes", daemon=True).start()
    return bridge


def main(argv: list[str] | None = None) -> int:
    """For tests on a host: ``python -m forkpoint.guest.volumes --connect-unix PATH``."""
    import argparse

    from .transport import UnixClientTransport

    parser = argparse.ArgumentParser(prog="forkpoint-volumes")
    parser.add_argument("--connect-unix", required=True, metavar="PATH")
    opts = parser.parse_args(argv)
    VolumeBridge(UnixClientTransport(opts.connect_unix, reconnect_timeout=60)).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
