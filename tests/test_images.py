"""Fast tests of image building pieces: recipe hashing, cpio, initramfs, cache, CLI errors."""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from forkpoint.errors import InvalidInput, NotFound, UnknownPackage
from forkpoint.images import Recipe, get_image, list_images
from forkpoint.images.catalog import set_name
from forkpoint.images.cpio import CpioWriter
from forkpoint.images.initramfs import INIT_SCRIPT, MODULES, build_initramfs, find_busybox
from forkpoint.images.kernel import ExtractedKernel
from forkpoint.images.recipe import DEFAULT_PACKAGES, guest_files, parse_packages
from forkpoint.images.tmpdirs import build_dir, mounts_under, remove_stale

FORKPOINT = Path(sys.executable).with_name("forkpoint")


def _busybox() -> str:
    try:
        return str(find_busybox())
    except Exception:
        pytest.skip("busybox-static is not installed")


# --- recipe -----------------------------------------------------------------------------


def test_recipe_hash_is_stable() -> None:
    assert Recipe.create().hash() == Recipe.create().hash()
    assert Recipe().hash() == Recipe.create("default").hash()
    assert len(Recipe().hash()) == 16


def test_recipe_hash_changes_with_packages_and_name() -> None:
    base = Recipe.create()
    assert Recipe.create(packages="less").hash() != base.hash()
    assert Recipe.create(packages="less,git").hash() != Recipe.create(packages="less").hash()
    assert Recipe.create("other").hash() != base.hash()
    # Duplicates of defaults change nothing.
    assert Recipe.create(packages="python3").hash() == base.hash()


def test_recipe_defaults_and_round_trip() -> None:
    recipe = Recipe.create("dev", "less, git")
    assert recipe.packages == (*DEFAULT_PACKAGES, "less", "git")
    assert recipe.kernel_package == "linux-image-cloud-amd64"
    assert recipe.disk_size == 2 * 1024**3
    assert Recipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe


def test_guest_files_cover_package_init_protocol_and_guest() -> None:
    rels = [rel for rel, _ in guest_files()]
    assert "forkpoint/__init__.py" in rels
    assert "forkpoint/guest/init.sh" in rels
    assert "forkpoint/protocol/__init__.py" in rels
    assert all(rel.startswith(("forkpoint/protocol/", "forkpoint/guest/")) for rel in rels[1:])


@pytest.mark.parametrize("bad", ["Bad!", "-rf", "a b", "x"])
def test_bad_package_names_rejected(bad: str) -> None:
    with pytest.raises(UnknownPackage, match="unknown Debian package"):
        parse_packages(bad)


def test_bad_image_name_rejected() -> None:
    with pytest.raises(InvalidInput):
        Recipe.create("../etc")


# --- cpio and initramfs -----------------------------------------------------------------


def test_cpio_round_trip_with_busybox(tmp_path: Path) -> None:
    busybox = _busybox()
    buf = io.BytesIO()
    cpio = CpioWriter(buf)
    cpio.add_dir("bin")
    cpio.add_file("bin/hello", b"hi there\n", perm=0o755)
    cpio.add_file("odd", b"12345")  # length not a multiple of 4
    cpio.add_symlink("bin/link", "hello")
    cpio.close()
    archive = tmp_path / "a.cpio"
    archive.write_bytes(buf.getvalue())
    listing = subprocess.run(
        [busybox, "cpio", "-t", "-F", str(archive)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert listing == ["bin", "bin/hello", "odd", "bin/link"]
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(
        [busybox, "cpio", "-i", "-d", "-F", str(archive)], cwd=out, check=True, capture_output=True
    )
    assert (out / "bin" / "hello").read_bytes() == b"hi there\n"
    assert os.access(out / "bin" / "hello", os.X_OK)
    assert (out / "odd").read_bytes() == b"12345"
    assert os.readlink(out / "bin" / "link") == "hello"


def test_initramfs_packs_modules_decompressed(tmp_path: Path) -> None:
    busybox = _busybox()
    modules = tmp_path / "lib" / "modules" / "6.1.0-test"
    (modules / "kernel" / "drivers").mkdir(parents=True)
    for i, name in enumerate(MODULES):
        blob = f"module {name}".encode()
        if i % 2:  # some plain, some xz, as different suites ship them
            (modules / "kernel" / "drivers" / f"{name}.ko.xz").write_bytes(lzma.compress(blob))
        else:
            (modules / "kernel" / "drivers" / f"{name}.ko").write_bytes(blob)
    kernel = ExtractedKernel("6.1.0-test", tmp_path / "vmlinuz", modules)
    out = tmp_path / "initrd.img"
    assert build_initramfs(kernel, out) == list(MODULES)
    archive = tmp_path / "initrd.cpio"
    archive.write_bytes(gzip.decompress(out.read_bytes()))
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(
        [busybox, "cpio", "-i", "-d", "-F", str(archive)],
        cwd=root,
        check=False,
        capture_output=True,
    )
    assert (root / "lib" / "modules" / "virtio_net.ko").read_bytes() == b"module virtio_net"
    assert (root / "lib" / "modules" / "virtio.ko").read_bytes() == b"module virtio"
    init = (root / "init").read_text()
    assert "switch_root /newroot /sbin/forkpoint-init" in init
    assert " ".join(MODULES) in init
    assert os.readlink(root / "bin" / "switch_root") == "busybox"


def test_init_scripts_are_valid_posix_sh(tmp_path: Path) -> None:
    sh = shutil.which("dash") or "/bin/sh"
    script = tmp_path / "init"
    script.write_text(INIT_SCRIPT % {"modules": " ".join(MODULES)})
    subprocess.run([sh, "-n", str(script)], check=True)
    init_sh = dict(guest_files())["forkpoint/guest/init.sh"]
    subprocess.run([sh, "-n", str(init_sh)], check=True)
    text = init_sh.read_text()
    assert "FORKPOINT-READY" in text
    assert "forkpoint: root" in text


# --- catalog ----------------------------------------------------------------------------


def _fake_image(images: Path, recipe: Recipe, where: Path | None = None) -> Path:
    directory = where or images / recipe.hash()
    directory.mkdir(parents=True)
    files = {"vmlinuz": b"k", "initrd.img": b"ii", "rootfs.qcow2": b"rrr"}
    for name, data in files.items():
        (directory / name).write_bytes(data)
    manifest = {
        "name": recipe.name,
        "hash": recipe.hash(),
        "recipe": recipe.to_dict(),
        "kernel_version": "6.1.0-test",
        "suite": recipe.suite,
        "packages": list(recipe.packages),
        "files": {name: len(data) for name, data in files.items()},
        "created_at": datetime.now(UTC).isoformat(),
        "build_seconds": 1.0,
    }
    (directory / "image.json").write_text(json.dumps(manifest))
    return directory


def test_catalog_lists_and_looks_up(tmp_path: Path) -> None:
    images = tmp_path / "images"
    recipe = Recipe.create("dev", "less")
    _fake_image(images, recipe)
    set_name(images, "dev", recipe.hash())
    [image] = list_images(images)
    assert (image.name, image.hash, image.size_bytes) == ("dev", recipe.hash(), 6)
    assert get_image("dev", images) == image
    assert get_image(recipe.hash(), images) == image
    assert get_image(recipe.hash()[:6], images) == image
    assert image.to_dict()["packages"] == list(recipe.packages)
    with pytest.raises(NotFound, match="forkpoint image build"):
        get_image("default", images)


def test_stale_tmp_dir_is_ignored_and_cleaned(tmp_path: Path) -> None:
    images = tmp_path / "images"
    recipe = Recipe.create("half")
    # A complete-looking image left in a killed builder's temp dir (pid cannot exist).
    stale = _fake_image(images, recipe, where=build_dir(images, recipe.hash(), pid=2**22 + 1))
    set_name(images, "half", recipe.hash())  # even a name pointing at it finds nothing
    assert list_images(images) == []
    with pytest.raises(NotFound):
        get_image("half", images)
    assert mounts_under(stale) == []
    mine = build_dir(images, "live")  # a build in progress (this pid) is left alone
    mine.mkdir()
    assert remove_stale(images) == [stale]
    assert not stale.exists() and mine.exists()


def test_cli_ls_ignores_stale_tmp_dir(tmp_path: Path) -> None:
    _fake_image(tmp_path / "images", Recipe.create("half"), where=tmp_path / "images" / ".tmp-x-1")
    env = {**os.environ, "FORKPOINT_HOME": str(tmp_path)}
    proc = subprocess.run(
        [str(FORKPOINT), "image", "ls", "--json"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


# --- CLI errors -------------------------------------------------------------------------


def _has_apt() -> bool:
    return shutil.which("apt-cache") is not None


@pytest.mark.skipif(not _has_apt(), reason="needs apt-cache (a Debian host)")
def test_unknown_package_fails_fast_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "FORKPOINT_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [str(FORKPOINT), "image", "build", "x", "--packages", "less,nosuchpkg-forkpoint"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "nosuchpkg-forkpoint" in lines[0]
    assert "Traceback" not in proc.stderr
    images = tmp_path / "home" / "images"
    assert not images.exists() or list(images.iterdir()) == []


@pytest.mark.skipif(not _has_apt(), reason="needs apt-cache (a Debian host)")
def test_unknown_package_json_error(tmp_path: Path) -> None:
    env = {**os.environ, "FORKPOINT_HOME": str(tmp_path)}
    proc = subprocess.run(
        [str(FORKPOINT), "image", "build", "--packages", "nosuchpkg-forkpoint", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "unknown_package"
    assert "nosuchpkg-forkpoint" in error["message"]
