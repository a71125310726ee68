"""One PNG showing several screenshots side by side, each captioned underneath."""

from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont, UnidentifiedImageError

from forkpoint.browser._files import save_png
from forkpoint.errors import InvalidInput

__all__ = ["compose_overview"]

_Font = ImageFont.FreeTypeFont | ImageFont.ImageFont
_PAD = 16  # px around and between cells
_BACKGROUND = (255, 255, 255)
_BORDER = (190, 190, 190)
_TEXT = (30, 30, 30)
_MAX_COLUMNS = 4


def compose_overview(
    items: list[tuple[str, Path]],
    out: Path,
    thumb_width: int = 480,
    columns: int | None = None,
) -> Path:
    """Write to ``out`` a grid of the images in ``items`` (``(caption, path)``), in order.

    Each image is scaled to ``thumb_width`` px wide (aspect kept) with its caption below
    (``\\n`` starts a new line; a line too long for the cell is cut with "…").
    ``columns`` defaults to all items in one row, at most 4. Returns ``out``.
    Raises InvalidInput for no items, a bad size, or an unreadable image.
    """
    if not items:
        raise InvalidInput("an overview needs at least one image")
    if not 16 <= thumb_width <= 4096:
        raise InvalidInput(f"thumb_width must be 16..4096 px, got {thumb_width}")
    columns = columns or min(len(items), _MAX_COLUMNS)
    if columns < 1:
        raise InvalidInput(f"columns must be at least 1, got {columns}")
    rows = math.ceil(len(items) / columns)

    thumbs = [_thumbnail(path, thumb_width) for _, path in items]
    font = _font(max(12, thumb_width // 30))
    line_height = _line_height(font)
    captions = [_fit_lines(caption, font, thumb_width) for caption, _ in items]
    caption_height = max(len(lines) for lines in captions) * line_height
    thumb_height = max(thumb.height for thumb in thumbs)  # captions line up across a row
    cell_height = thumb_height + _PAD // 2 + caption_height

    sheet = Image.new(
        "RGB",
        (_PAD + columns * (thumb_width + _PAD), _PAD + rows * (cell_height + _PAD)),
        _BACKGROUND,
    )
    draw = ImageDraw.Draw(sheet)
    for index, (thumb, lines) in enumerate(zip(thumbs, captions, strict=True)):
        x = _PAD + (index % columns) * (thumb_width + _PAD)
        y = _PAD + (index // columns) * (cell_height + _PAD)
        sheet.paste(thumb, (x, y))
        draw.rectangle((x - 1, y - 1, x + thumb.width, y + thumb.height), outline=_BORDER)
        text_y = y + thumb_height + _PAD // 2
        for line in lines:
            draw.text((x, text_y), line, fill=_TEXT, font=font)
            text_y += line_height
    save_png(sheet, out)
    return out


def _thumbnail(path: Path, width: int) -> Image.Image:
    try:
        with Image.open(path) as source:
            image = source.convert("RGB")
    except FileNotFoundError:
        raise InvalidInput(f"no such image: {path}") from None
    except (UnidentifiedImageError, OSError) as error:
        raise InvalidInput(f"not a readable image: {path} ({error})") from None
    height = max(1, round(image.height * width / image.width))
    return image.resize((width, height), Image.Resampling.LANCZOS)


def _font(size: int) -> _Font:
    """DejaVu Sans (fonts-dejavu-core) if installed, else Pillow's built-in font."""
    try:
        # Pillow looks bare file names up in the system font directories.
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size)


def _line_height(font: _Font) -> int:
    # The bbox is relative to the drawing origin, so ``bottom`` already includes the
    # space above the glyphs.
    bottom = font.getbbox("Ag|")[3]
    return int(bottom) + 4


def _fit_lines(caption: str, font: _Font, width: int) -> list[str]:
    lines = caption.splitlines() or [""]
    return [_fit(line, font, width) for line in lines]


def _fit(line: str, font: _Font, width: int) -> str:
    if font.getlength(line) <= width:
        return line
    while line and font.getlength(line + "…") > width:
        line = line[:-1]
    return line + "…"
