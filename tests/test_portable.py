"""Portable checkpoints without a VM: RAM page diffs, the object stores, manifests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from forkpoint.errors import DamagedCheckpoint, NotConfigured, NotFound
from forkpoint.runtime.checkpoints.portable.bundle import (
    Blob,
    LayerBlob,
    PortableManifest,
    RamPack,
    parse_ref,
)
from forkpoint.runtime.checkpoints.portable.objects import S3Store, TarReader, TarWriter
from forkpoint.runtime.checkpoints.portable.ramdiff import PAGE, apply_pack, write_pack
from forkpoint.vm.ramfile import allocated_bytes
from s3_server import S3Server, s3_server

MIB = 1 << 20


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


def _sparse(path: Path, size: int, pages: dict[int, bytes]) -> None:
    with path.open("wb") as f:
        f.truncate(size)
        for index, data in pages.items():
            f.seek(index * PAGE)
            f.write(data.ljust(PAGE, b"\0"))


def test_a_child_pack_holds_only_the_pages_that_differ_and_rebuilds_it_sparse(
    tmp_path: Path,
) -> None:
    size = 64 * MIB
    parent_pages = {i: os.urandom(PAGE) for i in range(0, 4096, 3)}  # 5.3 MiB scattered
    child_pages = dict(parent_pages)
    child_pages.update({i: os.urandom(PAGE) for i in (5, 6, 7, 9000, 16000)})
    child_pages[3] = bytes(PAGE)  # a page the child zeroed
    _sparse(tmp_path / "parent", size, parent_pages)
    _sparse(tmp_path / "child", size, child_pages)

    stats = write_pack(tmp_path / "child", tmp_path / "parent", tmp_path / "pack")
    assert stats.pages == 6
    assert stats.stored_bytes < 8 * PAGE
    apply_pack(tmp_path / "pack", tmp_path / "parent", size, tmp_path / "rebuilt")
    assert (tmp_path / "rebuilt").read_bytes() == (tmp_path / "child").read_bytes()
    assert allocated_bytes(tmp_path / "rebuilt") < 8 * MIB  # holes stayed holes

    full = write_pack(tmp_path / "child", None, tmp_path / "full")
    assert full.pages == len(child_pages) - 1  # the zero page is a hole's equal
    apply_pack(tmp_path / "full", None, size, tmp_path / "rebuilt2")
    assert (tmp_path / "rebuilt2").read_bytes() == (tmp_path / "child").read_bytes()
    assert allocated_bytes(tmp_path / "rebuilt2") < 8 * MIB


def test_s3_objects_are_written_once_and_read_back(s3: S3Server, tmp_path: Path) -> None:
    store = S3Store(s3.url("unit"))
    (tmp_path / "blob").write_bytes(b"x" * 1000)
    assert not store.has("blobs/a")
    store.put_file("blobs/a", tmp_path / "blob")
    store.put_file("blobs/a", tmp_path / "blob")  # again: skipped, not sent
    store.put_bytes("blobs/b", b"first")
    store.put_bytes("blobs/b", b"second")  # If-None-Match: the server keeps the first
    assert store.counter.sent_objects == 2
    assert store.counter.sent_bytes == 1005
    assert store.counter.skipped_objects == 2
    assert store.get_bytes("blobs/b") == b"first"
    store.get_file("blobs/a", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == b"x" * 1000
    with pytest.raises(NotFound):
        store.get_bytes("blobs/none")
    assert s3.objects("unit") == {"blobs/a": 1000, "blobs/b": 5}


def test_s3_multipart_upload(s3: S3Server, tmp_path: Path) -> None:
    from forkpoint.runtime.checkpoints.portable import objects

    data = os.urandom(11 * MIB + 5)  # parts of 5 MiB: the least S3 takes (but the last)
    (tmp_path / "big").write_bytes(data)
    store = S3Store(s3.url("multi"))
    old = objects._MULTIPART, objects._PART
    objects._MULTIPART, objects._PART = 6 * MIB, 5 * MIB
    try:
        store.put_file("blobs/big", tmp_path / "big")
    finally:
        objects._MULTIPART, objects._PART = old
    assert store.get_bytes("blobs/big") == data


def _manifest(**changes: Any) -> PortableManifest:
    base = PortableManifest(
        checkpoint={"id": "c-0123456789", "format": 1, "disk_layer": "top.qcow2"}, parent=None,
        ram=RamPack(digest="0" * 64, bytes=1, size=PAGE, page_size=PAGE, pages=0),
        state=Blob(digest="1" * 64, bytes=1),
        layers=(
            LayerBlob(digest="2" * 64, bytes=1, name="top.qcow2", backing="base.qcow2"),
            LayerBlob(digest="3" * 64, bytes=1, name="base.qcow2", backing=None),
        ),
        image_name="default", image_hash="db7bcc036862b960",
    )  # fmt: skip
    return replace(base, **changes)


def test_a_manifest_is_verified_against_its_digest() -> None:
    manifest = _manifest()
    data = manifest.encode()
    assert PortableManifest.decode(data, manifest.digest) == manifest
    tampered = data.replace(b"default", b"defauls")
    with pytest.raises(DamagedCheckpoint, match="corrupt"):
        PortableManifest.decode(tampered, manifest.digest)
    assert parse_ref(f"sha256:{manifest.digest}") == (manifest.digest, "")
    assert parse_ref("my-checkpoint") == (None, "my-checkpoint")


@pytest.mark.parametrize(
    "changes",
    [
        {"state": Blob(digest="../../../etc/cron.d/x", bytes=1)},  # blobs become file names
        {"parent": "../../x"},
        {"checkpoint": {"id": "../c-0123456789", "format": 1, "disk_layer": "top.qcow2"}},
        {"image_hash": "../../x"},
        {
            "checkpoint": {"id": "c-0123456789", "format": 1, "disk_layer": "../top"},
            "layers": (LayerBlob(digest="2" * 64, bytes=1, name="../top", backing=None),),
        },
        {"layers": (LayerBlob(digest="2" * 64, bytes=1, name="top.qcow2", backing="x"),)},
    ],
)
def test_a_manifest_naming_files_outside_the_home_is_refused(changes: dict[str, Any]) -> None:
    manifest = _manifest(**changes)
    with pytest.raises(DamagedCheckpoint, match="malformed"):
        PortableManifest.decode(manifest.encode(), manifest.digest)


def test_an_archive_holds_the_objects_written(tmp_path: Path) -> None:
    (tmp_path / "blob").write_bytes(b"y" * 300)
    writer = TarWriter(tmp_path / "a.tar")
    writer.put_file("blobs/y", tmp_path / "blob")
    writer.put_file("blobs/y", tmp_path / "blob")
    writer.put_bytes("refs/x", b"sha256:abc\n")
    writer.close()
    reader = TarReader(tmp_path / "a.tar")
    assert reader.has("blobs/y") and not reader.has("blobs/z")
    assert reader.get_bytes("refs/x") == b"sha256:abc\n"
    reader.get_file("blobs/y", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"y" * 300
    reader.close()


def test_a_host_without_s3_credentials_is_not_configured(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A valid push or pull on a host with no credentials: 409 not_configured, not a 400
    (the API fuzzer saw push and pull requests valid by the schema refused as invalid)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it keeps the credentials it found
    with pytest.raises(NotConfigured, match="no S3 credentials") as refused:
        S3Store(s3.url("unit")).has("blobs/a")
    assert refused.value.http_status == 409 and refused.value.code == "not_configured"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["import", "/nonexistent/ck.fpk"], "no archive file"),
        (["export", "c-0123456789"], "needs -o"),
        (["push", "c-0123456789", "--to", "http://x"], "not an S3 URL"),
        (["pull", "ref"], "needs --from"),
        (["pull", "ref", "--from", "s3://b/p", "-o", "f"], "-o does not apply"),
        (["export", "c-0123456789", "-o", "/tmp/x.fpk"], "unknown checkpoint"),
    ],
)
def test_cli_refuses_bad_transfers_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", "checkpoint", *args],
        env={**os.environ, "FORKPOINT_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode in (2, 3), proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_host_facts_match_exactly_but_a_tsc_reading_within_a_tenth_of_a_percent() -> None:
    from forkpoint.runtime.checkpoints.portable.pull import _same_fact

    assert _same_fact("tsc_khz", 2445434, 2445434)
    assert _same_fact("tsc_khz", 2445434, 2447000)  # 0.06 %: the same host, read again
    assert not _same_fact("tsc_khz", 2445434, 2500000)
    assert not _same_fact("tsc_khz", None, 2445434)  # unknown: refused
    assert not _same_fact("cpu_model", "Intel A", "Intel B")
