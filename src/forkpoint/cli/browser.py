"""``forkpoint screenshot URL -o PNG`` and ``forkpoint diff A.png B.png [-o D.png]``.

``diff`` is registered by ``history.py``: it compares checkpoints and sessions, and calls
:func:`diff_command` here when both arguments are files on the host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from forkpoint.cli.output import JSON_OPTION, console, emit_json, reports_errors

__all__ = ["register"]

# forkpoint.browser is imported inside the commands: Playwright alone costs ≈ 0.2 s of
# start-up that every other command would pay.


def register(app: typer.Typer) -> None:
    app.command("screenshot")(screenshot_command)


@reports_errors
def screenshot_command(
    url: Annotated[str, typer.Argument(help="Page to capture (http://, https://, file://).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="PNG file to write.")],
    width: Annotated[int, typer.Option("--width", help="Viewport width, px.")] = 1280,
    height: Annotated[int, typer.Option("--height", help="Viewport height, px.")] = 800,
    full_page: Annotated[bool, typer.Option("--full-page", help="Capture the whole page.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Page load timeout, seconds.")] = 30,
    as_json: bool = JSON_OPTION,
) -> None:
    """Capture URL with headless chromium into a PNG."""
    from forkpoint.browser import screenshot

    result = screenshot(
        url, out, width=width, height=height, full_page=full_page, timeout_s=timeout
    )
    if as_json:
        emit_json(result.to_dict())
        return
    title = f" — {result.title}" if result.title else ""
    console.print(
        f"{result.path} ({result.width}x{result.height}){title} "
        f"in {result.duration_ms / 1000:.1f} s",
        markup=False,
        highlight=False,
    )


def diff_command(
    a: Annotated[Path, typer.Argument(help="First PNG.")],
    b: Annotated[Path, typer.Argument(help="Second PNG, same size.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write a diff image here.")
    ] = None,
    threshold: Annotated[
        int,
        typer.Option(help="Largest per-channel difference (0-255) still counted as equal."),
    ] = 0,
    as_json: bool = JSON_OPTION,
) -> None:
    """Count the pixels that differ between two images and box where they are."""
    from forkpoint.browser import diff_images

    result = diff_images(a, b, out=out, threshold=threshold)
    if as_json:
        emit_json(result.to_dict())
        return
    if result.identical:
        console.print(f"identical ({result.total_pixels:,} pixels)", highlight=False)
    else:
        regions = len(result.boxes)
        console.print(
            f"{result.differing_pixels:,} of {result.total_pixels:,} pixels differ "
            f"({result.fraction:.3%}) in {regions} region{'s' if regions != 1 else ''}",
            highlight=False,
        )
        for x, y, w, h in result.boxes[:10]:
            console.print(f"  x={x} y={y} {w}x{h}", highlight=False)
        if regions > 10:
            console.print(f"  … and {regions - 10} more", highlight=False)
    if result.out is not None:
        console.print(f"diff image: {result.out}", markup=False, highlight=False)
