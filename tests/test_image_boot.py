"""The default image boots under real QEMU (TCG) to FORKPOINT-READY; builds die cleanly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forkpoint.config import home
from forkpoint.errors import NotFound
from forkpoint.images import Image, Recipe, build_image, get_image
from forkpoint.images.tmpdirs import remove_stale

pytestmark = pytest.mark.vm

FORKPOINT = Path(sys.executable).with_name("forkpoint")
READY = "FORKPOINT-READY"


def _tsc_khz() -> int:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return int(float(line.split(":", 1)[1]) * 1000)
    raise AssertionError("no 'cpu MHz' in /proc/cpuinfo")


@pytest.fixture(scope="module")
def image() -> Image:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    return build_image(Recipe())  # returns at once when cached


def _wait_for(log: Path, marker: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if marker in text:
            return text
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    text = log.read_text(errors="replace") if log.exists() else "(no serial log)"
    raise AssertionError(f"no {marker!r} within {timeout:g} s; serial log:\n{text}")


def test_default_image_boots_to_ready(image: Image, tmp_path: Path) -> None:
    overlay = tmp_path / "overlay.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image.rootfs), "-F", "qcow2"]
        + [str(overlay)],
        check=True,
    )
    log = tmp_path / "serial.log"
    append = f"console=ttyS0 panic=-1 tsc_early_khz={_tsc_khz()} tsc=reliable"
    argv = [
        "qemu-system-x86_64",
        "-M", "microvm,accel=tcg,pit=on,pic=on,rtc=on",
        "-m", "512",
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-kernel", str(image.kernel),
        "-initrd", str(image.initrd),
        "-append", append,
        "-drive", f"id=d0,file={overlay},format=qcow2,if=none",
        "-device", "virtio-blk-device,drive=d0",
        "-serial", f"file:{log}",
    ]  # fmt: skip
    rootfs_before = image.rootfs.stat().st_mtime_ns
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        text = _wait_for(log, READY, proc, timeout=90)
        elapsed = time.monotonic() - started
        # Let the lines after the marker land too, then check what init reported.
        print(f"boot to {READY}: {elapsed:.2f} s (TCG)")
        head = text[: text.index(READY)]
        assert "forkpoint: root /dev/vda" in head, text
        assert "forkpoint: python3 Python 3." in head, text
        assert "forkpoint-initramfs: FATAL" not in text, text
    finally:
        proc.kill()
        out = proc.communicate(timeout=10)[0].decode(errors="replace")
        if proc.returncode not in (0, -signal.SIGKILL):
            print(f"qemu output:\n{out}")
    assert image.rootfs.stat().st_mtime_ns == rootfs_before  # the overlay took every write


def _build_cmd(home_dir: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "FORKPOINT_HOME": str(home_dir), "COLUMNS": "200"}
    return subprocess.Popen(
        [str(FORKPOINT), "image", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _seed_kernel_cache(home_dir: Path) -> None:
    # Reuse the main home's kernel .deb so the test does not download 27 MB again.
    cache = home_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for deb in home().cache.glob("linux-image-*.deb"):
        shutil.copyfile(deb, cache / deb.name)


def _ls(home_dir: Path) -> list[object]:
    proc = _build_cmd(home_dir, "ls", "--json")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert isinstance(result, list)
    return result


def _kill_during_rootfs(home_dir: Path, sig: int) -> str:
    """Start a build, send ``sig`` a few seconds into mmdebstrap; return its stderr."""
    proc = _build_cmd(home_dir, "build", "killtest", "--packages", "less")
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 120
    for line in proc.stderr:  # plain progress lines: stderr is not a terminal
        seen.append(line)
        if line.startswith("rootfs: I:") or time.monotonic() > deadline:
            break
    assert any(line.startswith("rootfs:") for line in seen), "".join(seen)
    time.sleep(3)
    assert proc.poll() is None, "build finished before it could be interrupted"
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode != 0
    return "".join(seen) + rest


def test_interrupted_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is not installed")
    fph = tmp_path / "home"
    _seed_kernel_cache(fph)

    # SIGTERM: the build cleans up after itself.
    err = _kill_during_rootfs(fph, signal.SIGTERM)
    images = fph / "images"
    assert [p.name for p in images.iterdir() if not p.name.startswith(".lock-")] == [], err
    assert _ls(fph) == []

    # SIGKILL: no cleanup runs, but the half build is never picked up ...
    _kill_during_rootfs(fph, signal.SIGKILL)
    assert _ls(fph) == []
    monkeypatch.setenv("FORKPOINT_HOME", str(fph))
    with pytest.raises(NotFound):
        get_image("killtest")
    # ... and mmdebstrap died with its parent (parent-death signal), no mounts were left.
    time.sleep(2)
    leftover = [p for p in images.iterdir() if p.name.startswith(".tmp-")]
    mounts = Path("/proc/self/mountinfo").read_text()
    assert all(str(p) not in mounts for p in leftover)
    assert sorted(remove_stale(images)) == sorted(leftover)
