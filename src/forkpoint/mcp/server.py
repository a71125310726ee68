"""forkpoint's tools for agents, over MCP (stdio): thin calls into the runtime.

Each tool is one runtime call returning the same :mod:`forkpoint.models` values as the
CLI and REST (lists wrapped in an object: MCP's structured output is one). A
:class:`~forkpoint.errors.ForkpointError` becomes a tool error whose text starts with
its code (``not_found: unknown session: s-…``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from forkpoint import __version__
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
from forkpoint.requests import Cidr, Cpus, ForkCount, GuestPort, MemoryMiB, Name, TimeoutS
from forkpoint.runtime import Runtime

__all__ = ["TOOL_NAMES", "build_server", "run_stdio"]

P = ParamSpec("P")
R = TypeVar("R")

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
    import functools

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except ForkpointError as error:
            raise ToolError(f"{error.code}: {error.message}") from error

    return wrapper


def build_server(runtime: Runtime) -> MCPServer:
    """An MCP server whose tools act on ``runtime``."""
    server: MCPServer = MCPServer(
        "forkpoint", version=__version__, instructions=_INSTRUCTIONS, log_level="WARNING"
    )

    @_tool_errors
    async def create_session(
        image: Name = "default",
        memory_mib: MemoryMiB = 512,
        cpus: Cpus = 1,
        name: Name | None = None,
        ports: list[GuestPort] | None = None,
        allow_net: list[Cidr] | None = None,
        deny_net: list[Cidr] | None = None,
        timeout_s: TimeoutS | None = None,
        history: bool = False,
    ) -> Session:
        """Create a session (a microVM) from an image; ``ports`` are guest ports to forward
        to the host's 127.0.0.1. The guest reaches the internet but not the host, private
        or link-local addresses; ``allow_net``/``deny_net`` (CIDRs) adjust that.
        ``timeout_s``: seconds until it is removed. ``history``: checkpoint automatically
        before every exec and file write, so `undo` can take steps back. Returns the
        session (id, ports with URLs, ...)."""
        return await runtime.create(
            image=image, memory_mib=memory_mib, cpus=cpus, name=name, ports=ports or (),
            allow_net=allow_net or (), deny_net=deny_net or (), timeout_s=timeout_s,
            history=history,
        )  # fmt: skip

    @_tool_errors
    async def exec(
        session: str,
        command: str | list[str],
        cwd: str | None = None,
        timeout: Annotated[float, Field(gt=0, le=86400)] | None = None,
        background: bool = False,
    ) -> CommandResult | BackgroundProcess:
        """Run a command in a session: a shell string or an argv list. Waits and returns
        exit_code/stdout/stderr, or with background=true starts it detached (a server)
        and returns its pid and log file."""
        if background:
            return await runtime.spawn(session, command, cwd=cwd)
        return await runtime.exec(session, command, cwd=cwd, timeout=timeout)

    @_tool_errors
    async def read_file(
        session: str, path: str, encoding: Literal["text", "base64"] = "text"
    ) -> dict[str, Any]:
        """Read a file from a session (UTF-8 text, or base64 for binary files)."""
        data = await runtime.read_file(session, path)
        content = base64.b64encode(data).decode() if encoding == "base64" else data.decode()
        return {"path": path, "size": len(data), "encoding": encoding, "content": content}

    @_tool_errors
    async def write_file(
        session: str, path: str, content: str, encoding: Literal["text", "base64"] = "text"
    ) -> dict[str, Any]:
        """Write a file in a session (parent directories are created)."""
        try:
            data = base64.b64decode(content, validate=True) if encoding == "base64" else None
        except binascii.Error as error:
            raise InvalidInput("content is not valid base64") from error
        payload = data if data is not None else content.encode()
        await runtime.write_file(session, path, payload)
        return {"path": path, "size": len(payload)}

    @_tool_errors
    async def forward_port(session: str, guest_port: GuestPort) -> Port:
        """Forward a guest port to http://127.0.0.1:<host_port> on the host."""
        return await runtime.forward_port(session, guest_port)

    @_tool_errors
    async def checkpoint(session: str, name: Name | None = None) -> Checkpoint:
        """Checkpoint a running session: memory, disk and every live process."""
        return await runtime.checkpoint(session, name)

    @_tool_errors
    async def fork(
        checkpoint: str, count: ForkCount = 1
    ) -> dict[str, list[Session | ErrorResponse]]:
        """Start ``count`` new sessions from a checkpoint; each wakes up with the same
        processes running. A failed fork is reported as an error in its slot."""
        results = await runtime.fork(checkpoint, count)
        return {
            "sessions": [
                ErrorResponse.of(r) if isinstance(r, ForkpointError) else r for r in results
            ]
        }

    @_tool_errors
    async def rollback(
        session: str, checkpoint: str | None = None, dry_run: bool = False
    ) -> Session | StateDiff:
        """Reset a session (same id and ports) to a checkpoint (default: its latest).
        dry_run=true changes nothing and returns what the rollback would undo: files
        added/removed/modified, processes started/gone, listening ports opened/closed."""
        if dry_run:
            return await runtime.rollback_preview(session, checkpoint)
        return await runtime.rollback(session, checkpoint)

    @_tool_errors
    async def diff(
        a: str, b: str | None = None, patch: bool = False, include_tmp: bool = False
    ) -> StateDiff:
        """What changed between two checkpoints or sessions: files added/removed/modified
        (path, size, mode; with patch=true a unified diff of small text files), processes
        started/gone (pid, command) and listening ports opened/closed. Only a: a session is
        compared with its latest checkpoint (what a rollback would undo), a checkpoint with
        its session now. /proc, /sys, /dev, /run, /tmp and /etc/hostname are left out."""
        return await runtime.diff(a, b, patch=patch, include_tmp=include_tmp)

    @_tool_errors
    async def history(session: str) -> dict[str, list[HistoryStep]]:
        """The steps of a session created with history=true, oldest first: for each, the
        checkpoint taken just before it, its label (the command, or the path written), its
        time, the disk space it costs and the forks started from it."""
        return {"steps": await asyncio.to_thread(runtime.history, session)}

    @_tool_errors
    async def undo(session: str, steps: Annotated[int, Field(ge=1, le=1000)] = 1) -> Session:
        """Undo the last step(s) of a session created with history=true: roll it back to
        the checkpoint taken before them, including processes they killed or started and
        files they wrote or deleted. steps=2 undoes the last two commands/writes."""
        return await runtime.undo(session, steps)

    @_tool_errors
    async def list_sessions() -> dict[str, list[Session]]:
        """Every session with its state and forwarded ports."""
        return {"sessions": await asyncio.to_thread(runtime.list_sessions)}

    @_tool_errors
    async def push_checkpoint(checkpoint: str, to: str) -> CheckpointTransfer:
        """Upload a checkpoint to s3://BUCKET/PREFIX (only what the bucket lacks of its
        lineage); its id and name become refs to its content digest. Endpoint and
        credentials: forkpoint's own AWS variables."""
        return await runtime.push_checkpoint(checkpoint, to)

    @_tool_errors
    async def pull_checkpoint(ref: str, source: str) -> CheckpointTransfer:
        """Download checkpoint ``ref`` (sha256:<digest>, or the id or name it was pushed
        under) from s3://BUCKET/PREFIX ``source``, verified; then fork it. Refused if this
        host cannot restore it."""
        return await runtime.pull_checkpoint(ref, source)

    @_tool_errors
    async def remove_session(session: str) -> dict[str, Any]:
        """Destroy a session (its VM and files). Its checkpoints stay."""
        await runtime.remove(session)
        return {"removed": session}

    for fn in (
        create_session, exec, read_file, write_file, forward_port, checkpoint, fork,
        rollback, list_sessions, remove_session, diff, history, undo, push_checkpoint,
        pull_checkpoint,
    ):  # fmt: skip
        server.add_tool(fn)
    return server


def run_stdio(runtime: Runtime | None = None) -> None:
    """Serve the tools on stdin/stdout until the client disconnects."""
    rt = runtime or Runtime.open()
    try:
        build_server(rt).run("stdio")
    finally:
        if runtime is None:
            rt.close()
