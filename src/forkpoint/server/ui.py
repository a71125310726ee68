"""The web page of ``forkpoint serve`` / ``forkpoint ui``: sessions and their lineage tree.

Server-rendered HTML with a little JavaScript (``ui_page.py``), no CDN: the page reads
``/ui/state`` every 2 s and acts through the REST API itself (``/v1``). Login, like
Jupyter's: ``forkpoint ui`` prints ``/ui/login?token=T`` with a one-time token; opening it
sets an HttpOnly, SameSite=Strict cookie, and requests carrying that cookie are let through
the bearer-token check. A write with the cookie must also carry ``X-Forkpoint-UI: 1``
(another site's form cannot set a header), so the cookie alone is no CSRF door.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import tempfile
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from forkpoint.errors import NotFound
from forkpoint.models import SessionState, to_json_data
from forkpoint.runtime import Runtime

from .middleware import send_error
from .ui_page import PAGE

__all__ = ["UiLogin", "ui_router"]

_COOKIE = "forkpoint_ui"
_EVENTS_SHOWN = 12
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def ui_router(runtime: Runtime) -> APIRouter:
    r = APIRouter(prefix="/ui", include_in_schema=False)

    @r.get("", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE, headers={"Cache-Control": "no-store"})

    @r.get("/state")
    async def state() -> dict[str, Any]:
        """Sessions (with their disk use and last metrics), checkpoints, history labels and
        the latest events, for the page."""
        return await asyncio.to_thread(_state, runtime)

    @r.get("/screenshot")
    async def screenshot(
        session: Annotated[str, Query(min_length=1, max_length=128)],
        port: Annotated[int, Query(ge=1, le=65535)],
    ) -> Response:
        """A thumbnail of a forwarded web port, taken now (chromium, headless)."""
        from forkpoint.browser import screenshot_async

        info = await asyncio.to_thread(runtime.get, session)
        forward = info.port(port)
        if forward is None:
            raise NotFound(f"session {info.id} forwards no guest port {port}")
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "shot.png"
            await screenshot_async(forward.url, out, width=800, height=500, timeout_s=20)
            return Response(await asyncio.to_thread(out.read_bytes), media_type="image/png")

    return r


def _state(runtime: Runtime) -> dict[str, Any]:
    sessions = []
    metrics = runtime.latest_metrics()
    for session in runtime.list_sessions():
        if session.id in runtime.scratch_sessions:
            continue  # a fork made to compute a diff, removed in a moment
        data = to_json_data(session)
        data["disk_bytes"] = runtime.disk_bytes(session.id)
        running = session.state == SessionState.RUNNING
        data["metric"] = to_json_data(metrics.get(session.id)) if running else None
        sessions.append(data)
    checkpoints = [to_json_data(c) for c in runtime.list_checkpoints()]
    return {
        "sessions": sessions, "checkpoints": checkpoints, "steps": runtime.step_labels(),
        "events": to_json_data(runtime.recent_events(_EVENTS_SHOWN)),
    }  # fmt: skip


class UiLogin:
    """Pure ASGI, outside the bearer-token check: ``/ui/login?token=`` (once) sets the
    cookie; a request with a valid cookie gets the API token's ``Authorization`` header.
    ``/ui`` without one is a short page saying how to log in."""

    def __init__(self, app: ASGIApp, api_token: str, login_token: str) -> None:
        self.app = app
        self.authorization = f"Bearer {api_token}".encode()
        self.login_token: str | None = login_token
        self.cookies: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if path == "/ui/login":
            await self._login(scope, send)
            return
        cookie = self._cookie(scope)
        if cookie is not None:
            writes = scope.get("method") not in _SAFE_METHODS
            if writes and _header(scope, b"x-forkpoint-ui") != b"1":
                await send_error(send, 403, "forbidden", "missing X-Forkpoint-UI header")
                return
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]
            scope = {**scope, "headers": [*headers, (b"authorization", self.authorization)]}
        elif path == "/ui":
            await _html(send, 401, _LOGGED_OUT)
            return
        await self.app(scope, receive, send)

    def _cookie(self, scope: Scope) -> str | None:
        raw = _header(scope, b"cookie")
        if not raw:
            return None
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw.decode("latin-1"))
        except Exception:
            return None
        morsel = jar.get(_COOKIE)
        if morsel is None:
            return None
        value = morsel.value
        return value if any(hmac.compare_digest(value, c) for c in self.cookies) else None

    async def _login(self, scope: Scope, send: Send) -> None:
        from urllib.parse import parse_qs

        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0]
        expected = self.login_token
        if expected is None or not hmac.compare_digest(given, expected):
            await _html(send, 401, _LOGGED_OUT)
            return
        self.login_token = None  # one time
        secret = secrets.token_urlsafe(32)
        self.cookies.add(secret)
        cookie = f"{_COOKIE}={secret}; Path=/; HttpOnly; SameSite=Strict"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [(b"location", b"/ui"), (b"set-cookie", cookie.encode())],
            }
        )
        await send({"type": "http.response.body", "body": b""})


_LOGGED_OUT = (
    "<!doctype html><html lang=en><meta charset=utf-8><title>forkpoint</title>"
    "<p>Not logged in: open the login URL <code>forkpoint ui</code> printed "
    "(it works once).</p></html>"
)


async def _html(send: Send, status: int, body: str) -> None:
    data = body.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/html; charset=utf-8")],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return None
