"""Check a bar chart read back from the guest: are the bars honest?

The page's first inline ``<svg>`` is parsed; every ``<rect>`` that is a bar (not a
background or a frame) is paired with the numeric ``<text>`` label nearest to its centre
line, and all bars must share one px-per-unit scale: ``|height - scale * value| <= 0.5``
for each bar, with ``scale`` fitted by least squares.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bar", "ChartCheck", "check_chart"]

TOLERANCE_PX = 0.5
_SVG = re.compile(r"<svg\b.*?</svg>", re.S | re.I)
_NUMBER = re.compile(r"^[^\d\-]*(-?\d[\d,]*(?:\.\d+)?)\s*[A-Za-z%]*$")
_TRANSLATE = re.compile(r"translate\(\s*(-?[\d.]+)(?:[\s,]+(-?[\d.]+))?\s*\)")
_ENTITIES = {"&nbsp;": " ", "&middot;": "·", "&times;": "×", "&ndash;": "–", "&mdash;": "—"}


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    height: float

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "value": self.value, "height": self.height}


@dataclass(frozen=True)
class ChartCheck:
    """``ok`` when there are ``expected_bars`` bars and all share one scale (px/unit)."""

    ok: bool
    bars: tuple[Bar, ...] = ()
    scale: float | None = None
    max_error_px: float | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "bars": [b.to_dict() for b in self.bars],
            "scale_px_per_unit": None if self.scale is None else round(self.scale, 4),
            "max_error_px": None if self.max_error_px is None else round(self.max_error_px, 3),
            "tolerance_px": TOLERANCE_PX,
            "problems": list(self.problems),
        }


@dataclass
class _Shape:
    x: float
    y: float
    width: float
    height: float
    text: str = ""


def check_chart(html: str, expected_bars: int = 7) -> ChartCheck:
    """Find the chart in ``html`` and check its bars (never raises for bad markup)."""
    match = _SVG.search(html)
    if not match:
        return ChartCheck(False, problems=("no <svg> element in the page",))
    source = match.group(0)
    for entity, char in _ENTITIES.items():
        source = source.replace(entity, char)
    try:
        root = ET.fromstring(source)
    except ET.ParseError as error:
        return ChartCheck(False, problems=(f"the <svg> does not parse: {error}",))
    svg_width = _number(root.get("width")) or _viewbox_width(root.get("viewBox"))
    rects: list[_Shape] = []
    texts: list[_Shape] = []
    _walk(root, 0.0, 0.0, rects, texts)
    bars = [r for r in rects if r.height > 0 and not (svg_width and r.width >= svg_width * 0.5)]
    labels = [(t, v) for t in texts if (v := _label_value(t.text)) is not None]
    if not bars:
        return ChartCheck(False, problems=("no bars (<rect>) in the chart",))
    paired: list[Bar] = []
    problems: list[str] = []
    for index, rect in enumerate(bars):
        centre = rect.x + rect.width / 2
        near = [(t, v) for t, v in labels if abs(t.x - centre) <= max(rect.width, 1.0)]
        if not near:
            problems.append(f"bar {index + 1} (x={rect.x:g}) has no value label")
            continue
        label, value = min(near, key=lambda tv: (abs(tv[0].x - centre), abs(tv[0].y - rect.y)))
        paired.append(Bar(label.text, value, rect.height))
    if len(bars) != expected_bars:
        problems.append(f"expected {expected_bars} bars, found {len(bars)}")
    if not paired or any(b.value <= 0 for b in paired):
        problems.append("bar values must be positive numbers")
        return ChartCheck(False, tuple(paired), problems=tuple(problems))
    scale = sum(b.height * b.value for b in paired) / sum(b.value * b.value for b in paired)
    errors = [abs(b.height - scale * b.value) for b in paired]
    worst = max(errors)
    if worst > TOLERANCE_PX:
        bad = paired[errors.index(worst)]
        problems.append(
            f"bar {bad.label!r} is {bad.height:g} px high, {scale * bad.value:.1f} px expected"
        )
    return ChartCheck(not problems, tuple(paired), scale, worst, tuple(problems))


def _walk(node: ET.Element, dx: float, dy: float, rects: list[_Shape], texts: list[_Shape]) -> None:
    match = _TRANSLATE.search(node.get("transform") or "")
    if match:
        dx += float(match.group(1))
        dy += float(match.group(2) or 0)
    tag = node.tag.rsplit("}", 1)[-1]
    if tag == "rect":
        rects.append(
            _Shape(
                dx + (_number(node.get("x")) or 0.0),
                dy + (_number(node.get("y")) or 0.0),
                _number(node.get("width")) or 0.0,
                _number(node.get("height")) or 0.0,
            )
        )
    elif tag == "text":
        text = "".join(node.itertext()).strip()
        texts.append(
            _Shape(dx + (_number(node.get("x")) or 0.0), dy + (_number(node.get("y")) or 0.0),
                   0.0, 0.0, text)
        )  # fmt: skip
        return
    for child in node:
        _walk(child, dx, dy, rects, texts)


def _label_value(text: str) -> float | None:
    match = _NUMBER.match(text)
    return float(match.group(1).replace(",", "")) if match else None


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    match = re.match(r"\s*(-?[\d.]+)", value)
    try:
        return float(match.group(1)) if match else None
    except ValueError:
        return None


def _viewbox_width(value: str | None) -> float | None:
    parts = (value or "").replace(",", " ").split()
    return _number(parts[2]) if len(parts) == 4 else None
