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
from http.cookies import SimpleCookie
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from forkpoint.errors import InvalidInput, NotFound
from forkpoint.models import Event, SessionState, to_json_data
from forkpoint.runtime import Runtime

from .middleware import send_error
from .ui_page import PAGE
from .ui_shots import Shelf, Shot, grid_sessions, origin
from .vendor import vendored

__all__ = ["UiLogin", "ui_router"]

_COOKIE = "forkpoint_ui"
_EVENTS_SHOWN = 12
_SAFE_METHODS = frozenset({"GET", "HEAD"})


SessionRef = Annotated[str, Path(min_length=1, max_length=128)]
GuestPort = Annotated[int, Query(ge=1, le=65535)]
PagePath = Annotated[str, Query(min_length=1, max_length=2048)]


def ui_router(runtime: Runtime) -> APIRouter:
    r = APIRouter(prefix="/ui", include_in_schema=False)
    shelf = Shelf()

    @r.get("", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE, headers={"Cache-Control": "no-store"})

    @r.get("/state")
    async def state() -> dict[str, Any]:
        """Sessions (with their disk use and last metrics), checkpoints, history labels and
        the latest events, for the page."""
        return await asyncio.to_thread(_state, runtime)

    @r.post("/shots/{session}")
    async def take_shot(
        session: SessionRef, port: GuestPort, path: PagePath = "/"
    ) -> dict[str, Any]:
        """Screenshot a session's forwarded web port now (kept for the grid)."""
        shot = await shelf.take(runtime, session, port, path)
        return {"shot": shot.number, "taken_at": shot.taken_at}

    @r.get("/shots/{session}")
    async def shot_png(session: SessionRef, port: GuestPort) -> Response:
        """The session's latest shot of ``port``."""
        return _png(_kept(shelf, session, port).png)

    @r.get("/shots/{session}/overlay")
    async def shot_overlay(session: SessionRef, port: GuestPort, parent: SessionRef) -> Response:
        """Where the session's shot differs from ``parent``'s: the demo's diff image."""
        shot, parent_shot = _kept(shelf, session, port), _kept(shelf, parent, port)
        compared = await asyncio.to_thread(shelf.compare, shot, parent_shot)
        return _png(compared.overlay)

    @r.get("/grid")
    async def grid(
        port: GuestPort,
        checkpoint: Annotated[str | None, Query(max_length=128)] = None,
        sessions: Annotated[str | None, Query(max_length=4096)] = None,
    ) -> dict[str, Any]:
        """Sessions side by side: a checkpoint's (the one that took it, then its forks)
        or a comma-separated list; each with its kept shot and how much it differs from
        the parent's (the checkpoint's session, or the list's first)."""
        return await asyncio.to_thread(_grid, runtime, shelf, port, checkpoint, sessions)

    @r.get("/vendor/{name}")
    async def vendor_file(name: str) -> Response:
        """xterm.js and its stylesheet, vendored at build time (``vendor.py``)."""
        path = vendored(name)
        if path is None:
            raise NotFound(f"{name} is not vendored here (make setup fetches it)")
        media = "text/css" if name.endswith(".css") else "text/javascript"
        return Response(
            await asyncio.to_thread(path.read_bytes), media_type=media,
            headers={"Cache-Control": "private, max-age=3600"},
        )  # fmt: skip

    return r


def _kept(shelf: Shelf, session: str, port: int) -> Shot:
    shot = shelf.get(session, port)
    if shot is None:
        raise NotFound(f"no screenshot of session {session}'s port {port} yet")
    return shot


def _png(data: bytes) -> Response:
    return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=600"})


def _grid(
    runtime: Runtime, shelf: Shelf, port: int, checkpoint: str | None, listed: str | None
) -> dict[str, Any]:
    if (checkpoint is None) == (listed is None):
        raise InvalidInput("give one of checkpoint= or sessions=")
    if checkpoint is not None:
        shown = [s for s in runtime.list_sessions() if s.id not in runtime.scratch_sessions]
        parent, sessions = grid_sessions(
            runtime.get_checkpoint(checkpoint), shown, runtime.list_checkpoints()
        )
    else:
        sessions = [runtime.get(ref) for ref in (listed or "").split(",") if ref]
        parent = sessions[0].id if sessions else None
    return {"port": port, "parent": parent, "cells": shelf.grid(sessions, parent, port)}


def _state(runtime: Runtime) -> dict[str, Any]:
    sessions = []
    metrics = runtime.latest_metrics()
    listed = runtime.list_checkpoints()
    by_id = {c.id: c for c in listed}
    for session in runtime.list_sessions():
        if session.id in runtime.scratch_sessions:
            continue  # a fork made to compute a diff, removed in a moment
        data = to_json_data(session)  # disk_bytes: its own files, as `ls` shows them
        running = session.state == SessionState.RUNNING
        data["metric"] = to_json_data(metrics.get(session.id)) if running else None
        data["origin"] = origin(session, by_id)  # where the lineage hangs it
        sessions.append(data)
    checkpoints = [to_json_data(c) for c in listed]
    return {
        "sessions": sessions, "checkpoints": checkpoints, "steps": runtime.step_labels(),
        "events": to_json_data(_events(runtime)),
        "host": to_json_data(runtime.host_status()),
    }  # fmt: skip


def _events(runtime: Runtime) -> list[Event]:
    try:
        return runtime.recent_events(_EVENTS_SHOWN)
    except InvalidInput:  # a cluster does not gather its hosts' event logs yet
        return []


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
