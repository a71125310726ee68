"""``forkpoint exec | ps | restore-status | files read|write|ls|rm``: working inside a
running session."""

from __future__ import annotations

import stat
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from forkpoint.cli import core
from forkpoint.cli._run import Timer, format_ms, print_table, run
from forkpoint.cli.output import JSON_OPTION, console, emit_json, err_console, reports_errors

if TYPE_CHECKING:
    from forkpoint.models import FileEntry, GuestRestore, Process
    from forkpoint.runtime import Runtime

__all__ = ["register"]

# DirEntry.mode holds permission bits only; the type comes as a word.
_TYPE_BITS = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}
SESSION_ARG = typer.Argument(help="Session id or name.")
PATH_ARG = typer.Argument(help="Absolute path inside the guest.")


def register(app: typer.Typer) -> None:
    app.command("exec")(exec_command)
    app.command("ps")(ps_command)
    app.command("restore-status")(restore_status_command)
    files_app = typer.Typer(
        help="Read, write, list and remove files inside a session.", no_args_is_help=True
    )
    files_app.command("read")(files_read)
    files_app.command("write")(files_write)
    files_app.command("ls")(files_ls)
    files_app.command("rm")(files_rm)
    app.add_typer(files_app, name="files")


@reports_errors
def exec_command(
    session: Annotated[str, SESSION_ARG],
    command: Annotated[
        list[str], typer.Argument(help="The command and its arguments (after `--`).")
    ],
    background: Annotated[
        bool,
        typer.Option(
            "--background", "-b", help="Start detached; print its pid and log file, don't wait."
        ),
    ] = False,
    cwd: Annotated[
        str | None, typer.Option("--cwd", help="Working directory in the guest.")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE (repeatable).")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Kill the command after this many seconds.")
    ] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a command in a session: forkpoint exec SESSION [OPTIONS] -- CMD ARGS...

    Its stdout and stderr stream live to yours and forkpoint exits with its exit code.
    With --json the output is collected into {exit_code, stdout, stderr, duration_ms}.
    """
    code = core.exec_command(
        session, command, background=background, cwd=cwd, env_pairs=env or [],
        timeout=timeout, as_json=as_json,
    )  # fmt: skip
    raise typer.Exit(code)


@reports_errors
def ps_command(session: Annotated[str, SESSION_ARG], as_json: bool = JSON_OPTION) -> None:
    """List the processes in a session (kernel threads left out)."""

    async def op(runtime: Runtime) -> list[Process]:
        return await runtime.ps(session)

    processes = run(op)
    if as_json:
        emit_json(processes)
        return
    table = Table(box=None, header_style="bold")
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("PPID", justify="right", no_wrap=True)
    table.add_column("CMD")
    for p in processes:
        table.add_row(str(p.pid), str(p.ppid), escape(p.cmd))
    print_table(table)


@reports_errors
def restore_status_command(
    session: Annotated[str, SESSION_ARG], as_json: bool = JSON_OPTION
) -> None:
    """What the guest made of its latest restore (create, fork, rollback, resume): its
    generation, the processes it signalled (registered under /run/forkpoint/notify) and
    each /etc/forkpoint/restore.d hook's result. See docs/guest.md."""

    async def op(runtime: Runtime) -> GuestRestore:
        return await runtime.restore_status(session)

    status = run(op)
    if as_json:
        emit_json(status)
        return
    if status.generation == 0:
        console.print("not restored since it booted (generation 0)")
        return
    console.print(
        f"generation {status.generation}: {status.event} from {status.checkpoint} "
        f"at {status.at}; signalled {len(status.notified)} process(es)"
        f"{' ' + ', '.join(map(str, status.notified)) if status.notified else ''}; "
        f"{status.listeners} registered now"
    )
    for hook in status.hook_runs:
        result = (
            "killed at its time limit" if hook.timed_out else hook.error or f"exit {hook.exit_code}"
        )
        console.print(f"  hook {escape(hook.name)}: {result} ({format_ms(hook.duration_ms)})")
    if status.hooks_running:
        console.print("  hooks still running")


@reports_errors
def files_read(session: Annotated[str, SESSION_ARG], path: Annotated[str, PATH_ARG]) -> None:
    """Write a guest file's raw bytes to stdout (streamed)."""

    async def op(runtime: Runtime) -> int:
        return await runtime.read_file_to(session, path, sys.stdout.buffer)

    run(op)
    sys.stdout.buffer.flush()


@reports_errors
def files_write(
    session: Annotated[str, SESSION_ARG],
    path: Annotated[str, PATH_ARG],
    mode: Annotated[str, typer.Option("--mode", help="Permissions, octal.")] = "644",
    as_json: bool = JSON_OPTION,
) -> None:
    """Write stdin to a guest file (streamed; parent directories created; atomic)."""
    from forkpoint.errors import InvalidInput

    try:
        permissions = int(mode, 8)
    except ValueError:
        raise InvalidInput(f"--mode must be octal like 644, got {mode!r}") from None

    async def op(runtime: Runtime) -> None:
        await runtime.write_file(session, path, sys.stdin.buffer, mode=permissions)

    with Timer() as timer:
        run(op)
    if as_json:
        emit_json({"path": path, "duration_ms": round(timer.ms, 1)})
        return
    err_console.print(f"wrote {path} in {format_ms(timer.ms)}", markup=False, highlight=False)


@reports_errors
def files_ls(
    session: Annotated[str, SESSION_ARG],
    path: Annotated[str, PATH_ARG],
    as_json: bool = JSON_OPTION,
) -> None:
    """List a directory in the guest."""

    async def op(runtime: Runtime) -> list[FileEntry]:
        return await runtime.list_files(session, path)

    entries = run(op)
    if as_json:
        emit_json(entries)
        return
    table = Table(box=None, header_style="bold")
    for column in ("MODE", "SIZE", "MODIFIED"):
        table.add_column(column, no_wrap=True, justify="right" if column == "SIZE" else "left")
    table.add_column("NAME")
    for e in entries:
        modified = datetime.fromtimestamp(e.mtime_ns / 1e9).strftime("%Y-%m-%d %H:%M")
        name = escape(e.name) + ("/" if e.type == "dir" else "")
        table.add_row(
            stat.filemode(_TYPE_BITS.get(e.type, 0) | e.mode), str(e.size), modified, name
        )
    print_table(table)


@reports_errors
def files_rm(
    session: Annotated[str, SESSION_ARG],
    path: Annotated[str, PATH_ARG],
    as_json: bool = JSON_OPTION,
) -> None:
    """Remove a file or a whole directory tree in the guest."""

    async def op(runtime: Runtime) -> None:
        await runtime.remove_file(session, path)

    run(op)
    if as_json:
        emit_json({"path": path, "removed": True})
        return
    console.print(f"removed {path}", markup=False, highlight=False)
