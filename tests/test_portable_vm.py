"""Portable checkpoints between two hosts on one machine: two ``$FORKPOINT_HOME``s (A is the
test home, B and C fresh ones sharing its image) and a real S3 server (localbucket) on
127.0.0.1. Push from A, pull into B, fork there; lineage deltas; a tampered object; an
incompatible manifest; a push killed half-way; the same round trip through an archive."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkpoint.config import Home
from forkpoint.errors import DamagedCheckpoint, IncompatibleCheckpoint
from forkpoint.models import Checkpoint, Session
from forkpoint.runtime import Runtime
from forkpoint.runtime.checkpoints.portable.bundle import PortableManifest
from forkpoint.runtime.checkpoints.portable.objects import S3Store
from forkpoint.runtime.checkpoints.portable.pull import Puller
from forkpoint.runtime.checkpoints.service import portable_home
from s3_server import S3Server, s3_server

pytestmark = pytest.mark.vm

MIB = 1 << 20

COUNTER = (
    'python3 -c "import os,time\n'
    "i=0\n"
    "while True:\n"
    "    i+=1\n"
    "    open('/tmp/count.tmp','w').write('%d %d' % (os.getpid(), i))\n"
    "    os.replace('/tmp/count.tmp','/tmp/count')\n"
    '    time.sleep(0.2)"'
)


def _home_beside(a: Runtime, root: Path) -> Runtime:
    """Another host: a fresh home that shares only the (immutable) image and caches."""
    root.mkdir()
    for shared in ("images", "cache"):
        (root / shared).symlink_to(a.home.root / shared)
    return Runtime.open(Home(root))


def _snapshot(rt: Runtime) -> tuple[list[str], list[str], list[str]]:
    """What a failed pull must not change: recorded checkpoints, their files, layers."""
    return (
        [c.id for c in rt.list_checkpoints()],
        sorted(p.name for p in rt.home.checkpoints.iterdir()),
        sorted(p.name for p in rt.home.layers.iterdir()),
    )


async def _counter(rt: Runtime, session: str) -> tuple[int, int]:
    deadline = time.monotonic() + 120
    while True:
        try:
            pid, count = (await rt.read_file(session, "/tmp/count")).decode().split()
            return int(pid), int(count)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="module")
def host_a() -> Iterator[Runtime]:
    runtime = Runtime.open()
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def host_b(host_a: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    runtime = _home_beside(host_a, tmp_path_factory.mktemp("hosts") / "b")
    yield runtime
    for session in runtime.list_sessions():
        asyncio.run(runtime.remove(session.id))
    runtime.close()


@pytest.fixture(scope="module")
def source(host_a: Runtime) -> Iterator[tuple[Session, Checkpoint, int]]:
    """A session on A running a counter, with a file; checkpointed. (session, ck, pid)"""

    async def setup() -> tuple[Session, Checkpoint, int]:
        session = await host_a.create()
        await host_a.write_file(session.id, "/data/hello.txt", b"made on host A\n")
        await host_a.spawn(session.id, COUNTER)
        pid, _ = await _counter(host_a, session.id)
        return session, await host_a.checkpoint(session.id), pid

    session, ck, pid = asyncio.run(setup())
    yield session, ck, pid
    leftovers = [c.id for c in host_a.list_checkpoints(session.id)]
    asyncio.run(host_a.remove(session.id))
    for checkpoint_id in reversed(leftovers):
        asyncio.run(host_a.remove_checkpoint(checkpoint_id))


def test_push_from_a_pull_into_b_and_fork_three_times(
    host_a: Runtime, host_b: Runtime, s3: S3Server, source: tuple[Session, Checkpoint, int]
) -> None:
    _, ck, pid = source
    url = s3.url("rt")

    async def scenario() -> None:
        pushed = await host_a.push_checkpoint(ck.id, url)
        print(f"\npush: {pushed.sent_bytes / MIB:.1f} MiB in {pushed.sent_objects} objects, "
              f"{pushed.duration_ms:.0f} ms")  # fmt: skip
        assert pushed.digest.startswith("sha256:") and pushed.sent_bytes > 0
        assert f"manifests/{pushed.digest.removeprefix('sha256:')}" in s3.objects("rt")

        pulled = await host_b.pull_checkpoint(ck.id, url)
        print(f"pull: {pulled.received_bytes / MIB:.1f} MiB, {pulled.duration_ms:.0f} ms")
        assert pulled.digest == pushed.digest and pulled.checkpoint.id == ck.id
        again = await host_b.pull_checkpoint(pushed.digest, url)  # already here: nothing moves
        assert again.received_objects == 0 and again.checkpoint.id == ck.id

        forks = await host_b.fork(ck.id, 3)
        try:
            for fork in forks:
                assert isinstance(fork, Session), fork
                fork_pid, _ = await _counter(host_b, fork.id)
                assert fork_pid == pid, "the process must be alive at the same PID"
                text = await host_b.read_file(fork.id, "/data/hello.txt")
                assert text == b"made on host A\n"
        finally:
            for fork in forks:
                if isinstance(fork, Session):
                    await host_b.remove(fork.id)

    asyncio.run(scenario())


def test_a_second_checkpoint_uploads_about_what_the_guest_wrote(
    host_a: Runtime, host_b: Runtime, s3: S3Server, source: tuple[Session, Checkpoint, int]
) -> None:
    session, _, _ = source
    url = s3.url("rt")

    async def scenario() -> None:
        await host_a.exec(session.id, ["sh", "-c", "head -c 4M /dev/urandom > /data/blob"])
        ck2 = await host_a.checkpoint(session.id, name="portable-second")
        written = host_a.checkpoint_files(ck2.id).manifest
        written_bytes = json.loads(written.read_text())["written_bytes"]
        before = s3.objects("rt")
        pushed = await host_a.push_checkpoint(ck2.id, url)
        after = s3.objects("rt")
        put = sum(size for key, size in after.items() if key not in before)
        template_pack = max(before.values())
        print(f"\nguest wrote {written_bytes / MIB:.1f} MiB; push PUT {put / MIB:.2f} MiB "
              f"({pushed.sent_bytes / MIB:.2f} MiB counted), the template's RAM pack is "
              f"{template_pack / MIB:.1f} MiB")  # fmt: skip
        assert put <= 2 * written_bytes + 1 * MIB
        assert put < template_pack
        assert abs(put - pushed.sent_bytes) < 64 << 10  # the refs, overwritten

    asyncio.run(scenario())


def test_a_tampered_object_fails_the_pull_and_changes_nothing(
    host_b: Runtime, s3: S3Server
) -> None:
    url = s3.url("rt")
    objects = S3Store(url)
    digest = objects.get_bytes("refs/portable-second").decode().strip().removeprefix("sha256:")
    manifest = PortableManifest.decode(objects.get_bytes(f"manifests/{digest}"), digest)
    stored = s3.data / s3.bucket / "rt" / manifest.ram.key
    original = stored.read_bytes()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01
    stored.write_bytes(bytes(flipped))
    before = _snapshot(host_b)
    try:
        with pytest.raises(DamagedCheckpoint, match="corrupt"):
            asyncio.run(host_b.pull_checkpoint("portable-second", url))
        assert _snapshot(host_b) == before
        assert not list((host_b.home.portable / "tmp").iterdir())
    finally:
        stored.write_bytes(original)
    pulled = asyncio.run(host_b.pull_checkpoint("portable-second", url))  # repaired: it works
    print(f"\nchild pull: {pulled.received_bytes / MIB:.2f} MiB in {pulled.duration_ms:.0f} ms")
    assert pulled.checkpoint.name == "portable-second"
    assert pulled.received_bytes < 8 * MIB  # only the delta: B has the template


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("machine", "qemu", "9.9.9 (another build)#0123456789abcdef"),
        ("host", "tsc_khz", 1234567),
        ("image", "hash", "0123456789abcdef"),  # an image this host does not have
    ],
)
def test_an_incompatible_checkpoint_is_refused_before_any_ram_is_downloaded(
    host_a: Runtime,
    host_b: Runtime,
    s3: S3Server,
    source: tuple[Session, Checkpoint, int],
    section: str,
    field: str,
    value: object,
) -> None:
    url = s3.url("rt")
    objects = S3Store(url)
    digest = objects.get_bytes(f"refs/{source[1].id}").decode().strip().removeprefix("sha256:")
    data = json.loads(objects.get_bytes(f"manifests/{digest}"))
    where = data["image"] if section == "image" else data["checkpoint"][section]
    where[field] = value
    data["checkpoint"]["id"] = "c-00000000ff"  # not the one B already has
    encoded = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    other = PortableManifest.decode(encoded, hashlib.sha256(encoded).hexdigest())
    objects.put_bytes(f"manifests/{other.digest}", encoded)

    before = _snapshot(host_b)
    reader = S3Store(url)
    named = "image" if section == "image" else field
    with pytest.raises(IncompatibleCheckpoint, match=named):
        Puller(portable_home(host_b.context), reader, lambda _: None).pull(other.digest)
    assert reader.counter.keys_received == [f"manifests/{other.digest}"]  # no RAM, nothing
    assert _snapshot(host_b) == before

    # The CLI says so with exit 4 and one line.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "forkpoint.cli.app",
            "checkpoint",
            "pull",
            other.digest,
            "--from",
            url,
        ],  # fmt: skip
        env={**os.environ, "FORKPOINT_HOME": str(host_b.home.root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 4, proc.stderr
    assert named in proc.stderr


def test_a_push_killed_half_way_completes_when_run_again(
    host_a: Runtime, host_b: Runtime, s3: S3Server, source: tuple[Session, Checkpoint, int]
) -> None:
    _, ck, _ = source
    url = s3.url("interrupted")
    command = [sys.executable, "-m", "forkpoint.cli.app", "checkpoint", "push", ck.id, "--to", url,
               "--json"]  # fmt: skip
    env = {**os.environ, "FORKPOINT_HOME": str(host_a.home.root)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(k.startswith("blobs/") for k in _objects(s3, "interrupted")):
        assert proc.poll() is None, "the push ended before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    scratch = host_a.home.portable / "tmp"
    left = [p for p in scratch.iterdir() if p.name.startswith(f"{proc.pid}-")]
    assert left, "the killed push's scratch directory"
    partial = _objects(s3, "interrupted")
    assert not any(k.startswith("manifests/") for k in partial), "killed after the end"

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["skipped_objects"] >= 1  # what the killed push had uploaded
    assert not any(p.exists() for p in left)  # the next push cleared the killed one's
    assert f"manifests/{result['digest'].removeprefix('sha256:')}" in _objects(s3, "interrupted")


def test_a_pull_killed_half_way_completes_when_run_again(
    host_a: Runtime, s3: S3Server, tmp_path: Path, source: tuple[Session, Checkpoint, int]
) -> None:
    _, ck, _ = source
    asyncio.run(host_a.push_checkpoint(ck.id, s3.url("pull-killed")))
    host_e = _home_beside(host_a, tmp_path / "e")
    host_e.close()
    command = [sys.executable, "-m", "forkpoint.cli.app", "checkpoint", "pull", ck.id,
               "--from", s3.url("pull-killed"), "--json"]  # fmt: skip
    env = {**os.environ, "FORKPOINT_HOME": str(host_e.home.root)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scratch = host_e.home.portable / "tmp"
    deadline = time.monotonic() + 120
    while not (scratch.is_dir() and any(p.iterdir() for p in scratch.iterdir())):
        assert proc.poll() is None, "the pull ended before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    runtime = Runtime.open(host_e.home)
    try:
        assert runtime.list_checkpoints() == []  # nothing half-made is visible

        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["checkpoint"]["id"] == ck.id
        assert runtime.get_checkpoint(ck.id).id == ck.id
    finally:
        runtime.close()


def _objects(s3: S3Server, prefix: str) -> dict[str, int]:
    try:
        return s3.objects(prefix)
    except FileNotFoundError:
        return {}


def test_the_same_round_trip_through_an_archive(
    host_a: Runtime, tmp_path: Path, source: tuple[Session, Checkpoint, int]
) -> None:
    _, ck, pid = source
    host_c = _home_beside(host_a, tmp_path / "c")

    async def scenario() -> None:
        archive = tmp_path / "ck.fpk"
        exported = await host_a.export_checkpoint(ck.id, archive)
        print(f"\nexport: {archive.stat().st_size / MIB:.1f} MiB in {exported.duration_ms:.0f} ms")
        imported = await host_c.import_checkpoint(archive)
        assert imported.digest == exported.digest and imported.checkpoint.id == ck.id
        forks = await host_c.fork(ck.id, 1)
        try:
            fork = forks[0]
            assert isinstance(fork, Session), fork
            assert (await _counter(host_c, fork.id))[0] == pid
            assert await host_c.read_file(fork.id, "/data/hello.txt") == b"made on host A\n"
        finally:
            for fork in forks:
                if isinstance(fork, Session):
                    await host_c.remove(fork.id)

    try:
        asyncio.run(scenario())
    finally:
        host_c.close()


def test_push_and_pull_through_the_sdk_and_mcp(
    host_a: Runtime, s3: S3Server, tmp_path: Path, source: tuple[Session, Checkpoint, int]
) -> None:
    """The SDK (over the REST app, embedded) pushes from A and pulls into a fresh home;
    the MCP tool refuses a digest that is not in the store, as a tool error."""
    from mcp.server.mcpserver.exceptions import ToolError

    from forkpoint.mcp import build_server
    from forkpoint.sdk import AsyncCheckpoint

    _, ck, _ = source
    url = s3.url("sdk")
    host_d = _home_beside(host_a, tmp_path / "d")

    async def scenario() -> None:
        async with await AsyncCheckpoint.get(ck.id, runtime=host_a) as mine:
            pushed = await mine.push(url)
        assert pushed.sent_bytes > 0 and pushed.checkpoint.id == ck.id
        async with await AsyncCheckpoint.pull(ck.id, url, runtime=host_d) as theirs:
            assert theirs.id == ck.id
        with pytest.raises(ToolError, match="not_found: not in the store"):
            await build_server(host_d).call_tool(
                "pull_checkpoint", {"ref": "sha256:" + "0" * 64, "from": url}
            )

    try:
        asyncio.run(scenario())
    finally:
        host_d.close()
