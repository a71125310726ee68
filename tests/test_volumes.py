"""Volumes without a guest: their files never reached outside their directory (a guest
may plant symlinks), and the same operations through every door that serves them — the
CLI, the SDK (REST, embedded), MCP's table, and the real ``e2b`` SDK's ``Volume`` against
the gateway (control plane and content API, with the volume's own token)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_run import cli
from e2b_gateway import Gateway, running_gateway
from forkpoint import volume_fs
from forkpoint.errors import Conflict, InvalidInput, NotFound
from forkpoint.models import VOLUME_UID
from forkpoint.runtime import Runtime
from forkpoint.sdk import Volume


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A volume directory holding symlinks to a secret outside it (as a guest could)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    root = tmp_path / "volume"
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "kept.txt").write_text("kept")
    os.symlink(outside, root / "dir" / "to-outside")
    os.symlink(outside / "secret", root / "secret-link")
    yield root, outside
    assert (outside / "secret").read_text() == "host secret"  # untouched, whatever ran


def test_no_path_leaves_the_volume(planted: tuple[Path, Path]) -> None:
    root, outside = planted
    # A symlink is never followed: not as a directory, not as the file itself.
    with pytest.raises(Conflict, match="not a directory"):
        volume_fs.read_file(root, "dir/to-outside/secret", 1 << 20)
    with pytest.raises(Conflict, match="not a regular file"):
        volume_fs.read_file(root, "secret-link", 1 << 20)
    with pytest.raises(Conflict):
        volume_fs.write_file(root, "dir/to-outside/new", b"x")
    with pytest.raises(Conflict):
        volume_fs.write_file(root, "secret-link", b"overwritten", force=True)
    with pytest.raises(Conflict):
        volume_fs.list_dir(root, "dir/to-outside")
    with pytest.raises(Conflict):
        volume_fs.make_dir(root, "dir/to-outside/sub", force=True)
    assert sorted(os.listdir(outside)) == ["secret"]
    # `..` climbs no higher than the volume's root.
    assert volume_fs.normalize("../../etc/passwd") == "/etc/passwd"
    with pytest.raises(NotFound):
        volume_fs.read_file(root, "../outside/secret", 1 << 20)
    # A symlink is described as one, and removing it removes the link only.
    listed = {e.path: e.type for e in volume_fs.list_dir(root, "/", depth=3)}
    assert listed == {
        "/dir": "directory", "/dir/kept.txt": "file", "/dir/to-outside": "symlink",
        "/secret-link": "symlink",
    }  # fmt: skip
    volume_fs.remove(root, "secret-link")
    volume_fs.set_metadata(root, "dir/to-outside", mode=0o600)  # the link's, never the target's
    assert (outside.stat().st_mode & 0o777) != 0o600
    volume_fs.remove(root, "dir")  # a tree holding a symlink to a directory
    assert not (root / "dir").exists() and (outside / "secret").exists()
    with pytest.raises(Conflict, match="root"):
        volume_fs.remove(root, "/")
    with pytest.raises(InvalidInput, match="NUL"):
        volume_fs.stat_path(root, "a\0b")


def test_file_operations_and_their_errors(tmp_path: Path) -> None:
    root = tmp_path
    with pytest.raises(NotFound):
        volume_fs.write_file(root, "missing/dir/file", b"x")
    made = volume_fs.make_dir(root, "a/b/c", force=True, mode=0o750)
    assert (made.path, made.type, made.mode) == ("/a/b/c", "directory", 0o750)
    assert volume_fs.make_dir(root, "a/b/c", force=True).path == "/a/b/c"
    with pytest.raises(Conflict, match="already exists"):
        volume_fs.make_dir(root, "a/b/c")
    entry = volume_fs.write_file(root, "/a/b/c/f.bin", b"\0\1\2", mode=0o600)
    assert (entry.name, entry.size, entry.mode, entry.type) == ("f.bin", 3, 0o600, "file")
    with pytest.raises(Conflict, match="already exists"):
        volume_fs.write_file(root, "a/b/c/f.bin", b"new")
    volume_fs.write_file(root, "a/b/c/f.bin", b"new", force=True)
    assert volume_fs.read_file(root, "a/b/c/f.bin", 10) == b"new"
    with pytest.raises(InvalidInput, match="larger than 2 bytes"):
        volume_fs.read_file(root, "a/b/c/f.bin", 2)
    assert [e.path for e in volume_fs.list_dir(root, "a", depth=1)] == ["/a/b"]
    assert [e.path for e in volume_fs.list_dir(root, "a", depth=3)] == [
        "/a/b", "/a/b/c", "/a/b/c/f.bin",
    ]  # fmt: skip
    changed = volume_fs.set_metadata(root, "a/b/c/f.bin", mode=0o640, uid=1000, gid=1000)
    assert (changed.mode, changed.uid, changed.gid) == (0o640, 1000, 1000)
    assert not any(name.startswith(".forkpoint-write") for name in os.listdir(root / "a/b/c"))
    with pytest.raises(Conflict, match="not a regular file"):
        volume_fs.read_file(root, "a", 10)
    os.mkfifo(root / "fifo")  # a guest's FIFO: refused at once, never waited on
    with pytest.raises(Conflict, match="not a regular file"):
        volume_fs.read_file(root, "fifo", 10)


def test_the_sdk_and_the_cli_share_one_volume() -> None:
    name = f"notes-{uuid.uuid4().hex[:8]}"
    runtime = Runtime.open()
    try:
        with Volume.create(name, runtime=runtime) as volume:
            assert volume.name == name and volume.id.startswith("v-")
            with pytest.raises(Conflict, match="exists already"):
                Volume.create(name, runtime=runtime)
            volume.make_dir("docs/drafts", force=True)
            volume.write("docs/drafts/plan.md", "# plan\n")
            assert volume.read("docs/drafts/plan.md") == b"# plan\n"
            assert volume.exists("docs") and not volume.exists("nope")
            with pytest.raises(Conflict):
                volume.write("docs/drafts/plan.md", "again")
            assert volume.set_metadata("docs/drafts/plan.md", mode=0o600).mode == 0o600

            # The CLI sees the same files (another process, the same home).
            cli("volume", "put", name, "docs/cli.txt", "-", code=0)
            shown = json.loads(
                cli("volume", "files", name, "docs", "--json", "--depth", "2").stdout
            )
            assert [e["path"] for e in shown] == ["/docs/cli.txt", "/docs/drafts",
                                                   "/docs/drafts/plan.md"]  # fmt: skip
            assert cli("volume", "get", name, "docs/drafts/plan.md").stdout == b"# plan\n"
            listed = json.loads(cli("volume", "ls", "--json").stdout)
            mine = next(v for v in listed if v["name"] == name)
            assert mine["id"] == volume.id and mine["size_bytes"] > 0
            assert b"no volume" in cli("volume", "show", "nope-" + name, code=3).stderr
            assert (
                b"already exists" in cli("volume", "put", name, "docs/cli.txt", "-", code=4).stderr
            )
            volume.remove("docs")
            assert volume.list_dir("/") == []
            volume.destroy()
        with pytest.raises(NotFound):
            Volume.get(name, runtime=runtime)
        assert not (runtime.home.volumes / volume.id).exists()
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with running_gateway() as running:
        yield running


def test_e2b_volumes_with_the_real_sdk(gateway: Gateway) -> None:
    from e2b import Volume as E2BVolume
    from e2b.exceptions import AuthenticationException, VolumePathNotFoundException

    name = f"e2b-{uuid.uuid4().hex[:8]}"
    volume = E2BVolume.create(name)
    assert volume.volume_id.startswith("v-") and volume.token
    try:
        info = E2BVolume.get_info(volume.volume_id)
        assert info.name == name
        assert name in {v.name for v in E2BVolume.list()}

        volume.make_dir("data/raw", force=True)
        stat = volume.write_file("data/raw/hello.txt", "hello volume")
        assert stat.size == len("hello volume") and stat.type.value == "file"
        assert volume.read_file("data/raw/hello.txt") == "hello volume"
        assert volume.read_file("data/raw/hello.txt", format="bytes") == b"hello volume"
        assert b"".join(volume.read_file("data/raw/hello.txt", format="stream")) == (
            b"hello volume"
        )
        assert [e.name for e in volume.list("data", depth=2)] == ["raw", "hello.txt"]
        assert volume.exists("data/raw/hello.txt") and not volume.exists("data/none")
        updated = volume.update_metadata("data/raw/hello.txt", mode=0o600)
        assert updated.mode == 0o600
        with pytest.raises(VolumePathNotFoundException):
            volume.read_file("data/none.txt")
        with pytest.raises(Exception, match="already exists"):
            volume.write_file("data/raw/hello.txt", "again")
        volume.remove("data")
        assert volume.list("/") == []

        # The content API answers the volume's own token only.
        stranger = E2BVolume(volume_id=volume.volume_id, name=name, token="not-the-token")
        with pytest.raises(AuthenticationException):
            stranger.read_file("anything")
        # A sandbox asking for a volume that does not exist is told so (no VM is started).
        from e2b import Sandbox, SandboxException

        with pytest.raises(SandboxException, match="404: no volume 'nope'"):
            Sandbox.create(volume_mounts={"/mnt/nope": "nope"})
        # What the E2B SDK wrote is forkpoint's volume.
        volume.write_file("shared.txt", b"one volume")
        runtime = Runtime.open()
        try:
            assert runtime.get_volume(name).id == volume.volume_id
            assert (runtime.volume_files(runtime.get_volume(name)) / "shared.txt").read_bytes() == (
                b"one volume"
            )
        finally:
            runtime.close()
    finally:
        E2BVolume.destroy(volume.volume_id)
    assert name not in {v.name for v in E2BVolume.list()}


def _relay(listener: socket.socket) -> None:
    """Stand in for QEMU's chardev: the guest side connects first, then the host's
    server; bytes pass both ways until either closes."""
    guest, _ = listener.accept()
    host, _ = listener.accept()

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    with guest, host:
        back = threading.Thread(target=pipe, args=(host, guest), daemon=True)
        back.start()
        pipe(guest, host)
        back.join()


def _server(sock: Path, volumes: Path, *mounts: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "forkpoint.volume_server", "--vm", "test-vm", "--socket",
         str(sock), "--volumes", str(volumes), *(a for m in mounts for a in ("--mount", m))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting FUSE takes root")
def test_the_guest_bridge_serves_a_volume_over_fuse_and_survives_a_new_host(
    tmp_path: Path,
) -> None:
    """The guest's side (guest/volumes.py) run on this host's kernel: a real FUSE mount
    served by a real volume server through a relay standing in for QEMU's chardev."""
    volumes, mnt, mnt2 = tmp_path / "volumes", tmp_path / "mnt", tmp_path / "mnt2"
    (volumes / "v-1").mkdir(parents=True)
    (volumes / "v-2").mkdir()
    os.chown(volumes / "v-2", VOLUME_UID, VOLUME_UID)
    (volumes / "v-other").mkdir()
    (volumes / "v-other" / "secret").write_text("not yours")
    os.chown(volumes / "v-1", VOLUME_UID, VOLUME_UID)
    sock = tmp_path / "vol.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen(2)
    bridge = subprocess.Popen(
        [sys.executable, "-m", "forkpoint.guest.volumes", "--connect-unix", str(sock)]
    )
    server = None
    try:
        threading.Thread(target=_relay, args=(listener,), daemon=True).start()
        server = _server(sock, volumes, f"v-1:{mnt}", f"v-2:{mnt2}")
        assert json.loads(server.stdout.readline() if server.stdout else "") == {
            str(mnt): "mounted", str(mnt2): "mounted",
        }  # fmt: skip
        # Two mounts writing at once share the one port: their frames never mix.
        blobs = {mnt / "x.bin": os.urandom(3 << 20), mnt2 / "y.bin": os.urandom(3 << 20)}
        writers = [threading.Thread(target=p.write_bytes, args=(b,)) for p, b in blobs.items()]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        assert (volumes / "v-1" / "x.bin").read_bytes() == blobs[mnt / "x.bin"]
        assert (volumes / "v-2" / "y.bin").read_bytes() == blobs[mnt2 / "y.bin"]
        (mnt / "x.bin").unlink()
        (mnt / "notes").mkdir()
        (mnt / "notes" / "a.txt").write_text("one")
        with (mnt / "notes" / "a.txt").open("a") as f:
            f.write(" two")
        (mnt / "notes" / "a.txt").rename(mnt / "notes" / "b.txt")
        (mnt / "big.bin").write_bytes(os.urandom(1 << 20) * 3)
        os.symlink("/etc/passwd", mnt / "link")
        assert (volumes / "v-1" / "notes" / "b.txt").read_text() == "one two"
        assert os.stat(volumes / "v-1" / "notes" / "b.txt").st_uid == VOLUME_UID
        assert (volumes / "v-1" / "big.bin").stat().st_size == 3 << 20
        assert os.readlink(volumes / "v-1" / "link") == "/etc/passwd"  # kept as a link
        assert sorted(os.listdir(mnt)) == ["big.bin", "link", "notes"]
        assert (mnt / "notes" / "b.txt").stat().st_uid == 0  # the volumes' user, shown as root
        os.truncate(mnt / "big.bin", 10)
        assert (volumes / "v-1" / "big.bin").stat().st_size == 10
        # The server was never told of v-other, and `..` stays in v-1.
        assert not (mnt / ".." / "v-other").exists() or "secret" not in os.listdir(mnt / "..")

        # The VM's QEMU goes (a checkpoint restored elsewhere): a new server takes over,
        # the mount is kept, and what waited meanwhile is answered.
        server.kill()
        server.communicate()
        threading.Thread(target=_relay, args=(listener,), daemon=True).start()
        server = _server(sock, volumes, f"v-1:{mnt}", f"v-2:{mnt2}")
        assert json.loads(server.stdout.readline() if server.stdout else "") == {
            str(mnt): "kept", str(mnt2): "kept",
        }  # fmt: skip
        (volumes / "v-1" / "from-the-host").write_text("written beside")
        time.sleep(1.2)  # the kernel's cached listing expires (1 s)
        assert (mnt / "from-the-host").read_text() == "written beside"
        (mnt / "notes" / "b.txt").unlink()
        (mnt / "notes").rmdir()
        assert sorted(os.listdir(volumes / "v-1")) == ["big.bin", "from-the-host", "link"]
    finally:
        for mounted in (mnt, mnt2):
            subprocess.run(["umount", "-l", str(mounted)], check=False)
        for proc in (bridge, server):
            if proc is not None:
                proc.kill()
                proc.communicate()
        listener.close()
