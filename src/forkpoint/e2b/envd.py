"""envd emulation: ``/health``, ``/files`` and the Connect services, for the sandbox the
SDK names in ``E2b-Sandbox-Id`` — only with that sandbox's ``X-Access-Token``.

Signed ``/files`` URLs (``download_url``/``upload_url``) carry no sandbox id: the
sandbox is the one whose token reproduces the signature.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from forkpoint.errors import ForkpointError, NotFound

from . import envd_fs, envd_process
from .connect import CONNECT_JSON, ConnectError, decode_message, read_envelopes
from .context import DEFAULT_USER, EnvdCall, connect_error, not_running
from .files import download, envd_http_error, upload
from .sandboxes import Sandbox, Sandboxes

__all__ = ["envd_router"]


class _Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _user(request: Request) -> str:
    username = request.query_params.get("username")
    if username:
        return username
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("basic "):
        try:
            decoded = base64.b64decode(auth[6:], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise _Denied(401, "malformed Basic authorization") from None
        name = decoded.split(":", 1)[0]
        if name:
            return name
    return DEFAULT_USER


def _timeout_s(request: Request, name: str, scale: float) -> float | None:
    value = request.headers.get(name)
    if value and value.isdigit() and int(value) > 0:
        return int(value) * scale
    return None


def _signature(path: str, op: str, user: str, token: str, expiration: str | None) -> str:
    raw = f"{path}:{op}:{user}:{token}" + (f":{expiration}" if expiration else "")
    digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
    return f"v1_{digest}"


def _signed_sandbox(sandboxes: Sandboxes, request: Request, op: str) -> Sandbox:
    params = request.query_params
    signature, expiration = params.get("signature", ""), params.get("signature_expiration")
    if expiration and (not expiration.isdigit() or int(expiration) < time.time()):
        raise _Denied(401, "signature is already expired")  # envd's words
    path, user = params.get("path", ""), params.get("username", "")
    for sandbox in sandboxes.all():
        expected = _signature(path, op, user, sandbox.record.access_token, expiration)
        if hmac.compare_digest(expected, signature):
            return sandbox
    raise _Denied(401, "invalid signature")


def _sandbox(sandboxes: Sandboxes, request: Request, op: str | None = None) -> Sandbox:
    """The running sandbox this request is for, checked against its access token."""
    sandbox_id = request.headers.get("e2b-sandbox-id")
    if sandbox_id is None:
        if op is not None and "signature" in request.query_params:
            sandbox = _signed_sandbox(sandboxes, request, op)
            if sandbox.paused:
                raise _Denied(502, f"The sandbox {sandbox.id} was not found")
            return sandbox
        raise _Denied(400, "missing E2b-Sandbox-Id header")
    try:
        sandbox = sandboxes.get(sandbox_id)
    except NotFound:
        raise _Denied(502, f"The sandbox {sandbox_id} was not found") from None
    token = request.headers.get("x-access-token", "")
    if not hmac.compare_digest(token.encode(), sandbox.record.access_token.encode()):
        raise _Denied(401, "invalid or missing X-Access-Token for this sandbox")
    if sandbox.paused:
        raise _Denied(502, f"The sandbox {sandbox_id} was not found")
    return sandbox


def _call(sandboxes: Sandboxes, request: Request, op: str | None = None) -> EnvdCall:
    """The call's sandbox, its user and timeouts (blocking: on a cluster, the store's and
    the node's answers)."""
    return EnvdCall(
        runtime=sandboxes.runtime, sandbox=_sandbox(sandboxes, request, op), user=_user(request),
        deadline_s=_timeout_s(request, "connect-timeout-ms", 0.001),
        keepalive_s=_timeout_s(request, "keepalive-ping-interval", 1.0),
    )  # fmt: skip


def _rpc_error(error: ConnectError) -> JSONResponse:
    return JSONResponse(error.to_json(), status_code=error.http_status)


def _denied_rpc(denied: _Denied) -> JSONResponse:
    if denied.status == 502:
        error = ConnectError("unavailable", denied.message)
        return JSONResponse(error.to_json(), status_code=502)
    code = {401: "unauthenticated", 400: "invalid_argument"}.get(denied.status, "unknown")
    return JSONResponse({"code": code, "message": denied.message}, status_code=denied.status)


def envd_router(sandboxes: Sandboxes) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health(request: Request) -> Response:
        try:
            await asyncio.to_thread(_sandbox, sandboxes, request)
        except _Denied as denied:
            return envd_http_error(denied.status, denied.message)
        return Response(status_code=204)

    @router.get("/files")
    async def get_files(request: Request) -> Response:
        try:
            call = await asyncio.to_thread(_call, sandboxes, request, "read")
        except _Denied as denied:
            return envd_http_error(denied.status, denied.message)
        return await download(call, request.query_params.get("path"))

    @router.post("/files")
    async def post_files(request: Request) -> Response:
        try:
            call = await asyncio.to_thread(_call, sandboxes, request, "write")
        except _Denied as denied:
            return envd_http_error(denied.status, denied.message)
        return await upload(call, request, request.query_params.get("path"))

    @router.post("/process.Process/{method}")
    async def process(method: str, request: Request) -> Response:
        return await _rpc(sandboxes, request, "process", method)

    @router.post("/filesystem.Filesystem/{method}")
    async def filesystem(method: str, request: Request) -> Response:
        return await _rpc(sandboxes, request, "filesystem", method)

    return router


async def _rpc(sandboxes: Sandboxes, request: Request, service: str, method: str) -> Response:
    try:
        call = await asyncio.to_thread(_call, sandboxes, request)
    except _Denied as denied:
        return _denied_rpc(denied)
    try:
        if service == "process" and method == "StreamInput":
            return _stream(envd_process.stream_input(call, request.stream()))
        if request.headers.get("content-type", "").startswith(CONNECT_JSON):
            message = await _first_envelope(request)
            if service == "process":
                return _stream(await envd_process.streaming(call, method, message))
            if method != "WatchDir":
                raise ConnectError("unimplemented", f"{service}.{method} streams are not supported")
            keepalive = call.keepalive_s or envd_process.DEFAULT_KEEPALIVE_S
            return _stream(await envd_fs.watch_dir(call, message, keepalive))
        handlers = envd_process.UNARY if service == "process" else envd_fs.UNARY
        handler = handlers.get(method)
        if handler is None:
            raise ConnectError("unimplemented", f"{service}.{method} is not implemented")
        return JSONResponse(await handler(call, await _json(request)))
    except ConnectError as error:
        return _rpc_error(error)
    except ForkpointError as error:
        if await asyncio.to_thread(_gone, sandboxes, call.sandbox_id):
            return _denied_rpc(_Denied(502, not_running(call.sandbox_id).message))
        return _rpc_error(connect_error(error))


def _gone(sandboxes: Sandboxes, sandbox_id: str) -> bool:
    try:
        return sandboxes.get(sandbox_id).paused
    except NotFound:
        return True


def _stream(body: Any) -> StreamingResponse:
    return StreamingResponse(body, media_type=CONNECT_JSON)


async def _json(request: Request) -> dict[str, Any]:
    return decode_message(await request.body())


async def _first_envelope(request: Request) -> dict[str, Any]:

    async for message in read_envelopes(request.stream()):
        return message
    raise ConnectError("invalid_argument", "empty request stream")
