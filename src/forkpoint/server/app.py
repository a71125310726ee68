"""The REST API: a thin FastAPI shell over :class:`~forkpoint.runtime.Runtime` under ``/v1``.

Every handler awaits one runtime call; sessions are protected by the runtime's
inter-process locks, so nothing here coordinates anything. Errors always have the shape
``{"error": {"code", "message"}}``: a :class:`~forkpoint.errors.ForkpointError` maps to
its ``http_status`` (400 bad input, 404 unknown id, 409 wrong state, 408 command timeout),
request validation to 422, oversized bodies to 413, a missing/wrong token to 401.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import tempfile
from collections.abc import AsyncIterator
from typing import IO, Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.types import Scope

from forkpoint import __version__
from forkpoint.errors import ForkpointError, InvalidInput
from forkpoint.models import (
    BackgroundProcess,
    Checkpoint,
    CommandResult,
    ErrorResponse,
    FileEntry,
    Health,
    HistoryStep,
    Port,
    Process,
    Session,
    StateDiff,
)
from forkpoint.requests import (
    CheckpointRequest,
    CreateSessionRequest,
    DiffRequest,
    ExecRequest,
    ForkRequest,
    PortRequest,
    Ref,
    RollbackPreviewRequest,
    RollbackRequest,
    TimeoutRequest,
    UndoRequest,
    describe_invalid,
)
from forkpoint.runtime import Runtime

from .middleware import BearerAuth, BodyLimit, BodyTooLarge
from .ui import UiLogin, ui_router

__all__ = ["DEFAULT_MAX_JSON_BYTES", "DEFAULT_MAX_UPLOAD_BYTES", "create_app"]

DEFAULT_MAX_JSON_BYTES = 1 << 20  # 1 MiB: any JSON request body
DEFAULT_MAX_UPLOAD_BYTES = 1 << 30  # 1 GiB: a file upload (PUT .../files)
_SPOOL_IN_MEMORY_BYTES = 8 << 20  # file bodies beyond this spill to a host temp file
_CHUNK = 256 * 1024
_OPEN_PATHS = frozenset({"/v1/health"})

_STATUS_CODES = {
    400: "invalid_input",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
}

SessionId = Annotated[Ref, PathParam(description="Session id or name.")]
CheckpointId = Annotated[Ref, PathParam(description="Checkpoint id or name.")]
GuestPathQuery = Annotated[
    str, Query(min_length=1, max_length=4096, description="Absolute path in the guest.")
]
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 404, 408, 409, 413, 422)
}
_OCTETS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def create_app(
    runtime: Runtime,
    *,
    token: str | None = None,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    login_token: str | None = None,
) -> FastAPI:
    """The ASGI app serving ``runtime``. With ``token``, every request but ``/v1/health``
    needs ``Authorization: Bearer <token>``. Body caps in bytes. ``login_token``: the
    one-time token of the web page's login URL (``/ui/login?token=``; see ``ui.py``)."""
    app = FastAPI(
        title="forkpoint",
        version=__version__,
        description="MicroVM sessions you can checkpoint, fork and roll back.",
        openapi_url="/v1/openapi.json",
        docs_url="/v1/docs",
        redoc_url=None,
    )

    @app.exception_handler(ForkpointError)
    async def _forkpoint_error(_: Request, error: ForkpointError) -> JSONResponse:
        return JSONResponse({"error": error.to_dict()}, status_code=error.http_status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid_input", describe_invalid(error.errors()))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, error: HTTPException) -> Response:
        code = _STATUS_CODES.get(error.status_code, "error")
        response = _error(error.status_code, code, str(error.detail))
        if error.headers:
            response.headers.update(error.headers)
        return response

    @app.exception_handler(Exception)
    async def _internal(_: Request, error: Exception) -> JSONResponse:
        return _error(500, "internal", f"internal error: {type(error).__name__}: {error}")

    app.include_router(_router(runtime, max_upload_bytes))
    app.include_router(ui_router(runtime))

    def limit_for(scope: Scope) -> int:
        is_upload = scope.get("method") == "PUT" and str(scope.get("path", "")).endswith("/files")
        return max_upload_bytes if is_upload else max_json_bytes

    # Added last = outermost: auth runs before the body is read at all.
    app.add_middleware(BodyLimit, limit_for=limit_for)
    if token is not None:
        app.add_middleware(BearerAuth, token=token, open_paths=_OPEN_PATHS)
        if login_token is not None:
            app.add_middleware(UiLogin, api_token=token, login_token=login_token)
    return app


def _router(runtime: Runtime, max_upload_bytes: int) -> APIRouter:
    r = APIRouter(prefix="/v1", responses=_ERRORS)

    @r.get("/health", tags=["meta"])
    async def health() -> Health:
        return Health(status="ok", version=__version__)

    # -- sessions ----------------------------------------------------------------------

    @r.post("/sessions", status_code=201, tags=["sessions"])
    async def create_session(body: CreateSessionRequest) -> Session:
        return await runtime.create(**body.model_dump())

    @r.get("/sessions", tags=["sessions"])
    async def list_sessions() -> list[Session]:
        return await asyncio.to_thread(runtime.list_sessions)

    @r.get("/sessions/{session_id}", tags=["sessions"])
    async def get_session(session_id: SessionId) -> Session:
        return await asyncio.to_thread(runtime.get, session_id)

    @r.delete("/sessions/{session_id}", status_code=204, tags=["sessions"])
    async def remove_session(session_id: SessionId) -> Response:
        await runtime.remove(session_id)
        return Response(status_code=204)

    @r.post("/sessions/{session_id}/timeout", tags=["sessions"])
    async def set_timeout(session_id: SessionId, body: TimeoutRequest) -> Session:
        """The session is removed ``timeout_s`` seconds from now (null: never)."""
        return await runtime.set_timeout(session_id, body.timeout_s)

    @r.post("/sessions/{session_id}/rollback", tags=["sessions"])
    async def rollback(session_id: SessionId, body: RollbackRequest) -> Session:
        return await runtime.rollback(session_id, body.checkpoint)

    # -- history and diffs -------------------------------------------------------------

    @r.post("/sessions/{session_id}/rollback/preview", tags=["history"])
    async def rollback_preview(session_id: SessionId, body: RollbackPreviewRequest) -> StateDiff:
        """What the rollback would undo (files, processes, listening ports); changes nothing."""
        return await runtime.rollback_preview(session_id, body.checkpoint, patch=body.patch)

    @r.post("/diff", tags=["history"])
    async def diff(body: DiffRequest) -> StateDiff:
        """What changed from checkpoint or session ``a`` to ``b``."""
        return await runtime.diff(
            body.a, body.b, patch=body.patch, include_tmp=body.include_tmp, exclude=body.exclude
        )

    @r.get("/sessions/{session_id}/history", tags=["history"])
    async def history(session_id: SessionId) -> list[HistoryStep]:
        return await asyncio.to_thread(runtime.history, session_id)

    @r.post("/sessions/{session_id}/undo", tags=["history"])
    async def undo(session_id: SessionId, body: UndoRequest) -> Session:
        """Roll back to before the last ``steps`` steps, processes included."""
        return await runtime.undo(session_id, body.steps)

    # -- commands ----------------------------------------------------------------------

    @r.post(
        "/sessions/{session_id}/exec",
        tags=["commands"],
        summary="Run a command (to completion, or in the background)",
    )
    async def exec_command(
        session_id: SessionId, body: ExecRequest
    ) -> CommandResult | BackgroundProcess:
        command: str | list[str] = body.command
        if body.background:
            if body.stdin is not None or body.timeout is not None:
                raise InvalidInput("stdin and timeout do not apply to a background command")
            return await runtime.spawn(session_id, command, cwd=body.cwd, env=body.env)
        stdin: bytes | None = None
        if body.stdin is not None:
            if body.stdin_encoding == "base64":
                try:
                    stdin = base64.b64decode(body.stdin, validate=True)
                except (binascii.Error, ValueError) as error:
                    raise InvalidInput("stdin is not valid base64") from error
            else:
                stdin = body.stdin.encode()
        return await runtime.exec(
            session_id, command, cwd=body.cwd, env=body.env, stdin=stdin, timeout=body.timeout,
            output_encoding=body.output_encoding,
        )  # fmt: skip

    @r.get("/sessions/{session_id}/processes", tags=["commands"])
    async def processes(session_id: SessionId) -> list[Process]:
        return await runtime.ps(session_id)

    @r.delete("/sessions/{session_id}/processes/{pid}", status_code=204, tags=["commands"])
    async def kill_process(
        session_id: SessionId,
        pid: Annotated[int, PathParam(ge=2, le=1 << 22)],
        signal: Annotated[str, Query(pattern=r"^([0-9]{1,2}|[A-Za-z0-9]{2,12})$")] = "TERM",
    ) -> Response:
        await runtime.kill_process(session_id, pid, int(signal) if signal.isdigit() else signal)
        return Response(status_code=204)

    # -- files -------------------------------------------------------------------------

    @r.get(
        "/sessions/{session_id}/files",
        response_class=StreamingResponse,
        responses={200: {"content": _OCTETS, "description": "The file's bytes."}},
        tags=["files"],
    )
    async def read_file(session_id: SessionId, path: GuestPathQuery) -> StreamingResponse:
        # Spooled first so a missing file is a clean 404, not a broken 200 stream.
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES)
        try:
            size = await runtime.read_file_to(session_id, path, spool)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return StreamingResponse(
            _drain(spool),
            media_type="application/octet-stream",
            headers={"content-length": str(size)},
        )

    @r.put(
        "/sessions/{session_id}/files",
        status_code=204,
        openapi_extra={"requestBody": {"required": True, "content": _OCTETS}},
        tags=["files"],
        summary=f"Write a file (raw body, at most {max_upload_bytes} bytes)",
    )
    async def write_file(
        session_id: SessionId,
        path: GuestPathQuery,
        request: Request,
        mode: Annotated[int, Query(ge=0, le=0o7777, description="Permission bits.")] = 0o644,
    ) -> Response:
        await asyncio.to_thread(runtime.get, session_id)  # 404 before reading a large body
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES) as spool:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_upload_bytes:
                    raise BodyTooLarge(max_upload_bytes)
                spool.write(chunk)
            spool.seek(0)
            await runtime.write_file(session_id, path, spool, mode=mode)
        return Response(status_code=204)

    @r.delete("/sessions/{session_id}/files", status_code=204, tags=["files"])
    async def remove_file(session_id: SessionId, path: GuestPathQuery) -> Response:
        await runtime.remove_file(session_id, path)
        return Response(status_code=204)

    @r.get("/sessions/{session_id}/files/list", tags=["files"])
    async def list_files(session_id: SessionId, path: GuestPathQuery) -> list[FileEntry]:
        return await runtime.list_files(session_id, path)

    # -- ports -------------------------------------------------------------------------

    @r.post("/sessions/{session_id}/ports", tags=["ports"])
    async def forward_port(session_id: SessionId, body: PortRequest) -> Port:
        return await runtime.forward_port(session_id, body.guest_port)

    # -- checkpoints -------------------------------------------------------------------

    @r.post(
        "/sessions/{session_id}/checkpoints",
        status_code=201,
        tags=["checkpoints"],
    )
    async def checkpoint(session_id: SessionId, body: CheckpointRequest) -> Checkpoint:
        return await runtime.checkpoint(session_id, body.name)

    @r.get("/checkpoints", tags=["checkpoints"])
    async def list_checkpoints(
        session: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    ) -> list[Checkpoint]:
        return await asyncio.to_thread(runtime.list_checkpoints, session)

    @r.get("/checkpoints/{checkpoint_id}", tags=["checkpoints"])
    async def get_checkpoint(checkpoint_id: CheckpointId) -> Checkpoint:
        return await asyncio.to_thread(runtime.get_checkpoint, checkpoint_id)

    @r.delete("/checkpoints/{checkpoint_id}", status_code=204, tags=["checkpoints"])
    async def remove_checkpoint(checkpoint_id: CheckpointId) -> Response:
        await runtime.remove_checkpoint(checkpoint_id)
        return Response(status_code=204)

    @r.post(
        "/checkpoints/{checkpoint_id}/fork",
        tags=["checkpoints"],
        summary="Start sessions from a checkpoint; a failed fork is an error in its slot",
    )
    async def fork(checkpoint_id: CheckpointId, body: ForkRequest) -> list[Session | ErrorResponse]:
        results = await runtime.fork(checkpoint_id, body.count)
        return [ErrorResponse.of(r) if isinstance(r, ForkpointError) else r for r in results]

    return r


async def _drain(spool: IO[bytes]) -> AsyncIterator[bytes]:
    try:
        while chunk := spool.read(_CHUNK):
            yield chunk
    finally:
        spool.close()
