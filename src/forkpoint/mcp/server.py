"""forkpoint's tools for agents, over MCP (stdio): thin calls into the runtime.

A tool's parameters are the fields of the REST request model it shares
(:mod:`forkpoint.requests`): the same names, limits, strictness and defaults, declared
once. Each tool is one runtime call returning the same :mod:`forkpoint.models` values as
the CLI and REST (lists wrapped in an object: MCP's structured output is one). A
:class:`~forkpoint.errors.ForkpointError` becomes a tool error whose text starts with
its code (``not_found: unknown session: s-…``). Heavy tools are admitted by the
runtime's policy, as REST's calls are (``FORKPOINT_API_MAX_SESSIONS``/``_MAX_HEAVY``):
past a limit the tool error reads ``busy: …``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Collection
from typing import Annotated, Any, Literal, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from forkpoint import __version__
from forkpoint.api import OPERATIONS, Op, admit, operation
from forkpoint.config import ApiLimits
from forkpoint.errors import ForkpointError, InvalidInput
from forkpoint.models import (
    BackgroundProcess,
    CommandResult,
    Session,
    StateDiff,
)
from forkpoint.requests import (
    Flag,
    ForegroundExecRequest,
    GuestPath,
    RollbackPreviewRequest,
    RollbackRequest,
    parse,
)
from forkpoint.runtime import Runtime
from forkpoint.runtime.housekeeping.reaper import reaping

__all__ = ["TOOL_NAMES", "build_server", "run_stdio"]

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=BaseModel)

# The tools wired here by hand; the rest are the operations the table marks ``mcp``.
_BY_HAND = ("exec", "read_file", "write_file", "rollback", "remove_session")
TOOL_NAMES = (*_BY_HAND, *(op.name for op in OPERATIONS if op.mcp))
_INSTRUCTIONS = (
    "forkpoint runs each session as a microVM that can be checkpointed, forked and rolled "
    "back in milliseconds. Create a session, run commands and edit files in it, forward a "
    "guest port to look at a web app, checkpoint before risky steps, fork to try "
    "alternatives in parallel, roll back to undo everything (processes included). Create "
    "with history=true to get a checkpoint before every command and file write: `history` "
    "lists the steps, `undo` takes back the last ones, `diff` (or rollback with "
    "dry_run=true) shows what changed."
)


def _tool_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except ForkpointError as error:
            raise ToolError(f"{error.code}: {error.message}") from error

    return wrapper


def _param(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


def _fields_of(model: type[BaseModel], *, without: Collection[str] = ()) -> list[inspect.Parameter]:
    """A request model's fields as tool parameters: the same types, limits, strictness and
    defaults as the REST body (the model is the one declaration of them)."""
    params = []
    for name, field in model.model_fields.items():
        if name in without:
            continue
        rule = copy.copy(field)  # its limits and description, without the default
        rule.default, rule.default_factory = PydanticUndefined, None
        default = field.get_default(call_default_factory=True)
        params.append(_param(name, Annotated[field.annotation, rule], default))
    return params


def _with_request(
    model: type[M], *leading: inspect.Parameter, without: Collection[str] = ()
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """A tool taking ``leading`` parameters, then ``model``'s fields; ``fn`` receives the
    leading ones by name and the rest parsed into ``request`` (``without``: fields the tool
    leaves at their default)."""

    def decorate(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        names = {p.name for p in leading}

        @functools.wraps(fn)
        async def tool(**arguments: Any) -> R:
            first = {name: arguments.pop(name) for name in names}
            return await fn(**first, request=parse(model, **arguments))

        returns = typing.get_type_hints(fn)["return"]
        fields = _fields_of(model, without=without)
        tool.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*leading, *fields], return_annotation=returns
        )
        return tool

    return decorate


_SESSION = _param("session", str)
_CHECKPOINT = _param("checkpoint", str)
# A path id's name as a tool parameter.
_ID_NAMES = {
    "session_id": _SESSION, "checkpoint_id": _CHECKPOINT, "watcher_id": _param("watcher", str),
    "image": _param("image", str), "volume": _param("volume", str),
}  # fmt: skip
# A list answer goes into an object (MCP's structured output is one), under this key.
_LIST_KEYS = {"verify_checkpoint": "files", "history": "steps", "watcher_events": "events"}


async def _run(op: Op, runtime: Runtime, ids: dict[str, str], request: Any) -> Any:
    """``op`` once admitted, as every door runs it."""
    ticket, _ = await admit(op, runtime.admission, ids, request)
    with ticket:
        return await op.call(runtime, ids, request)


def _derived(op: Op, runtime: Runtime) -> Callable[..., Awaitable[Any]]:
    """The tool of a declared operation: its ids (``session``, ``checkpoint``), then its
    request's fields; admitted as every door admits it."""
    leading = [_ID_NAMES[name] for name in op.ids]
    listed = typing.get_origin(op.response) is list
    key = _LIST_KEYS.get(op.name, "sessions")

    async def call(**arguments: Any) -> Any:
        ids = {name: arguments.pop(_ID_NAMES[name].name) for name in op.ids}
        request = parse(op.request, **arguments) if op.request is not None else None
        value = await _run(op, runtime, ids, request)
        return {key: value} if listed else value

    returns = dict[str, op.response] if listed else op.response  # type: ignore[name-defined]
    fields = _fields_of(op.request) if op.request is not None else []
    call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*leading, *fields], return_annotation=returns
    )
    call.__name__ = op.name
    call.__doc__ = op.description or op.summary
    return call


def build_server(runtime: Runtime) -> MCPServer:
    """An MCP server whose tools act on ``runtime``."""
    server: MCPServer = MCPServer(
        "forkpoint", version=__version__, instructions=_INSTRUCTIONS, log_level="WARNING",
        lifespan=lambda _: reaping(runtime),  # lifetimes end while a client is connected
    )  # fmt: skip

    @_with_request(
        ForegroundExecRequest, _SESSION, _param("background", Flag, False), without={"background"}
    )
    async def exec(
        session: str, background: bool, request: ForegroundExecRequest
    ) -> CommandResult | BackgroundProcess:
        """Run a command in a session: a shell string or an argv list. Waits and returns
        exit_code/stdout/stderr, or with background=true starts it detached (a server)
        and returns its pid and log file."""
        command = request.command if isinstance(request.command, str) else list(request.command)
        if background:
            if request.stdin is not None or request.timeout is not None:
                raise InvalidInput("a background command takes no stdin and no timeout")
            return await runtime.spawn(session, command, cwd=request.cwd, env=request.env)
        return await runtime.exec(
            session, command, cwd=request.cwd, env=request.env, stdin=request.stdin_bytes(),
            timeout=request.timeout, output_encoding=request.output_encoding,
        )  # fmt: skip

    async def read_file(
        session: str, path: GuestPath, encoding: Literal["text", "base64"] = "text"
    ) -> dict[str, Any]:
        """Read a file from a session (UTF-8 text, or base64 for binary files)."""
        data = await runtime.read_file(session, path)
        content = base64.b64encode(data).decode() if encoding == "base64" else data.decode()
        return {"path": path, "size": len(data), "encoding": encoding, "content": content}

    async def write_file(
        session: str, path: GuestPath, content: str, encoding: Literal["text", "base64"] = "text"
    ) -> dict[str, Any]:
        """Write a file in a session (parent directories are created)."""
        try:
            data = base64.b64decode(content, validate=True) if encoding == "base64" else None
        except binascii.Error as error:
            raise InvalidInput("content is not valid base64") from error
        payload = data if data is not None else content.encode()
        await runtime.write_file(session, path, payload)
        return {"path": path, "size": len(payload)}

    @_with_request(RollbackPreviewRequest, _SESSION, _param("dry_run", Flag, False))
    async def rollback(
        session: str, dry_run: bool, request: RollbackPreviewRequest
    ) -> Session | StateDiff:
        """Reset a session (same id and ports) to a checkpoint (default: its latest).
        dry_run=true changes nothing and returns what the rollback would undo: files
        added/removed/modified (patch=true: with unified diffs of small text files),
        processes started/gone, listening ports opened/closed."""
        if request.patch and not dry_run:
            raise InvalidInput("patch is for dry_run=true")
        ids = {"session_id": session}
        if dry_run:
            preview: StateDiff = await _run(operation("rollback_preview"), runtime, ids, request)
            return preview
        back = RollbackRequest(checkpoint=request.checkpoint)
        rolled: Session = await _run(operation("rollback"), runtime, ids, back)
        return rolled

    async def remove_session(session: str) -> dict[str, Any]:
        """Destroy a session (its VM and files). Its checkpoints stay."""
        await runtime.remove(session)
        return {"removed": session}

    for fn in (exec, read_file, write_file, rollback, remove_session):
        server.add_tool(_tool_errors(fn))
    for op in OPERATIONS:
        if op.mcp:
            server.add_tool(_tool_errors(_derived(op, runtime)), name=op.name)
    return server


def run_stdio(runtime: Runtime | None = None) -> None:
    """Serve the tools on stdin/stdout until the client disconnects."""
    rt = runtime or Runtime.open()
    try:
        try:
            rt.serve_long_lived(ApiLimits.from_env())
        except ValueError as error:
            raise InvalidInput(str(error)) from None
        build_server(rt).run("stdio")
    finally:
        if runtime is None:
            rt.close()
