"""Pixel diff of two same-sized images: how many pixels differ, and where.

A pixel differs when any channel (R, G, B, A; 0–255) differs by more than ``threshold``.
Regions are the 8-connected components of differing pixels; their bounding boxes are then
merged while any two overlap or touch, so the result is a short list of disjoint,
non-adjacent boxes ``[x, y, width, height]`` in pixels, sorted top-to-bottom, left-to-right.

Labelling works on horizontal runs of differing pixels (found by a C-speed regex per row)
joined with union-find, so its cost grows with the number of runs, not of pixels: a fully
different 1280×800 image is 800 runs.
"""

from __future__ import annotations

import dataclasses
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from PIL import Image, ImageChops, ImageDraw, UnidentifiedImageError

from forkpoint.browser._files import save_png
from forkpoint.errors import InvalidInput

__all__ = ["Box", "DiffResult", "diff_images", "diff_pngs", "find_boxes"]

#: ``(x, y, width, height)`` in pixels; x, y is the top-left pixel.
Box = tuple[int, int, int, int]

_RUN = re.compile(rb"\xff+")
_FADE = 0.3  # opacity of A's grayscale copy over white in the diff image
_RED = (255, 0, 0)
_OUTLINE = (200, 0, 160)


@dataclass(frozen=True)
class DiffResult:
    """Outcome of :func:`diff_images`. ``out`` is the diff image, if one was written."""

    differing_pixels: int
    total_pixels: int
    boxes: tuple[Box, ...]
    out: Path | None = None

    @property
    def identical(self) -> bool:
        return self.differing_pixels == 0

    @property
    def fraction(self) -> float:
        """Share of differing pixels, 0.0–1.0."""
        return self.differing_pixels / self.total_pixels if self.total_pixels else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract: ``differing_pixels, total_pixels, boxes`` (boxes as lists)."""
        return {
            "differing_pixels": self.differing_pixels,
            "total_pixels": self.total_pixels,
            "boxes": [list(box) for box in self.boxes],
        }


def diff_images(a: Path, b: Path, out: Path | None = None, threshold: int = 0) -> DiffResult:
    """Compare images ``a`` and ``b`` pixel by pixel; optionally write a diff PNG to ``out``.

    ``threshold`` (0–255) is the largest per-channel difference still counted as equal.
    The diff image is A in faded grayscale with differing pixels red and each box outlined.
    Raises InvalidInput if a file is missing or not an image, or the sizes differ.
    """
    image_a, mask, result = _compare(a, b, (str(a), str(b)), threshold)
    if out is None:
        return result
    save_png(_render(image_a, mask, result.boxes), out)
    return dataclasses.replace(result, out=out)


def diff_pngs(a: bytes, b: bytes, threshold: int = 0) -> tuple[DiffResult, bytes]:
    """:func:`diff_images` of two PNGs held in memory, with the diff image as PNG bytes."""
    names = ("the first image", "the second image")
    image_a, mask, result = _compare(io.BytesIO(a), io.BytesIO(b), names, threshold)
    buffer = io.BytesIO()
    _render(image_a, mask, result.boxes).save(buffer, format="PNG")
    return result, buffer.getvalue()


def _compare(
    a: Path | IO[bytes], b: Path | IO[bytes], names: tuple[str, str], threshold: int
) -> tuple[Image.Image, Image.Image, DiffResult]:
    """A as an image, the mask of differing pixels, and the result (without ``out``)."""
    if not 0 <= threshold <= 255:
        raise InvalidInput(f"threshold must be 0..255, got {threshold}")
    image_a, image_b = _load(a, names[0]), _load(b, names[1])
    if image_a.size != image_b.size:
        raise InvalidInput(
            f"image sizes differ: {names[0]} is {_size(image_a)}, {names[1]} is {_size(image_b)}"
        )
    mask = _difference_mask(image_a, image_b, threshold)
    differing = mask.histogram()[255]
    boxes = find_boxes(mask) if differing else ()
    width, height = image_a.size
    return image_a, mask, DiffResult(differing, width * height, boxes)


def find_boxes(mask: Image.Image) -> tuple[Box, ...]:
    """Merged bounding boxes of the 8-connected regions of non-zero pixels in ``mask``.

    ``mask`` is a mode ``L`` or ``1`` image. Boxes that overlap or touch (also diagonally)
    are merged until none do; sorted by (y, x, width, height).
    """
    binary = mask.convert("L").point(lambda v: 255 if v else 0)
    boxes = _component_boxes(binary)
    while True:
        # Merge by painting the boxes filled and labelling again: touching or overlapping
        # boxes become one component. Repeat, since a merged box may reach a third one.
        canvas = Image.new("L", binary.size, 0)
        draw = ImageDraw.Draw(canvas)
        for x, y, w, h in boxes:
            draw.rectangle((x, y, x + w - 1, y + h - 1), fill=255)
        merged = _component_boxes(canvas)
        if len(merged) == len(boxes):
            return tuple(sorted(merged, key=lambda box: (box[1], box[0], box[2], box[3])))
        boxes = merged


def _load(source: Path | IO[bytes], name: str) -> Image.Image:
    try:
        with Image.open(source) as image:
            image.load()
            return image.convert("RGBA")
    except FileNotFoundError:
        raise InvalidInput(f"no such image: {name}") from None
    except (UnidentifiedImageError, OSError) as error:
        raise InvalidInput(f"not a readable image: {name} ({error})") from None


def _size(image: Image.Image) -> str:
    return f"{image.width}x{image.height}"


def _difference_mask(a: Image.Image, b: Image.Image, threshold: int) -> Image.Image:
    """Mode ``L``: 255 where the largest channel difference exceeds ``threshold``, else 0."""
    bands = ImageChops.difference(a, b).split()
    largest = bands[0]
    for band in bands[1:]:
        largest = ImageChops.lighter(largest, band)
    return largest.point(lambda v: 255 if v > threshold else 0)


def _component_boxes(binary: Image.Image) -> list[Box]:
    """Bounding boxes of the 8-connected components of 255-pixels in mode-``L`` ``binary``."""
    bbox = binary.getbbox()
    if bbox is None:
        return []
    left, top, right, bottom = bbox
    crop = binary.crop(bbox)
    width = right - left
    data = crop.tobytes()

    parent: list[int] = []  # union-find over runs
    runs: list[tuple[int, int, int]] = []  # (y, start, end) with end exclusive

    def find(i: int) -> int:
        root = i
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:  # path compression
            parent[i], i = root, parent[i]
        return root

    previous: list[tuple[int, int, int]] = []  # (start, end, run index) of the row above
    for y in range(bottom - top):
        current: list[tuple[int, int, int]] = []
        for match in _RUN.finditer(data, y * width, (y + 1) * width):
            index = len(runs)
            start, end = match.start() - y * width, match.end() - y * width
            runs.append((y, start, end))
            parent.append(index)
            current.append((start, end, index))
        i = j = 0
        while i < len(previous) and j < len(current):
            p_start, p_end, p_index = previous[i]
            c_start, c_end, c_index = current[j]
            # 8-connected: the runs overlap or meet diagonally (ends are exclusive).
            if c_start <= p_end and p_start <= c_end:
                root_p, root_c = find(p_index), find(c_index)
                if root_p != root_c:
                    parent[max(root_p, root_c)] = min(root_p, root_c)
            if p_end < c_end:
                i += 1
            else:
                j += 1
        previous = current

    extents: dict[int, list[int]] = {}  # root -> [x0, y0, x1, y1], inclusive-exclusive
    for index, (y, start, end) in enumerate(runs):
        extent = extents.get(find(index))
        if extent is None:
            extents[find(index)] = [start, y, end, y + 1]
        else:
            extent[0] = min(extent[0], start)
            extent[2] = max(extent[2], end)
            extent[3] = y + 1  # runs come in row order
    return [(x0 + left, y0 + top, x1 - x0, y1 - y0) for x0, y0, x1, y1 in extents.values()]


def _render(a: Image.Image, mask: Image.Image, boxes: tuple[Box, ...]) -> Image.Image:
    white = Image.new("L", a.size, 255)
    faded = Image.blend(white, a.convert("L"), _FADE).convert("RGB")
    faded.paste(_RED, (0, 0, *a.size), mask)
    draw = ImageDraw.Draw(faded)
    for x, y, w, h in boxes:
        # Outline just outside the box so the red pixels on its edge stay visible.
        draw.rectangle((x - 2, y - 2, x + w + 1, y + h + 1), outline=_OUTLINE, width=2)
    return faded
