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

import asyncio
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
from forkpoint.config import ApiLimits
from forkpoint.errors import ForkpointError, InvalidInput
from forkpoint.models import (
    BackgroundProcess,
    Checkpoint,
    CheckpointTransfer,
    CommandResult,
    ErrorResponse,
    HistoryStep,
    Port,
    Session,
    StateDiff,
)
from forkpoint.requests import (
    CheckpointRequest,
    CreateSessionRequest,
    DiffRequest,
    Flag,
    ForegroundExecRequest,
    ForkRequest,
    GuestPath,
    PortRequest,
    PullRequest,
    PushRequest,
    RollbackPreviewRequest,
    UndoRequest,
    parse,
)
from forkpoint.runtime import Runtime

__all__ = ["TOOL_NAMES", "build_server", "run_stdio"]

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=BaseModel)

TOOL_NAMES = (
    "create_session",
    "exec",
    "read_file",
    "write_file",
    "forward_port",
    "checkpoint",
    "fork",
    "rollback",
    "list_sessions",
    "remove_session",
    "diff",
    "history",
    "undo",
    "push_checkpoint",
    "pull_checkpoint",
)
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


def build_server(runtime: Runtime) -> MCPServer:
    """An MCP server whose tools act on ``runtime``."""
    server: MCPServer = MCPServer(
        "forkpoint", version=__version__, instructions=_INSTRUCTIONS, log_level="WARNING"
    )

    @_with_request(CreateSessionRequest)
    async def create_session(request: CreateSessionRequest) -> Session:
        """Create a session (a microVM) from an image; ``ports`` are guest ports to forward
        to the host's 127.0.0.1. The guest reaches the internet but not the host, private
        or link-local addresses; ``allow_net``/``deny_net`` (CIDRs) adjust that.
        ``timeout_s``: seconds until it is removed. ``disk_mib``: its virtual disk's size.
        ``history``: checkpoint automatically before every exec and file write, so `undo`
        can take steps back (``history_keep`` of them). Returns the session (id, ports with
        URLs, ...)."""
        with await runtime.admission.create():
            return await runtime.create(**request.model_dump())

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

    @_with_request(PortRequest, _SESSION)
    async def forward_port(session: str, request: PortRequest) -> Port:
        """Forward a guest port to http://127.0.0.1:<host_port> on the host."""
        return await runtime.forward_port(session, request.guest_port)

    @_with_request(CheckpointRequest, _SESSION)
    async def checkpoint(session: str, request: CheckpointRequest) -> Checkpoint:
        """Checkpoint a running session: memory, disk and every live process."""
        ticket, _ = await runtime.admission.checkpoint(session)
        with ticket:
            return await runtime.checkpoint(session, request.name)

    @_with_request(ForkRequest, _CHECKPOINT)
    async def fork(
        checkpoint: str, request: ForkRequest
    ) -> dict[str, list[Session | ErrorResponse]]:
        """Start ``count`` new sessions from a checkpoint; each wakes up with the same
        processes running. A failed fork is reported as an error in its slot."""
        ticket, _ = await runtime.admission.fork(checkpoint, request.count)
        with ticket:
            results = await runtime.fork(checkpoint, request.count)
        return {
            "sessions": [
                ErrorResponse.of(r) if isinstance(r, ForkpointError) else r for r in results
            ]
        }

    @_with_request(RollbackPreviewRequest, _SESSION, _param("dry_run", Flag, False))
    async def rollback(
        session: str, dry_run: bool, request: RollbackPreviewRequest
    ) -> Session | StateDiff:
        """Reset a session (same id and ports) to a checkpoint (default: its latest).
        dry_run=true changes nothing and returns what the rollback would undo: files
        added/removed/modified (patch=true: with unified diffs of small text files),
        processes started/gone, listening ports opened/closed."""
        if dry_run:
            await asyncio.to_thread(runtime.get, session)  # unknown: NotFound, not Busy
            with await runtime.admission.scratch(1):
                return await runtime.rollback_preview(
                    session, request.checkpoint, patch=request.patch
                )
        if request.patch:
            raise InvalidInput("patch is for dry_run=true")
        ticket, _ = await runtime.admission.rollback(session)
        with ticket:
            return await runtime.rollback(session, request.checkpoint)

    @_with_request(DiffRequest)
    async def diff(request: DiffRequest) -> StateDiff:
        """What changed between two checkpoints or sessions: files added/removed/modified
        (path, size, mode; with patch=true a unified diff of small text files), processes
        started/gone (pid, command) and listening ports opened/closed. Only a: a session is
        compared with its latest checkpoint (what a rollback would undo), a checkpoint with
        its session now. /proc, /sys, /dev, /run, /tmp and /etc/hostname are left out."""
        forks = await asyncio.to_thread(runtime.diff_forks, request.a, request.b)
        with await runtime.admission.scratch(forks):
            return await runtime.diff(
                request.a, request.b, patch=request.patch, include_tmp=request.include_tmp,
                exclude=request.exclude,
            )  # fmt: skip

    async def history(session: str) -> dict[str, list[HistoryStep]]:
        """The steps of a session created with history=true, oldest first: for each, the
        checkpoint taken just before it, its label (the command, or the path written), its
        time, the disk space it costs and the forks started from it."""
        return {"steps": await asyncio.to_thread(runtime.history, session)}

    @_with_request(UndoRequest, _SESSION)
    async def undo(session: str, request: UndoRequest) -> Session:
        """Undo the last step(s) of a session created with history=true: roll it back to
        the checkpoint taken before them, including processes they killed or started and
        files they wrote or deleted. steps=2 undoes the last two commands/writes."""
        ticket, _ = await runtime.admission.rollback(session)
        with ticket:
            return await runtime.undo(session, request.steps)

    async def list_sessions() -> dict[str, list[Session]]:
        """Every session with its state and forwarded ports."""
        return {"sessions": await asyncio.to_thread(runtime.list_sessions)}

    @_with_request(PushRequest, _CHECKPOINT)
    async def push_checkpoint(checkpoint: str, request: PushRequest) -> CheckpointTransfer:
        """Upload a checkpoint to s3://BUCKET/PREFIX (only what the bucket lacks of its
        lineage); its id and name become refs to its content digest. Endpoint and
        credentials: forkpoint's own AWS variables."""
        return await runtime.push_checkpoint(checkpoint, request.to)

    @_with_request(PullRequest)
    async def pull_checkpoint(request: PullRequest) -> CheckpointTransfer:
        """Download checkpoint ``ref`` (sha256:<digest>, or the id or name it was pushed
        under) from s3://BUCKET/PREFIX ``from``, verified; then fork it. Refused if this
        host cannot restore it."""
        return await runtime.pull_checkpoint(request.ref, request.source)

    async def remove_session(session: str) -> dict[str, Any]:
        """Destroy a session (its VM and files). Its checkpoints stay."""
        await runtime.remove(session)
        return {"removed": session}

    for fn in (
        create_session, exec, read_file, write_file, forward_port, checkpoint, fork,
        rollback, list_sessions, remove_session, diff, history, undo, push_checkpoint,
        pull_checkpoint,
    ):  # fmt: skip
        server.add_tool(_tool_errors(fn))
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
