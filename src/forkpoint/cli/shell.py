"""``forkpoint shell``: an interactive terminal into a session.

The program (default: a login shell) runs in the guest on a pseudo-terminal the agent
owns, sized like the local terminal; the local terminal goes raw, its keystrokes are typed
into the guest's, the guest's output is written out as it comes, and a local resize is
passed on (SIGWINCH). The program belongs to the guest: it survives checkpoints, forks
and rollbacks at the same PID. forkpoint exits with its exit code.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from forkpoint.cli._run import run
from forkpoint.cli.output import reports_errors
from forkpoint.errors import InvalidInput
from forkpoint.models import PtySize
from forkpoint.requests import DEFAULT_TERMINAL_COMMAND

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = ["register"]

_READ_BYTES = 4096


def register(app: typer.Typer) -> None:
    app.command("shell")(shell_command)


@reports_errors
def shell_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The program and its arguments (after `--`; default: a login shell)."),
    ] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Guest user.")] = None,
    cwd: Annotated[str | None, typer.Option("--cwd", help="Working directory.")] = None,
) -> None:
    """An interactive terminal into a session (your terminal's size, resized with it).

    forkpoint shell SESSION [-- PROGRAM ARGS...]; exit the program to leave.
    """
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InvalidInput(
            "forkpoint shell needs a terminal on stdin and stdout; use forkpoint exec instead"
        )
    argv = command or list(DEFAULT_TERMINAL_COMMAND)

    async def op(runtime: Runtime) -> int:
        return await _interact(runtime, session, argv, user=user, cwd=cwd)

    with _raw(sys.stdin.fileno()):
        code = run(op)
    raise typer.Exit(code)


def _local_size() -> PtySize:
    size = shutil.get_terminal_size()
    return PtySize(max(size.columns, 1), max(size.lines, 1))


async def _interact(
    runtime: Runtime, session: str, argv: list[str], *, user: str | None, cwd: str | None
) -> int:
    events = runtime.start_process(
        session, argv[0], argv[1:], user=user, cwd=cwd, env={"TERM": _term()},
        pty=_local_size(),
    )  # fmt: skip
    start = await anext(events)  # a missing session, program or user raises here
    pid = start.pid
    loop = asyncio.get_running_loop()
    typed: asyncio.Queue[bytes] = asyncio.Queue()
    stdin = sys.stdin.fileno()

    def on_key() -> None:
        data = os.read(stdin, _READ_BYTES)
        typed.put_nowait(data)

    async def type_keys() -> None:
        while data := await typed.get():
            await runtime.send_stdin(session, pid, data)

    def on_resize() -> None:
        loop.create_task(runtime.resize_process(session, pid, _local_size()))

    loop.add_reader(stdin, on_key)
    loop.add_signal_handler(signal.SIGWINCH, on_resize)
    typing = loop.create_task(type_keys())
    out = sys.stdout.buffer
    exit_code = 0
    try:
        async for event in events:
            if event.kind == "end":
                exit_code = event.exit_code or 0
                break
            out.write(event.data)
            out.flush()
    finally:
        loop.remove_reader(stdin)
        loop.remove_signal_handler(signal.SIGWINCH)
        typing.cancel()
        await events.aclose()  # type: ignore[attr-defined]
    return exit_code


def _term() -> str:
    return os.environ.get("TERM") or "xterm-256color"


@contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The local terminal in raw mode (every key goes to the guest's, ^C included),
    restored however this ends."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
