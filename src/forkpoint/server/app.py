"""The REST API: a thin FastAPI shell over :class:`~forkpoint.runtime.Runtime` under ``/v1``.

Every handler awaits one runtime call; sessions are protected by the runtime's
inter-process locks. What this layer adds: the heavy calls (create, fork, checkpoint,
rollback) are admitted by the runtime's policy (:mod:`~forkpoint.runtime.admission`:
429 + ``Retry-After`` past a limit) and answer within a bounded ``wait`` or with a 202
operation to poll (:mod:`~forkpoint.server.operations`). Responses carry OpenAPI links
from each new id to the operations that take it. Errors always have the shape ``{"error": {"code",
"message"}}``: a :class:`~forkpoint.errors.ForkpointError` maps to its ``http_status``
(400 bad input, 404 unknown id, 409 wrong state, 408 command timeout, 429 busy), request
validation to 422, oversized bodies to 413, a missing/wrong token to 401.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import inspect
import json
import math
import signal as signals
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Annotated, Any

from fastapi import APIRouter, Body, FastAPI, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter
from starlette.convertors import StringConvertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import Scope

from forkpoint import __version__
from forkpoint.api import OPERATIONS, Op, admit
from forkpoint.config import MAX_WAIT_S, ApiLimits
from forkpoint.errors import ForkpointError, InvalidInput
from forkpoint.models import (
    NAME_PATTERN,
    RESERVED_CHECKPOINT_NAMES,
    BackgroundProcess,
    Checkpoint,
    CommandResult,
    ErrorResponse,
    FileEntry,
    Health,
    Operation,
    OperationKind,
    ProcessEvent,
    PtySize,
    to_json_data,
)
from forkpoint.requests import (
    MAX_EVENT_ID,
    BackgroundExecRequest,
    ExecRequest,
    GuestPath,
    Ref,
    TerminalRequest,
    describe_invalid,
)
from forkpoint.runtime import Runtime
from forkpoint.runtime.admission import Admission, Ticket

from .middleware import BearerAuth, BodyLimit, BodyTooLarge
from .operations import Operations
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
    429: "busy",
}

SessionId = Annotated[Ref, PathParam(description="Session id or name.")]
CheckpointId = Annotated[Ref, PathParam(description="Checkpoint id or name.")]
GuestPathQuery = Annotated[GuestPath, Query()]
# What remove_file accepts: not the root (the agent refuses "/", "//", ...).
RemovablePathQuery = Annotated[
    str,
    Query(
        pattern=r"^/[^\x00]*[^/\x00][^\x00]*$",
        max_length=4096,
        description="An absolute path in the guest, not /.",
    ),
]
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 404, 408, 409, 413, 422)
}
_OCTETS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_OPERATION = TypeAdapter(Operation)
Wait = Annotated[
    float,
    Query(
        ge=0,
        le=MAX_WAIT_S,
        description="Seconds to wait for the result before answering 202 with an operation "
        "to poll.",
    ),
]
_RETRY_AFTER = {"description": "Seconds before a retry may succeed.", "schema": {"type": "integer"}}
# The answers only a heavy call (create, fork, checkpoint, rollback) gives.
_HEAVY: dict[int | str, dict[str, Any]] = {
    202: {
        "model": Operation,
        "description": "Still running after `wait` seconds: poll the operation (Location).",
        "headers": {
            "Location": {"description": "The operation's URL.", "schema": {"type": "string"}},
            "Retry-After": _RETRY_AFTER,
        },
        "links": {
            "GetOperation": {
                "operationId": "get_operation",
                "parameters": {"operation_id": "$response.body#/operation_id"},
            }
        },
    },
    429: {
        "model": ErrorResponse,
        "description": "A limit of the server (running sessions, heavy calls at once); retry "
        "after Retry-After seconds.",
        "headers": {"Retry-After": _RETRY_AFTER},
    },
}
# In a session keeping history a command or file change first takes a checkpoint, which a
# host limit (the free-disk reserve) may refuse.
_STEP: dict[int | str, dict[str, Any]] = {
    429: {
        "model": ErrorResponse,
        "description": "The session keeps history and the checkpoint before this step would "
        "cross a host limit; retry after Retry-After seconds.",
        "headers": {"Retry-After": _RETRY_AFTER},
    },
}
# A signal by number (0: only check the process exists) or name, with or without "SIG".
_SIGNAL_PATTERN = (
    "^([0-9]|[1-5][0-9]|6[0-4]|(SIG)?("
    + "|".join(sorted({name.removeprefix("SIG") for name in signals.Signals.__members__}))
    + "))$"
)


class _CheckpointRef(StringConvertor):
    """A checkpoint's path segment, but not a name the checkpoint routes use themselves:
    ``/v1/checkpoints/pull`` is pull's alone (its OPTIONS and 405 answers allow POST only)."""

    regex = "(?!(?:" + "|".join(sorted(RESERVED_CHECKPOINT_NAMES)) + ")$)[^/]+"


register_url_convertor("checkpoint_ref", _CheckpointRef())


def _operation_id(route: APIRoute) -> str:
    """The handler's name: what OpenAPI links and clients refer to operations by."""
    return route.name


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def create_app(
    runtime: Runtime,
    *,
    token: str | None = None,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    limits: ApiLimits | None = None,
    login_token: str | None = None,
) -> FastAPI:
    """The ASGI app serving ``runtime``. With ``token``, every request but ``/v1/health``
    needs ``Authorization: Bearer <token>``. Body caps in bytes; ``limits``: what it
    admits (default: from the environment, :meth:`ApiLimits.from_env`). ``login_token``:
    the one-time token of the web page's login URL (``/ui/login?token=``; see ``ui.py``)."""
    if limits is None:
        try:
            limits = ApiLimits.from_env()
        except ValueError as error:
            raise InvalidInput(str(error)) from None
    admission = runtime.serve_long_lived(limits)
    operations = Operations()
    app = FastAPI(
        title="forkpoint",
        version=__version__,
        description="MicroVM sessions you can checkpoint, fork and roll back.",
        openapi_url="/v1/openapi.json",
        docs_url="/v1/docs",
        redoc_url=None,
        generate_unique_id_function=_operation_id,
    )
    app.state.admission = admission
    app.state.operations = operations

    @app.exception_handler(ForkpointError)
    async def _forkpoint_error(_: Request, error: ForkpointError) -> JSONResponse:
        response = JSONResponse({"error": error.to_dict()}, status_code=error.http_status)
        if error.http_status == 429:
            response.headers["retry-after"] = str(math.ceil(error.retry_after_s or 1))
        return response

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid_input", describe_invalid(error.errors()))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> Response:
        code = _STATUS_CODES.get(error.status_code, "error")
        response = _error(error.status_code, code, str(error.detail))
        if error.headers:
            response.headers.update(error.headers)
        if error.status_code == 405:
            # Starlette names the methods of the first route matching the path only.
            response.headers["allow"] = ", ".join(_allowed_methods(app, request.scope))
        return response

    @app.exception_handler(Exception)
    async def _internal(_: Request, error: Exception) -> JSONResponse:
        return _error(500, "internal", f"internal error: {type(error).__name__}: {error}")

    app.include_router(_router(runtime, max_upload_bytes, admission, operations))
    app.include_router(ui_router(runtime))

    def limit_for(scope: Scope) -> int:
        method, path = scope.get("method"), str(scope.get("path", ""))
        # File uploads, and image builds carrying their context (≤ 16 MiB, the model says).
        is_upload = (method == "PUT" and path.endswith("/files")) or (
            method == "POST" and path == "/v1/images"
        )
        return max_upload_bytes if is_upload else max_json_bytes

    # Added last = outermost: auth runs before the body is read at all.
    app.add_middleware(BodyLimit, limit_for=limit_for)
    if token is not None:
        app.add_middleware(BearerAuth, token=token, open_paths=_OPEN_PATHS)
        if login_token is not None:
            app.add_middleware(UiLogin, api_token=token, login_token=login_token)
    return app


def _router(
    runtime: Runtime, max_upload_bytes: int, admission: Admission, operations: Operations
) -> APIRouter:
    r = APIRouter(prefix="/v1", responses=_ERRORS)
    default_wait = admission.limits.wait_s

    async def heavy(
        kind: OperationKind, target: str | None, ticket: Ticket,
        work: Callable[[], Awaitable[Any]], wait: float,
    ) -> Any:  # fmt: skip
        """Run and wait (bounded) for one admitted heavy operation: its value, or a 202."""
        # The slot is the task's from here: released when the work ends, not when this
        # request does (a client that hangs up does not stop the work, nor free its slot).
        value, operation = await operations.run(
            kind, target, work, wait, on_done=ticket.release,
        )  # fmt: skip
        if operation is None:
            return value
        return JSONResponse(
            _OPERATION.dump_python(operation, mode="json"),
            status_code=202,
            headers={"location": f"/v1/operations/{operation.operation_id}", "retry-after": "1"},
        )

    @r.get("/health", tags=["meta"])
    async def health() -> Health:
        return Health(status="ok", version=__version__)

    # -- the declared operations (api/table.py) ---------------------------------------

    def route(op: Op) -> None:
        """``op`` as a route: its ids as path parameters, its request as the body, a heavy
        one's ``?wait=``; admitted by the runtime's policy before it runs."""
        heavy_kind = op.cost.kind if op.cost is not None else None
        params = [_keyword(name, _ID_PARAMS[name]) for name in op.ids]
        if op.request is not None and op.method == "GET":  # its query string
            params.append(_keyword("body", Annotated[op.request, Query()]))
        elif op.request is not None and _all_defaults(op.request):  # no body: the defaults
            params.append(_keyword("body", Annotated[op.request | None, Body()], None))
        elif op.request is not None:
            params.append(_keyword("body", Annotated[op.request, Body()]))
        if heavy_kind is not None:
            params.append(_keyword("wait", Wait, default_wait))

        async def handler(**arguments: Any) -> Any:
            ids = {name: arguments[name] for name in op.ids}
            body = arguments.get("body")
            if body is None and op.request is not None:
                body = op.request()
            ticket, target = await admit(op, admission, ids, body)
            if heavy_kind is not None:
                work = functools.partial(op.call, runtime, ids, body)
                return await heavy(heavy_kind, target, ticket, work, arguments["wait"])
            with ticket:
                value = await op.call(runtime, ids, body)
            return Response(status_code=204) if op.response is None else value

        handler.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        r.add_api_route(
            op.path, handler, methods=[op.method], name=op.name, status_code=op.status,
            response_model=op.response, summary=op.summary, description=op.description,
            tags=[op.tag], responses=_responses(op),
        )  # fmt: skip

    for op in OPERATIONS:
        route(op)

    # -- commands ----------------------------------------------------------------------

    @r.post(
        "/sessions/{session_id}/exec",
        tags=["commands"],
        summary="Run a command (to completion, or in the background)",
        responses={
            **_STEP,
            200: {
                "links": {
                    "KillProcess": {
                        "operationId": "kill_process",
                        "parameters": {
                            "session_id": "$request.path.session_id",
                            "pid": "$response.body#/pid",
                        },
                    },
                    # In a session keeping history, every command is a step to undo.
                    "Undo": {
                        "operationId": "undo",
                        "parameters": {"session_id": "$request.path.session_id"},
                    },
                }
            },
        },
    )
    async def exec_command(
        session_id: SessionId, body: ExecRequest
    ) -> CommandResult | BackgroundProcess:
        command = body.command if isinstance(body.command, str) else list(body.command)
        if isinstance(body, BackgroundExecRequest):
            return await runtime.spawn(session_id, command, cwd=body.cwd, env=body.env)
        return await runtime.exec(
            session_id, command, cwd=body.cwd, env=body.env, stdin=body.stdin_bytes(),
            timeout=body.timeout, output_encoding=body.output_encoding,
        )  # fmt: skip

    @r.delete("/sessions/{session_id}/processes/{pid}", status_code=204, tags=["commands"])
    async def kill_process(
        session_id: SessionId,
        pid: Annotated[int, PathParam(ge=2, le=1 << 22)],
        signal: Annotated[
            str, Query(pattern=_SIGNAL_PATTERN, description="A signal number or name.")
        ] = "TERM",
    ) -> Response:
        await runtime.kill_process(session_id, pid, int(signal) if signal.isdigit() else signal)
        return Response(status_code=204)

    # -- events as server-sent events ------------------------------------------------------

    @r.get(
        "/events/stream",
        response_class=StreamingResponse,
        responses={200: {"content": {_SSE: {}}, "description": _SSE_EVENTS}},
        tags=["sessions"],
        summary="Follow what happens to sessions (server-sent events)",
    )
    async def stream_events(
        after: Annotated[
            int, Query(ge=0, le=MAX_EVENT_ID, description="Start after this event id.")
        ] = 0,
        session: Annotated[
            str | None, Query(pattern=NAME_PATTERN, description="One session's only.")
        ] = None,
        last_event_id: Annotated[int | None, Header(ge=0, le=MAX_EVENT_ID)] = None,
    ) -> StreamingResponse:
        start = after if last_event_id is None else last_event_id  # a reconnecting browser

        async def stream() -> AsyncIterator[bytes]:
            seen = start
            while True:
                found = await runtime.events(seen, session, wait=_SSE_KEEPALIVE_S, limit=1000)
                for event in found:
                    data = json.dumps(to_json_data(event), separators=(",", ":"))
                    yield f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n".encode()
                    seen = event.id
                if not found:
                    yield b": still here\n\n"  # proxies and clients see the stream alive

        return StreamingResponse(stream(), media_type=_SSE, headers={"Cache-Control": "no-cache"})

    # -- terminals (their output streams: NDJSON) --------------------------------------

    @r.post(
        "/sessions/{session_id}/terminals",
        response_class=StreamingResponse,
        responses={200: {"content": {_NDJSON: {}}, "description": _TERMINAL_EVENTS}},
        tags=["terminals"],
        summary="Open a terminal: a program on a new PTY, its output streamed",
    )
    async def open_terminal(session_id: SessionId, body: TerminalRequest) -> StreamingResponse:
        events = runtime.start_process(
            session_id, body.command[0], body.command[1:], cwd=body.cwd, env=body.env,
            user=body.user, pty=PtySize(body.cols, body.rows),
        )  # fmt: skip
        return await _event_stream(events)

    @r.get(
        "/sessions/{session_id}/terminals/{pid}",
        response_class=StreamingResponse,
        responses={200: {"content": {_NDJSON: {}}, "description": _TERMINAL_EVENTS}},
        tags=["terminals"],
        summary="Connect to a terminal: its output from now on, then its end",
    )
    async def connect_terminal(session_id: SessionId, pid: Pid) -> StreamingResponse:
        return await _event_stream(runtime.attach_process(session_id, pid))

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
        description="Headers `X-Metadata-<key>: <value>` store metadata on the file (keys: "
        "letters, digits, `_.-`, lowercased; values: printable ASCII); listing shows it.",
        responses={**_STEP, 204: {"links": _written_file_links()}},
    )
    async def write_file(
        session_id: SessionId,
        path: GuestPathQuery,
        request: Request,
        mode: Annotated[int, Query(ge=0, le=0o7777, description="Permission bits.")] = 0o644,
    ) -> Response:
        await asyncio.to_thread(runtime.get, session_id)  # 404 before reading a large body
        metadata = {
            name[len(_METADATA_HEADER) :]: value
            for name, value in request.headers.items()
            if name.lower().startswith(_METADATA_HEADER)
        }
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES) as spool:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_upload_bytes:
                    raise BodyTooLarge(max_upload_bytes)
                spool.write(chunk)
            spool.seek(0)
            await runtime.write_file(session_id, path, spool, mode=mode, metadata=metadata)
        return Response(status_code=204)

    @r.delete("/sessions/{session_id}/files", status_code=204, tags=["files"], responses=_STEP)
    async def remove_file(session_id: SessionId, path: RemovablePathQuery) -> Response:
        await runtime.remove_file(session_id, path)
        return Response(status_code=204)

    @r.get("/sessions/{session_id}/files/list", tags=["files"])
    async def list_files(session_id: SessionId, path: GuestPathQuery) -> list[FileEntry]:
        return await runtime.list_files(session_id, path)

    @r.get(
        "/checkpoints",
        tags=["checkpoints"],
        responses={200: {"links": _checkpoint_links("$response.body#/0/id", rollback=False)}},
    )
    async def list_checkpoints(
        session: Annotated[Ref | None, Query(description="Only this session's.")] = None,
    ) -> list[Checkpoint]:
        return await asyncio.to_thread(runtime.list_checkpoints, session)

    # -- operations --------------------------------------------------------------------

    @r.get("/operations", tags=["operations"])
    async def list_operations() -> list[Operation]:
        return operations.list()

    @r.get(
        "/operations/{operation_id}",
        tags=["operations"],
        summary="How a create, fork, checkpoint or rollback answered with 202 is going",
    )
    async def get_operation(
        operation_id: Annotated[str, PathParam(pattern=r"^op-[0-9a-f]{10}$")],
    ) -> Operation:
        return operations.get(operation_id)

    return r


_SESSION_TARGETS = {
    # operation id -> its other parameters (constants a fresh session satisfies)
    "get_session": {},
    "remove_session": {},
    "rollback": {},
    "exec_command": {},
    "processes": {},
    "read_file": {"path": "/etc/hostname"},
    "write_file": {},
    "remove_file": {"path": "/var/tmp"},
    "list_files": {"path": "/"},
    "forward_port": {},
    "checkpoint": {},
    "set_timeout": {},
    "rollback_preview": {},
    "history": {},
    "undo": {},
    "pause": {},
    "resume": {},
    "create_watcher": {},
    "metrics": {},
    "restore_status": {},
    "set_egress": {},
}


Pid = Annotated[int, PathParam(ge=1, le=1 << 22, description="The process id in the guest.")]
WatcherId = Annotated[
    str, PathParam(pattern=r"^w-[0-9a-f]{10}$", description="A watcher of the session.")
]
ImageName = Annotated[
    str, PathParam(pattern=NAME_PATTERN, description="An image's name (every build of it).")
]
VolumeRef = Annotated[str, PathParam(pattern=NAME_PATTERN, description="A volume's id or name.")]
_ID_PARAMS = {
    "session_id": SessionId, "checkpoint_id": CheckpointId, "pid": Pid, "watcher_id": WatcherId,
    "image": ImageName, "volume": VolumeRef,
}  # fmt: skip


_NDJSON = "application/x-ndjson"
_SSE = "text/event-stream"
_SSE_KEEPALIVE_S = 15.0
_SSE_EVENTS = (
    "Each event as `id: <id>`, `event: <kind>`, `data: <the event as JSON>`; a comment every "
    "15 s while nothing happens. Reconnecting with `Last-Event-ID` resumes after it."
)
# A file's metadata: ``X-Metadata-<key>: <value>`` headers of its upload (as envd's).
_METADATA_HEADER = "x-metadata-"
_TERMINAL_EVENTS = (
    'One JSON object per line: {"kind": "start", "pid": N} first, then {"kind": "pty", '
    '"data": <base64>} as the terminal writes, then {"kind": "end", "exit_code": N, '
    '"signal": N|null, "error": str|null}. Hanging up detaches: the program runs on.'
)


async def _event_stream(events: AsyncIterator[ProcessEvent]) -> StreamingResponse:
    """``events`` as NDJSON; its first (the start) is awaited here, so that a missing
    session, program or pid is an error answer, not a broken 200."""
    try:
        first = await anext(events)
    except BaseException:
        await events.aclose()  # type: ignore[attr-defined]
        raise

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield _event_line(first)
            async for event in events:
                yield _event_line(event)
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(lines(), media_type=_NDJSON)


def _event_line(event: ProcessEvent) -> bytes:
    line: dict[str, Any] = {"kind": event.kind, "pid": event.pid}
    if event.kind == "end":
        line |= {"exit_code": event.exit_code, "signal": event.signal, "error": event.error}
    elif event.kind != "start":
        line["data"] = base64.b64encode(event.data).decode("ascii")
    return json.dumps(line).encode() + b"\n"


def _all_defaults(model: type[BaseModel]) -> bool:
    """Whether every field of ``model`` has a default (its body may then be left out)."""
    return all(not field.is_required() for field in model.model_fields.values())


def _keyword(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> Any:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


def _responses(op: Op) -> dict[int | str, dict[str, Any]]:
    """The answers ``op`` documents beyond its success: 202/429 of a heavy one, 429 of one
    that boots scratch forks or is a history step, and its success's OpenAPI links."""
    out: dict[int | str, dict[str, Any]] = {}
    if op.cost is not None:
        out.update(_HEAVY if op.cost.kind is not None else {429: _HEAVY[429]})
    if op.step:
        out.update(_STEP)
    links = _links_of(op.name)
    if links:
        out[op.status] = {"links": links}
    return out


def _links_of(name: str) -> dict[str, Any]:
    """The OpenAPI links of an operation's success (what tells a client, and a stateful
    fuzzer, where the ids it answers go)."""
    if name in ("create_session", "rollback", "undo", "pause", "resume"):
        return _session_links("$response.body#/id")
    if name in ("list_sessions", "fork"):
        return _session_links("$response.body#/0/id")
    if name == "checkpoint":
        return _checkpoint_links()
    if name == "push_checkpoint":
        return _pull_links()
    if name in ("create_volume", "get_volume"):
        return _volume_links("$response.body#/id")
    if name == "list_volumes":
        return _volume_links("$response.body#/0/id")
    if name in ("write_volume_file", "volume_make_dir"):
        return _volume_path_links(directory=name == "volume_make_dir")
    if name == "create_watcher":
        return {
            _link_name(target): {
                "operationId": target,
                "parameters": {
                    "session_id": "$request.path.session_id",
                    "watcher_id": "$response.body#/id",
                },
            }
            for target in ("watcher_events", "remove_watcher")
        }
    return {}


def _session_links(session_id: str) -> dict[str, Any]:
    """OpenAPI links from a response carrying a session's id to every operation on it:
    what tells a client (and a stateful fuzzer) where the id goes."""
    links: dict[str, Any] = {
        _link_name(target): {
            "operationId": target,
            "parameters": {"session_id": session_id, **extra},
        }
        for target, extra in _SESSION_TARGETS.items()
    }
    links["CreateWatcher"]["requestBody"] = {"path": "/tmp"}  # a directory every guest has
    links["ListCheckpoints"] = {
        "operationId": "list_checkpoints",
        "parameters": {"session": session_id},
    }
    # A background process to signal (exec's answer links its pid to kill_process).
    links["StartBackground"] = {
        "operationId": "exec_command",
        "parameters": {"session_id": session_id},
        "requestBody": {"command": ["sleep", "600"], "background": True},
        "x-schemathesis": {"merge_body": False},
    }
    return links


def _checkpoint_links(
    checkpoint_id: str = "$response.body#/id", *, rollback: bool = True
) -> dict[str, Any]:
    """Links from a checkpoint's id to the operations on it (and, from the request that
    made it, to pushing it, rolling its session back to it, previewing that, and diffing
    since)."""
    links: dict[str, Any] = {
        _link_name(target): {"operationId": target, "parameters": {"checkpoint_id": checkpoint_id}}
        for target in ("get_checkpoint", "remove_checkpoint", "fork", "verify_checkpoint")
    }
    links["Fork"]["requestBody"] = {"count": 1}
    if not rollback:
        return links
    # From the request that made it only: each link takes a share of a fuzzer's turns.
    links["PushCheckpoint"] = {
        "operationId": "push_checkpoint",
        "parameters": {"checkpoint_id": checkpoint_id},
    }
    links["RollbackTo"] = {
        "operationId": "rollback",
        "parameters": {"session_id": "$request.path.session_id"},
        "requestBody": {"checkpoint": checkpoint_id},
    }
    links["PreviewRollbackTo"] = {**links["RollbackTo"], "operationId": "rollback_preview"}
    links["DiffSince"] = {
        "operationId": "diff",
        "requestBody": {"a": checkpoint_id, "b": "$request.path.session_id"},
    }
    return links


def _volume_links(volume: str) -> dict[str, Any]:
    """From a volume's id to the operations on it (a file and a directory to start with)."""
    links: dict[str, Any] = {
        _link_name(target): {"operationId": target, "parameters": {"volume": volume}}
        for target in ("get_volume", "remove_volume", "volume_entries", "volume_stat")
    }
    links["VolumeEntries"]["parameters"]["path"] = "/"
    links["VolumeStat"]["parameters"]["path"] = "/"
    links["WriteVolumeFile"] = {
        "operationId": "write_volume_file", "parameters": {"volume": volume},
        "requestBody": {"path": "/notes.txt", "data": "aGk=", "force": True},
    }  # fmt: skip
    links["VolumeMakeDir"] = {
        "operationId": "volume_make_dir", "parameters": {"volume": volume},
        "requestBody": {"path": "/docs", "force": True},
    }  # fmt: skip
    return links


def _volume_path_links(*, directory: bool) -> dict[str, Any]:
    """From a volume path just made to the operations on it."""
    where = {"volume": "$request.path.volume", "path": "$response.body#/path"}
    targets = ["volume_stat", "volume_set_metadata", "volume_remove"]
    targets.append("volume_entries" if directory else "read_volume_file")
    links: dict[str, Any] = {}
    for target in targets:
        link: dict[str, Any] = {"operationId": target, "parameters": {"volume": where["volume"]}}
        if target in ("volume_set_metadata", "volume_remove"):  # their path is in the body
            link["requestBody"] = {"path": where["path"]}
        else:
            link["parameters"]["path"] = where["path"]
        links[_link_name(target)] = link
    return links


def _pull_links() -> dict[str, Any]:
    """From a push to pulling what it pushed (by digest, from where it went)."""
    body = {"ref": "$response.body#/digest", "from": "$response.body#/location"}
    return {"PullCheckpoint": {"operationId": "pull_checkpoint", "requestBody": body}}


def _written_file_links() -> dict[str, Any]:
    where = {"session_id": "$request.path.session_id", "path": "$request.query.path"}
    return {
        _link_name(target): {"operationId": target, "parameters": where}
        for target in ("read_file", "remove_file")
    }


def _link_name(operation_id: str) -> str:
    return "".join(part.capitalize() for part in operation_id.split("_"))


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route serves at the request's path."""
    return [
        method
        for method in _METHODS
        if any(route.matches({**scope, "method": method})[0] == Match.FULL for route in app.routes)
    ]


async def _drain(spool: IO[bytes]) -> AsyncIterator[bytes]:
    try:
        while chunk := spool.read(_CHUNK):
            yield chunk
    finally:
        spool.close()
