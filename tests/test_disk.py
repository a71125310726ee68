"""Empty disk layers: copies of a blank overlay are exactly what qemu-img writes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from forkpoint.vm.build import qemu_img
from forkpoint.vm.disk import (
    blank_overlay_of,
    create_overlay,
    overlay_from_blank,
    overlay_on_top,
)


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


def test_an_overlay_on_a_top_layer_is_its_blank_renamed_and_matches_qemu_img(
    tmp_path: Path,
) -> None:
    base = tmp_path / "base0.qcow2"
    subprocess.run([str(qemu_img()), "create", "-q", "-f", "qcow2", str(base), "64M"], check=True)
    top = tmp_path / "top01.qcow2"  # as long as base0's name: the blank is reused
    overlay_from_blank(base, top)
    overlay_on_top(top, tmp_path / "next.qcow2")
    create_overlay(top, tmp_path / "direct.qcow2")
    assert (tmp_path / "next.qcow2").read_bytes() == (tmp_path / "direct.qcow2").read_bytes()

    # A name of another length, or a layer without a blank, goes through qemu-img.
    other = tmp_path / "another-top.qcow2"
    overlay_from_blank(base, other)
    overlay_on_top(other, tmp_path / "other-next.qcow2")
    assert _info(tmp_path / "other-next.qcow2")["backing-filename"] == str(other)
    overlay_on_top(base, tmp_path / "on-base.qcow2")
    assert _info(tmp_path / "on-base.qcow2")["backing-filename"] == str(base)
    assert not list(tmp_path.glob(".*.tmp"))
