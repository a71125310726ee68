"""Empty disk layers: copies of a blank overlay are exactly what qemu-img writes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from forkpoint.vm.build import qemu_img
from forkpoint.vm.disk import blank_overlay_of, create_overlay, overlay_from_blank


def _info(path: Path) -> dict[str, object]:
    out = subprocess.run(
        [str(qemu_img()), "info", "--output=json", "-U", str(path)],
        capture_output=True, check=True, text=True,
    )  # fmt: skip
    info: dict[str, object] = json.loads(out.stdout)
    return info


def test_overlays_from_the_blank_match_qemu_img(tmp_path: Path) -> None:
    base = tmp_path / "base.qcow2"
    subprocess.run([str(qemu_img()), "create", "-q", "-f", "qcow2", str(base), "64M"], check=True)
    overlay_from_blank(base, tmp_path / "a.qcow2")
    assert blank_overlay_of(base).exists()
    overlay_from_blank(base, tmp_path / "b.qcow2")  # from the cached blank
    create_overlay(base, tmp_path / "direct.qcow2")
    direct = (tmp_path / "direct.qcow2").read_bytes()
    assert (tmp_path / "a.qcow2").read_bytes() == direct
    assert (tmp_path / "b.qcow2").read_bytes() == direct
    info = _info(tmp_path / "b.qcow2")
    assert info["backing-filename"] == str(base) and info["virtual-size"] == 64 << 20
    assert not list(tmp_path.glob(".*.tmp"))
