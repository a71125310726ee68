"""Screenshots of a URL with the system's (Debian) chromium, driven by Playwright.

We never download a browser: chromium is the binary on ``PATH`` (or ``$FORKPOINT_CHROMIUM``),
launched headless with the flags below. Animations keep running (a capture shows the page
as a person would see it); the capture waits for ``load`` and then, briefly, for the
network to go quiet.

One implementation, Playwright's sync API; :func:`screenshot_async` runs it in a worker
thread (the sync API refuses to run inside an asyncio loop).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import Browser as _PwBrowser
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Playwright, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from forkpoint.browser._files import write_atomically
from forkpoint.errors import InternalError, InvalidInput

__all__ = [
    "CHROMIUM_ARGS",
    "Browser",
    "ScreenshotResult",
    "find_chromium",
    "screenshot",
    "screenshot_async",
]

#: Flags for a headless chromium on a machine without internet: no sandbox (we may be
#: root in a container), no GPU, and no background traffic (update checks, sync, QUIC)
#: that would otherwise fill the log with refused connections.
CHROMIUM_ARGS: tuple[str, ...] = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)

_HINT = "install Debian's chromium: make setup"
_SCHEMES = frozenset({"http", "https", "file", "data", "about"})
_MAX_SIDE = 16384  # px; chromium's own limit for a capture
_NETWORK_IDLE_MAX_S = 5.0  # a page that keeps polling must not stall the capture


@dataclass(frozen=True)
class ScreenshotResult:
    """What a capture produced.

    ``width``/``height`` are the PNG's size in pixels (the viewport, or the whole page
    with ``full_page``); ``text`` is ``document.body.innerText`` (proof that the page
    really rendered); ``status`` is the main document's HTTP status (None for
    ``file:``/``data:`` URLs); ``duration_ms`` is wall time of the capture alone.
    """

    path: Path
    url: str
    width: int
    height: int
    title: str
    text: str
    status: int | None
    duration_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "url": self.url,
            "width": self.width,
            "height": self.height,
            "title": self.title,
            "text": self.text,
            "status": self.status,
            "duration_ms": round(self.duration_ms, 1),
        }


def find_chromium() -> Path:
    """The chromium binary: ``$FORKPOINT_CHROMIUM`` if set, else ``chromium`` on PATH.

    Raises InternalError (with a one-line setup hint) when there is none.
    """
    override = os.environ.get("FORKPOINT_CHROMIUM")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise InternalError(f"FORKPOINT_CHROMIUM={override} is not an executable file; {_HINT}")
        return path
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise InternalError(f"chromium not found on PATH; {_HINT}")


class Browser:
    """One headless chromium, reused for several captures (launching costs ≈ 1–2 s).

    Use as a context manager; every page gets a fresh context (no shared cookies/cache).
    Objects are bound to the thread that created them (Playwright's sync API).
    """

    def __init__(self, executable: Path | None = None) -> None:
        self._executable = executable or find_chromium()
        self._playwright: Playwright | None = None
        self._browser: _PwBrowser | None = None

    def __enter__(self) -> Browser:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> None:
        """Launch chromium. Raises InternalError if it does not start."""
        if self._browser is not None:
            return
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=str(self._executable),
                headless=True,
                args=list(CHROMIUM_ARGS),
            )
        except PlaywrightError as error:
            self.close()
            raise InternalError(
                f"chromium ({self._executable}) failed to start: {_first_line(error)}; {_HINT}"
            ) from None

    def close(self) -> None:
        """Stop chromium and the Playwright driver (idempotent)."""
        browser, self._browser = self._browser, None
        playwright, self._playwright = self._playwright, None
        try:
            if browser is not None:
                browser.close()
        finally:
            if playwright is not None:
                playwright.stop()

    def screenshot(
        self,
        url: str,
        out: Path,
        width: int = 1280,
        height: int = 800,
        full_page: bool = False,
        timeout_s: float = 30,
    ) -> ScreenshotResult:
        """Load ``url`` in a ``width``×``height`` px viewport and write a PNG to ``out``.

        ``timeout_s`` bounds loading the page (seconds). Raises InvalidInput for a bad
        URL/size or a page that does not load (unreachable, timed out).
        """
        _check_request(url, width, height, timeout_s)
        if self._browser is None:
            self.open()
        assert self._browser is not None
        started = time.monotonic()
        context = self._browser.new_context(
            viewport={"width": width, "height": height}, device_scale_factor=1
        )
        try:
            page = context.new_page()
            timeout_ms = timeout_s * 1000
            try:
                response = page.goto(url, wait_until="load", timeout=timeout_ms)
            except PlaywrightTimeout:
                raise InvalidInput(f"page did not load within {timeout_s:g} s: {url}") from None
            except PlaywrightError as error:
                raise InvalidInput(f"cannot load {url}: {_navigation_reason(error)}") from None
            remaining_s = timeout_s - (time.monotonic() - started)
            idle_s = min(_NETWORK_IDLE_MAX_S, remaining_s)
            if idle_s > 0:
                try:
                    page.wait_for_load_state("networkidle", timeout=idle_s * 1000)
                except PlaywrightTimeout:
                    pass  # still busy (polling, streaming): capture what is there
            png = page.screenshot(full_page=full_page, type="png", timeout=timeout_ms)
            title = page.title()
            text = page.evaluate("() => document.body ? document.body.innerText : ''")
        except PlaywrightError as error:
            raise InternalError(f"screenshot of {url} failed: {_first_line(error)}") from None
        finally:
            context.close()
        write_atomically(out, png)
        size = _png_size(png)
        return ScreenshotResult(
            path=out,
            url=url,
            width=size[0],
            height=size[1],
            title=title,
            text=str(text),
            status=response.status if response is not None else None,
            duration_ms=(time.monotonic() - started) * 1000,
        )


def screenshot(
    url: str,
    out: Path,
    width: int = 1280,
    height: int = 800,
    full_page: bool = False,
    timeout_s: float = 30,
) -> ScreenshotResult:
    """Capture ``url`` into the PNG ``out`` with a chromium launched for this call.

    Sizes in pixels, ``timeout_s`` in seconds (page load). Raises InvalidInput (bad URL or
    size, page unreachable or too slow) or InternalError (no chromium, it crashed).
    """
    _check_request(url, width, height, timeout_s)
    with Browser() as browser:
        return browser.screenshot(url, out, width, height, full_page, timeout_s)


async def screenshot_async(
    url: str,
    out: Path,
    width: int = 1280,
    height: int = 800,
    full_page: bool = False,
    timeout_s: float = 30,
) -> ScreenshotResult:
    """:func:`screenshot` for asyncio callers: the same capture, run in a worker thread."""
    return await asyncio.to_thread(screenshot, url, out, width, height, full_page, timeout_s)


def _check_request(url: str, width: int, height: int, timeout_s: float) -> None:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in _SCHEMES:
        raise InvalidInput(f"not a loadable URL (want http://, https:// or file://): {url}")
    for name, value in (("width", width), ("height", height)):
        if not 1 <= value <= _MAX_SIDE:
            raise InvalidInput(f"{name} must be 1..{_MAX_SIDE} px, got {value}")
    if timeout_s <= 0:
        raise InvalidInput(f"timeout must be positive, got {timeout_s:g} s")


def _png_size(png: bytes) -> tuple[int, int]:
    # The IHDR chunk is always first: width and height are big-endian at bytes 16..24.
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _navigation_reason(error: BaseException) -> str:
    # "Page.goto: net::ERR_CONNECTION_REFUSED at http://…" -> "net::ERR_CONNECTION_REFUSED"
    line = _first_line(error).removeprefix("Page.goto: ")
    return line.split(" at ", 1)[0]
