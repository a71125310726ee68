"""Screenshots with the system chromium of pages served from a local http.server."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from forkpoint.browser import Browser, diff_images, find_chromium, screenshot, screenshot_async
from forkpoint.errors import ForkpointError, InternalError, InvalidInput

try:
    find_chromium()
except ForkpointError as error:  # pragma: no cover - depends on the machine
    pytest.skip(f"{error.message}", allow_module_level=True)

pytestmark = pytest.mark.timeout(30)

STATIC = """<!doctype html><html><head><title>forkpoint test page</title><style>
body { margin: 0; font: 24px sans-serif; background: #f4f1ea; }
header { background: #1d4e89; color: white; padding: 20px; }
.card { margin: 30px; padding: 20px; background: #ffd166; border: 4px solid #ef476f; }
</style></head><body>
<header>Hello from forkpoint</header>
<div class="card">The quick brown fox jumps over the lazy dog.</div>
</body></html>"""

# The dot's CSS animation is phased by the wall clock (negative delay set at load), so two
# captures taken at different moments see it in different places; nothing else moves.
TRACK = (100, 300, 300, 40)  # x, y, width, height in px
ANIMATED = f"""<!doctype html><html><head><title>animated</title><style>
body {{ margin: 0; font: 20px sans-serif; background: white; }}
p {{ margin: 20px; }}
#track {{ position: absolute; left: {TRACK[0]}px; top: {TRACK[1]}px; width: {TRACK[2]}px;
          height: {TRACK[3]}px; overflow: hidden; background: #eee; }}
#dot {{ width: 40px; height: 40px; border-radius: 20px; background: #e63946;
        animation: slide 10s linear infinite; }}
@keyframes slide {{ from {{ transform: translateX(0); }} to {{ transform: translateX(260px); }} }}
</style></head><body>
<p>Static text that must not change between captures.</p>
<div id="track"><div id="dot"></div></div>
<script>
document.getElementById("dot").style.animationDelay = -(Date.now() % 10000) + "ms";
</script>
</body></html>"""

TALL = """<!doctype html><html><body style="margin:0">
<div style="height:2000px;background:linear-gradient(#fff,#06d6a0)">tall page</div>
</body></html>"""

PAGES = {"/": STATIC, "/animated": ANIMATED, "/tall": TALL}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        page = PAGES.get(self.path)
        body = (page or "<h1>not here</h1>").encode()
        self.send_response(200 if page else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # keep the test output quiet


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """Base URL of a local server for PAGES, on an ephemeral 127.0.0.1 port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_screenshot_renders_the_page(site: str, tmp_path: Path) -> None:
    out = tmp_path / "shots" / "page.png"
    result = screenshot(f"{site}/", out, width=800, height=600)
    assert result.path == out and out.is_file()
    assert (result.width, result.height) == (800, 600)
    assert result.title == "forkpoint test page"
    assert "Hello from forkpoint" in result.text
    assert "quick brown fox" in result.text
    assert result.status == 200
    with Image.open(out) as image:
        assert image.size == (800, 600)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 10  # not a blank page


def test_full_page_captures_beyond_the_viewport(site: str, tmp_path: Path) -> None:
    result = screenshot(
        f"{site}/tall", tmp_path / "tall.png", width=640, height=480, full_page=True
    )
    assert (result.width, result.height) == (640, 2000)
    assert "tall page" in result.text


def test_only_the_animated_element_differs(site: str, tmp_path: Path) -> None:
    first, second = tmp_path / "1.png", tmp_path / "2.png"
    with Browser() as browser:
        browser.screenshot(f"{site}/animated", first)
        browser.screenshot(f"{site}/animated", second)
    result = diff_images(first, second, out=tmp_path / "diff.png")
    assert result.differing_pixels > 0
    x, y, width, height = TRACK
    for bx, by, bw, bh in result.boxes:
        assert x <= bx and bx + bw <= x + width, result.boxes
        assert y <= by and by + bh <= y + height, result.boxes


def test_async_variant(site: str, tmp_path: Path) -> None:
    async def capture() -> str:
        result = await screenshot_async(f"{site}/", tmp_path / "a.png", width=320, height=240)
        return result.text

    assert "Hello from forkpoint" in asyncio.run(capture())


def test_http_error_status_is_reported(site: str, tmp_path: Path) -> None:
    result = screenshot(f"{site}/missing", tmp_path / "404.png", width=320, height=240)
    assert result.status == 404
    assert "not here" in result.text


def test_unreachable_url_is_one_clear_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/"
    with pytest.raises(InvalidInput) as info:
        screenshot(url, tmp_path / "x.png", timeout_s=10)
    assert "ERR_CONNECTION_REFUSED" in info.value.message and url in info.value.message
    assert "\n" not in info.value.message
    assert not (tmp_path / "x.png").exists()


def test_bad_requests_fail_before_launching(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a loadable URL"):
        screenshot("example.com", tmp_path / "x.png")
    with pytest.raises(InvalidInput, match="width"):
        screenshot("http://127.0.0.1/", tmp_path / "x.png", width=0)


def test_missing_chromium_gives_a_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKPOINT_CHROMIUM", str(tmp_path / "no-such-chromium"))
    with pytest.raises(InternalError, match="make setup"):
        screenshot("http://127.0.0.1/", tmp_path / "x.png")


def test_cli_screenshot_json(site: str, tmp_path: Path) -> None:
    out = tmp_path / "cli.png"
    done = subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", "screenshot", f"{site}/", "-o", str(out)]
        + ["--width", "400", "--height", "300", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["width"], report["height"]) == (400, 300)
    assert "Hello from forkpoint" in report["text"]
    assert out.is_file()
