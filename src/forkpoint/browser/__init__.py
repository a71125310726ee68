"""Look at web pages the way a person would, and compare what was seen.

- :func:`screenshot` / :func:`screenshot_async` / :class:`Browser`: capture a URL with the
  system's chromium (Debian's package; never a downloaded browser) via Playwright.
- :func:`diff_images` (files) / :func:`diff_pngs` (bytes): count differing pixels and box
  the regions where they are.
- :func:`compose_overview`: several captioned screenshots in one PNG.
"""

from __future__ import annotations

from forkpoint.browser.diff import Box, DiffResult, diff_images, diff_pngs, find_boxes
from forkpoint.browser.overview import compose_overview
from forkpoint.browser.screenshot import (
    CHROMIUM_ARGS,
    Browser,
    ScreenshotResult,
    find_chromium,
    screenshot,
    screenshot_async,
)

__all__ = [
    "CHROMIUM_ARGS",
    "Box",
    "Browser",
    "DiffResult",
    "ScreenshotResult",
    "compose_overview",
    "diff_images",
    "diff_pngs",
    "find_boxes",
    "find_chromium",
    "screenshot",
    "screenshot_async",
]
