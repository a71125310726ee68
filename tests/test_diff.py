"""Pixel diff and overview on synthetic images with known differences (no browser)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from forkpoint.browser import compose_overview, diff_images, diff_pngs, find_boxes
from forkpoint.browser.diff import Box
from forkpoint.errors import InvalidInput

WHITE = (255, 255, 255)


def _save(image: Image.Image, path: Path) -> Path:
    image.save(path)
    return path


def _pair(tmp_path: Path, size: tuple[int, int] = (200, 100)) -> tuple[Image.Image, Image.Image]:
    a = Image.new("RGB", size, WHITE)
    ImageDraw.Draw(a).rectangle((0, 0, size[0] // 2, size[1] // 2), fill=(40, 90, 200))
    return a, a.copy()


def test_identical_images_have_no_difference(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    result = diff_images(_save(a, tmp_path / "a.png"), _save(b, tmp_path / "b.png"))
    assert result.differing_pixels == 0
    assert result.total_pixels == 200 * 100
    assert result.boxes == ()
    assert result.identical
    assert result.to_dict() == {"differing_pixels": 0, "total_pixels": 20000, "boxes": []}


def test_two_rectangles_give_exact_count_and_boxes(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    draw = ImageDraw.Draw(b)
    draw.rectangle((100, 50, 104, 54), fill=(255, 0, 0))  # 5x5, on the white part
    draw.rectangle((10, 10, 29, 19), fill=(0, 0, 0))  # 20x10, on the blue part
    result = diff_images(_save(a, tmp_path / "a.png"), _save(b, tmp_path / "b.png"))
    assert result.differing_pixels == 20 * 10 + 5 * 5
    assert result.boxes == ((10, 10, 20, 10), (100, 50, 5, 5))
    assert result.to_dict()["boxes"] == [[10, 10, 20, 10], [100, 50, 5, 5]]


def test_single_pixel(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    b.putpixel((199, 99), (254, 255, 255))
    result = diff_images(_save(a, tmp_path / "a.png"), _save(b, tmp_path / "b.png"))
    assert result.differing_pixels == 1
    assert result.boxes == ((199, 99, 1, 1),)


def test_threshold_ignores_small_channel_differences(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    ImageDraw.Draw(b).rectangle((150, 80, 159, 89), fill=(252, 255, 255))
    pa, pb = _save(a, tmp_path / "a.png"), _save(b, tmp_path / "b.png")
    assert diff_images(pa, pb, threshold=3).differing_pixels == 0
    assert diff_images(pa, pb, threshold=2).differing_pixels == 100


def test_diagonal_neighbours_are_one_region() -> None:
    mask = Image.new("L", (10, 10), 0)
    for xy in ((2, 2), (3, 3), (4, 4)):
        mask.putpixel(xy, 255)
    assert find_boxes(mask) == ((2, 2, 3, 3),)


def test_overlapping_and_touching_boxes_merge() -> None:
    mask = Image.new("L", (40, 20), 0)
    draw = ImageDraw.Draw(mask)
    draw.line((0, 0, 9, 0), fill=255)  # an L shape: its box is (0, 0, 10, 10) ...
    draw.line((0, 0, 0, 9), fill=255)
    mask.putpixel((5, 5), 255)  # ... containing a pixel it does not touch
    draw.rectangle((10, 10, 14, 14), fill=255)  # diagonal neighbour of that box's corner
    draw.rectangle((30, 0, 35, 5), fill=255)  # far away: stays separate
    assert find_boxes(mask) == ((0, 0, 15, 15), (30, 0, 6, 6))


def test_size_mismatch_is_one_clear_line(tmp_path: Path) -> None:
    a = _save(Image.new("RGB", (100, 50), WHITE), tmp_path / "a.png")
    b = _save(Image.new("RGB", (100, 60), WHITE), tmp_path / "b.png")
    with pytest.raises(InvalidInput) as info:
        diff_images(a, b)
    assert "100x50" in info.value.message and "100x60" in info.value.message
    assert "\n" not in info.value.message


def test_missing_or_broken_file_is_invalid_input(tmp_path: Path) -> None:
    a = _save(Image.new("RGB", (10, 10), WHITE), tmp_path / "a.png")
    with pytest.raises(InvalidInput, match="no such image"):
        diff_images(a, tmp_path / "missing.png")
    (tmp_path / "junk.png").write_bytes(b"not a png")
    with pytest.raises(InvalidInput, match="not a readable image"):
        diff_images(a, tmp_path / "junk.png")


def test_diff_image_has_a_size_and_marks_differences(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    ImageDraw.Draw(b).rectangle((150, 60, 169, 79), fill=(0, 200, 0))
    out = tmp_path / "sub" / "diff.png"
    result = diff_images(_save(a, tmp_path / "a.png"), _save(b, tmp_path / "b.png"), out=out)
    assert result.out == out
    with Image.open(out) as diff:
        assert diff.size == a.size
        rgb = diff.convert("RGB")
    assert rgb.getpixel((160, 70)) == (255, 0, 0)  # differing: red
    faded = rgb.getpixel((10, 10))  # unchanged blue, faded grey over white
    assert isinstance(faded, tuple) and faded[0] == faded[1] == faded[2] and faded[0] > 150
    assert rgb.getpixel((148, 70)) != rgb.getpixel((120, 90))  # the outline left of the box


def test_pngs_in_memory_diff_as_their_files_do(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    ImageDraw.Draw(b).rectangle((150, 60, 169, 79), fill=(0, 200, 0))
    pa, pb = _save(a, tmp_path / "a.png"), _save(b, tmp_path / "b.png")
    on_disk = diff_images(pa, pb, out=tmp_path / "d.png")
    in_memory, overlay = diff_pngs(pa.read_bytes(), pb.read_bytes())
    assert in_memory.to_dict() == on_disk.to_dict() and in_memory.out is None
    assert overlay == (tmp_path / "d.png").read_bytes()
    with pytest.raises(InvalidInput, match="not a readable image: the second image"):
        diff_pngs(pa.read_bytes(), b"not a png")


def test_worst_case_1280x800_is_fast(tmp_path: Path) -> None:
    # A checkerboard is the most runs an image can have: one per differing pixel.
    width, height = 1280, 800
    rows = [bytes(((x + y) % 2) * 255 for x in range(width)) for y in range(2)]
    board = Image.frombytes("L", (width, height), (rows[0] + rows[1]) * (height // 2))
    a = _save(Image.new("RGB", (width, height), (0, 0, 0)), tmp_path / "a.png")
    b = _save(board.convert("RGB"), tmp_path / "b.png")
    started = time.monotonic()
    result = diff_images(a, b, out=tmp_path / "d.png")
    assert time.monotonic() - started < 10
    assert result.boxes == ((0, 0, width, height),)
    assert result.differing_pixels == width * height // 2


def _reference_boxes(pixels: set[tuple[int, int]]) -> list[Box]:
    """Plain BFS + pairwise box merging, to check the run-based implementation."""
    seen: set[tuple[int, int]] = set()
    boxes: list[list[int]] = []  # x0, y0, x1, y1 inclusive
    for start in sorted(pixels):
        if start in seen:
            continue
        seen.add(start)
        queue = deque([start])
        x0, y0, x1, y1 = start[0], start[1], start[0], start[1]
        while queue:
            x, y = queue.popleft()
            x0, y0, x1, y1 = min(x0, x), min(y0, y), max(x1, x), max(y1, y)
            for dx in (-1, 0, 1):
                for dy in (-1, 0, 1):
                    near = (x + dx, y + dy)
                    if near in pixels and near not in seen:
                        seen.add(near)
                        queue.append(near)
        boxes.append([x0, y0, x1, y1])
    merged = True
    while merged:
        merged = False
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                p, q = boxes[i], boxes[j]
                if p[0] <= q[2] + 1 and q[0] <= p[2] + 1 and p[1] <= q[3] + 1 and q[1] <= p[3] + 1:
                    boxes[i] = [min(p[0], q[0]), min(p[1], q[1]), max(p[2], q[2]), max(p[3], q[3])]
                    del boxes[j]
                    merged = True
                    break
            if merged:
                break
    result = [(b[0], b[1], b[2] - b[0] + 1, b[3] - b[1] + 1) for b in boxes]
    return sorted(result, key=lambda box: (box[1], box[0], box[2], box[3]))


@settings(max_examples=150, deadline=None)
@given(st.sets(st.tuples(st.integers(0, 23), st.integers(0, 15)), max_size=60))
def test_boxes_match_a_plain_bfs(pixels: set[tuple[int, int]]) -> None:
    mask = Image.new("L", (24, 16), 0)
    for xy in pixels:
        mask.putpixel(xy, 255)
    assert list(find_boxes(mask)) == _reference_boxes(pixels)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_diff_json(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    ImageDraw.Draw(b).rectangle((120, 70, 129, 74), fill=(0, 0, 0))
    pa, pb = _save(a, tmp_path / "a.png"), _save(b, tmp_path / "b.png")
    out = tmp_path / "d.png"
    done = _cli("diff", str(pa), str(pb), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "differing_pixels": 50,
        "total_pixels": 20000,
        "boxes": [[120, 70, 10, 5]],
    }
    assert out.is_file()

    human = _cli("diff", str(pa), str(pb))
    assert human.returncode == 0 and "50 of 20,000 pixels differ" in human.stdout


def test_cli_diff_size_mismatch_exits_2(tmp_path: Path) -> None:
    pa = _save(Image.new("RGB", (10, 10), WHITE), tmp_path / "a.png")
    pb = _save(Image.new("RGB", (10, 11), WHITE), tmp_path / "b.png")
    done = _cli("diff", str(pa), str(pb), "--json")
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["code"] == "invalid_input"
    assert "Traceback" not in done.stderr


def test_compose_overview_grid_with_captions(tmp_path: Path) -> None:
    items = []
    for index, colour in enumerate(((200, 30, 30), (30, 200, 30), (30, 30, 200))):
        path = _save(Image.new("RGB", (640, 400), colour), tmp_path / f"{index}.png")
        items.append((f"fork {index}\nsecond line that is far too long to fit in the cell", path))
    out = compose_overview(items, tmp_path / "overview.png", thumb_width=320)
    with Image.open(out) as sheet:
        assert sheet.width == 16 + 3 * (320 + 16)
        assert sheet.height > 16 + 200 + 16  # thumbnails plus captions
        rgb = sheet.convert("RGB")
    assert rgb.getpixel((16 + 160, 16 + 100)) == (200, 30, 30)
    assert rgb.getpixel((16 + 336 + 160, 16 + 100)) == (30, 200, 30)
    below = rgb.crop((16, 16 + 200 + 4, 16 + 320, rgb.height - 4))
    assert len(below.getcolors(maxcolors=4096) or []) > 2  # some caption text was drawn


def test_compose_overview_rejects_no_items(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        compose_overview([], tmp_path / "o.png")
