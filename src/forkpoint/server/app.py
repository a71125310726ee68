"""The REST API: a thin FastAPI shell over :class:`~forkpoint.runtime.Runtime` under ``/v1``.

Every handler awaits one runtime call; sessions are protected by the runtime's
inter-process locks, so nothing here coordinates anything. Errors always have the shape
``{"error": {"code", "message"}}``: a :class:`~forkpoint.errors.ForkpointError` maps to
its ``http_status`` (400 bad input, 404 unknown id, 409 wrong state, 408 command timeout),
request validation to 422, oversized bodies to 413, a missing/wrong token to 401.
"""

from __future__ import annotations

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
from forkpoint.runtime import Runtime

from .middleware import BearerAuth, BodyLimit, BodyTooLarge
from .models import (
    CheckpointOut,
    CheckpointRequest,
    CreateSessionRequest,
    ErrorOut,
    ExecOut,
    ExecRequest,
    FileEntryOut,
    ForkRequest,
    HealthOut,
    PortOut,
    PortRequest,
    ProcessOut,
    RollbackRequest,
    SessionOut,
    SpawnOut,
)

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

SessionId = Annotated[str, PathParam(min_length=1, max_length=128)]
CheckpointId = Annotated[str, PathParam(min_length=1, max_length=128)]
GuestPathQuery = Annotated[
    str, Query(min_length=1, max_length=4096, description="Absolute path in the guest.")
]
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut} for status in (400, 404, 408, 409, 413, 422)
}
_OCTETS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _validation_message(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        if item.get("type") == "json_invalid":
            detail = (item.get("ctx") or {}).get("error", "")
            return f"malformed JSON body: {detail}".rstrip(": ")
        loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {item.get('msg', 'invalid')}" if loc else str(item.get("msg")))
    return "; ".join(parts) or "invalid request"


def create_app(
    runtime: Runtime,
    *,
    token: str | None = None,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
) -> FastAPI:
    """The ASGI app serving ``runtime``. With ``token``, every request but ``/v1/health``
    needs ``Authorization: Bearer <token>``. Body caps in bytes."""
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
        return _error(422, "invalid_input", _validation_message(error))

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

    def limit_for(scope: Scope) -> int:
        is_upload = scope.get("method") == "PUT" and str(scope.get("path", "")).endswith("/files")
        return max_upload_bytes if is_upload else max_json_bytes

    # Added last = outermost: auth runs before the body is read at all.
    app.add_middleware(BodyLimit, limit_for=limit_for)
    if token is not None:
        app.add_middleware(BearerAuth, token=token, open_paths=_OPEN_PATHS)
    return app


def _router(runtime: Runtime, max_upload_bytes: int) -> APIRouter:
    r = APIRouter(prefix="/v1", responses=_ERRORS)

    @r.get("/health", response_model=HealthOut, tags=["meta"])
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": __version__}

    # -- sessions ----------------------------------------------------------------------

    @r.post("/sessions", status_code=201, response_model=SessionOut, tags=["sessions"])
    async def create_session(body: CreateSessionRequest) -> dict[str, Any]:
        session = await runtime.create(
            image=body.image, memory_mib=body.memory_mib, cpus=body.cpus, name=body.name,
            ports=body.ports, network=body.network,
        )  # fmt: skip
        return session.to_dict()

    @r.get("/sessions", response_model=list[SessionOut], tags=["sessions"])
    async def list_sessions() -> list[dict[str, Any]]:
        return [s.to_dict() for s in runtime.list_sessions()]

    @r.get("/sessions/{session_id}", response_model=SessionOut, tags=["sessions"])
    async def get_session(session_id: SessionId) -> dict[str, Any]:
        return runtime.get(session_id).to_dict()

    @r.delete("/sessions/{session_id}", status_code=204, tags=["sessions"])
    async def remove_session(session_id: SessionId) -> Response:
        await runtime.remove(session_id)
        return Response(status_code=204)

    @r.post("/sessions/{session_id}/rollback", response_model=SessionOut, tags=["sessions"])
    async def rollback(session_id: SessionId, body: RollbackRequest) -> dict[str, Any]:
        return (await runtime.rollback(session_id, body.checkpoint)).to_dict()

    # -- commands ----------------------------------------------------------------------

    @r.post(
        "/sessions/{session_id}/exec",
        response_model=ExecOut | SpawnOut,
        tags=["commands"],
        summary="Run a command (to completion, or in the background)",
    )
    async def exec_command(session_id: SessionId, body: ExecRequest) -> dict[str, Any]:
        command: str | list[str] = body.command
        if body.background:
            if body.stdin is not None or body.timeout is not None:
                raise InvalidInput("stdin and timeout do not apply to a background command")
            spawned = await runtime.spawn(session_id, command, cwd=body.cwd, env=body.env)
            return {"pid": spawned.pid, "log_path": spawned.log_path}
        stdin: bytes | None = None
        if body.stdin is not None:
            if body.stdin_encoding == "base64":
                try:
                    stdin = base64.b64decode(body.stdin, validate=True)
                except (binascii.Error, ValueError):
                    raise InvalidInput("stdin is not valid base64") from None
            else:
                stdin = body.stdin.encode()
        result = await runtime.exec(
            session_id, command, cwd=body.cwd, env=body.env, stdin=stdin, timeout=body.timeout
        )

        def encode(data: bytes) -> str:
            if body.output_encoding == "base64":
                return base64.b64encode(data).decode()
            return data.decode("utf-8", "replace")

        return {
            "exit_code": result.exit_code, "signal": result.signal,
            "stdout": encode(result.stdout), "stderr": encode(result.stderr),
            "output_encoding": body.output_encoding, "truncated": result.truncated,
            "duration_ms": round(result.duration_ms, 1), "pid": result.pid,
        }  # fmt: skip

    @r.get("/sessions/{session_id}/processes", response_model=list[ProcessOut], tags=["commands"])
    async def processes(session_id: SessionId) -> list[dict[str, Any]]:
        return [{"pid": p.pid, "ppid": p.ppid, "cmd": p.cmd} for p in await runtime.ps(session_id)]

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
        runtime.get(session_id)  # 404 before reading a large body
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

    @r.get("/sessions/{session_id}/files/list", response_model=list[FileEntryOut], tags=["files"])
    async def list_files(session_id: SessionId, path: GuestPathQuery) -> list[dict[str, Any]]:
        entries = await runtime.list_files(session_id, path)
        return [
            {"name": e.name, "type": e.type, "size": e.size, "mode": e.mode, "mtime_ns": e.mtime_ns}
            for e in entries
        ]

    # -- ports -------------------------------------------------------------------------

    @r.post("/sessions/{session_id}/ports", response_model=PortOut, tags=["ports"])
    async def forward_port(session_id: SessionId, body: PortRequest) -> dict[str, Any]:
        return (await runtime.forward_port(session_id, body.guest_port)).to_dict()

    # -- checkpoints -------------------------------------------------------------------

    @r.post(
        "/sessions/{session_id}/checkpoints",
        status_code=201,
        response_model=CheckpointOut,
        tags=["checkpoints"],
    )
    async def checkpoint(session_id: SessionId, body: CheckpointRequest) -> dict[str, Any]:
        return (await runtime.checkpoint(session_id, body.name)).to_dict()

    @r.get("/checkpoints", response_model=list[CheckpointOut], tags=["checkpoints"])
    async def list_checkpoints(
        session: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    ) -> list[dict[str, Any]]:
        return [c.to_dict() for c in runtime.list_checkpoints(session)]

    @r.get("/checkpoints/{checkpoint_id}", response_model=CheckpointOut, tags=["checkpoints"])
    async def get_checkpoint(checkpoint_id: CheckpointId) -> dict[str, Any]:
        return runtime.get_checkpoint(checkpoint_id).to_dict()

    @r.delete("/checkpoints/{checkpoint_id}", status_code=204, tags=["checkpoints"])
    async def remove_checkpoint(checkpoint_id: CheckpointId) -> Response:
        await runtime.remove_checkpoint(checkpoint_id)
        return Response(status_code=204)

    @r.post(
        "/checkpoints/{checkpoint_id}/fork",
        response_model=list[SessionOut | ErrorOut],
        tags=["checkpoints"],
        summary="Start sessions from a checkpoint; a failed fork is an error in its slot",
    )
    async def fork(checkpoint_id: CheckpointId, body: ForkRequest) -> list[dict[str, Any]]:
        results = await runtime.fork(checkpoint_id, body.count)
        return [
            {"error": r.to_dict()} if isinstance(r, ForkpointError) else r.to_dict()
            for r in results
        ]

    return r


async def _drain(spool: IO[bytes]) -> AsyncIterator[bytes]:
    try:
        while chunk := spool.read(_CHUNK):
            yield chunk
    finally:
        spool.close()
