"""Volumes mounted in real guests: what a guest writes is the volume's at once, forks share
the volume (they do not get a copy of it at their checkpoint), a rollback does not undo it,
checkpoints work with it mounted, the guest cannot reach past it, and E2B's
``volume_mounts`` with the real ``e2b`` SDK."""

from __future__ import annotations

import hashlib
import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from cli_run import FORKPOINT, cli, remove_sessions
from e2b_gateway import Gateway, running_gateway

pytestmark = pytest.mark.vm


def _json(*args: str) -> dict[str, object]:
    value: dict[str, object] = json.loads(cli(*args).stdout)
    return value


def _guest(session: str, script: str, code: int = 0) -> str:
    return cli("exec", session, "--", "sh", "-c", script, code=code).stdout.decode()


@pytest.fixture
def volume() -> Iterator[str]:
    name = f"vol-{uuid.uuid4().hex[:8]}"
    cli("volume", "create", name)
    yield name
    subprocess.run([*FORKPOINT, "volume", "rm", name], capture_output=True, timeout=60)


def test_a_volume_is_shared_by_forks_and_kept_by_rollbacks(volume: str) -> None:
    cli("volume", "mkdir", volume, "in")
    cli("volume", "put", volume, "in/from-host.txt", "/etc/hostname")
    assert b"needs it" in cli("create", "--volume", f"{volume}:/proc/x", code=2).stderr
    session = str(_json("create", "--json", "--volume", f"{volume}:/mnt/data")["id"])
    sessions = [session]
    try:
        listed = _guest(session, "ls /mnt/data/in; mount | grep /mnt/data")
        assert "from-host.txt" in listed and "fuse" in listed
        # Any guest user may write it (the volume's own user writes on the host).
        _guest(session, "echo one > /mnt/data/one.txt; su -s /bin/sh nobody -c "
                        "'echo nobody > /mnt/data/nobody.txt'")  # fmt: skip
        assert cli("volume", "get", volume, "nobody.txt").stdout == b"nobody\n"
        # Two writers at once share the VM's one volumes port: their requests never mix.
        sums = _guest(session, "cd /mnt/data && for f in a b; do head -c 3000000 /dev/urandom "
                               "> $f & done; wait; sha256sum a b")  # fmt: skip
        for line in sums.splitlines():
            digest, name = line.split()
            data = cli("volume", "get", volume, name).stdout
            assert hashlib.sha256(data).hexdigest() == digest and len(data) == 3_000_000

        checkpoint = str(_json("checkpoint", session, "--json")["id"])
        _guest(session, "echo after > /mnt/data/after.txt")
        fork = str(json.loads(cli("fork", checkpoint, "--json").stdout)[0]["id"])
        sessions.append(fork)
        # The fork sees the volume as it is now, not as it was at the checkpoint.
        assert _guest(fork, "cat /mnt/data/after.txt") == "after\n"
        _guest(fork, "echo from-fork > /mnt/data/fork.txt")
        assert _guest(session, "cat /mnt/data/fork.txt") == "from-fork\n"

        # A rollback restores the guest, not the volume.
        cli("rollback", session, checkpoint)
        assert sorted(_guest(session, "ls /mnt/data").split()) == [
            "a", "after.txt", "b", "fork.txt", "in", "nobody.txt", "one.txt",
        ]  # fmt: skip
        _guest(session, "rm /mnt/data/one.txt; mv /mnt/data/after.txt /mnt/data/in/moved.txt")
        files = json.loads(cli("volume", "files", volume, "--json", "--depth", "2").stdout)
        assert "/in/moved.txt" in {f["path"] for f in files}
        assert "/one.txt" not in {f["path"] for f in files}

        # A link the guest plants is the guest's to follow: the host never does.
        _guest(session, "ln -s / /mnt/data/root")
        assert b"not a directory" in cli("volume", "get", volume, "root/etc/passwd", code=4).stderr
        assert b"mounted by" in cli("volume", "rm", volume, code=4).stderr
    finally:
        remove_sessions(*sessions)
    cli("volume", "rm", volume)


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with running_gateway("--e2b-timeout", "600") as gw:
        yield gw


def test_e2b_volume_mounts(gateway: Gateway) -> None:
    from e2b import Sandbox
    from e2b import Volume as E2BVolume

    volume = E2BVolume.create(f"e2b-{uuid.uuid4().hex[:8]}")
    try:
        volume.write_file("readme.txt", "written through the volume API")
        sandbox = Sandbox.create(timeout=600, volume_mounts={"/mnt/vol": volume})
        try:
            run = sandbox.commands.run("cat /mnt/vol/readme.txt && echo guest > /mnt/vol/g.txt")
            assert run.stdout == "written through the volume API"
            assert volume.read_file("g.txt") == "guest\n"
            assert sandbox.files.read("/mnt/vol/g.txt") == "guest\n"
        finally:
            Sandbox.kill(sandbox.sandbox_id)
    finally:
        E2BVolume.destroy(volume.volume_id)
