"""``forkpoint checkpoint | checkpoints | fork | rollback``: freezing and branching sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from forkpoint.cli._run import (
    Timer,
    describe_checkpoint,
    format_bytes,
    format_ms,
    print_ports,
    print_session,
    print_table,
    run,
    short_time,
    spinner,
)
from forkpoint.cli.output import JSON_OPTION, console, emit_json, err_console, reports_errors
from forkpoint.cli.warm import prepare_rollback_after
from forkpoint.config import cluster_address
from forkpoint.errors import ForkpointError, InvalidInput

if TYPE_CHECKING:
    from forkpoint.models import Checkpoint, Session, StateDiff
    from forkpoint.runtime import Runtime

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("checkpoint")(checkpoint_command)
    app.command("checkpoints")(checkpoints_command)
    app.command("fork")(fork_command)
    app.command("rollback")(rollback_command)
    app.command("recover")(recover_command)


@reports_errors
def checkpoint_command(
    target: Annotated[
        str,
        typer.Argument(
            metavar="SESSION|rm|verify|export|import|push|pull",
            help="Session id or name, or `rm`, `verify`, `export`, `import`, `push`, `pull`.",
        ),
    ],
    ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="ID",
            help="With `rm`/`verify`: the checkpoints; with the others: the checkpoint, "
            "archive or ref.",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="A name for the checkpoint.")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="With `export`: the archive to write.")
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="With `push`: s3://BUCKET/PREFIX.")] = None,
    source: Annotated[
        str | None, typer.Option("--from", help="With `pull`: s3://BUCKET/PREFIX.")
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint", help="With push/pull: the S3 endpoint URL (default: $AWS_ENDPOINT_URL)."
        ),
    ] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Checkpoint a session, delete checkpoints, or move them between hosts.

    \b
    forkpoint checkpoint SESSION [--name N]        checkpoint a running session
    forkpoint checkpoint rm ID...                  delete checkpoints
    forkpoint checkpoint verify ID...              hash every file against its manifest
    forkpoint checkpoint export CK -o FILE         CK and its lineage in one archive
    forkpoint checkpoint import FILE               a checkpoint from such an archive
    forkpoint checkpoint push CK --to s3://B/P     upload (only what the bucket lacks)
    forkpoint checkpoint pull REF --from s3://B/P  download (REF: digest, id or name)

    Push and pull take credentials from the usual AWS variables (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...). A pull this host cannot restore is
    refused (exit 4) before any RAM is downloaded; a corrupt object fails it (exit 4)
    and nothing is imported.
    """
    if target in _TRANSFERS:
        _transfer(target, ids or [], name=name, output=output, to=to, source=source,
                  endpoint=endpoint, as_json=as_json)  # fmt: skip
        return
    for option, value in (("-o", output), ("--to", to), ("--from", source),
                          ("--endpoint", endpoint)):  # fmt: skip
        if value is not None:
            raise InvalidInput(f"{option} applies only to checkpoint export/push/pull")
    if target == "verify":
        if not ids or name is not None:
            raise InvalidInput("checkpoint verify needs checkpoint IDs (and no --name)")
        _verify_checkpoints(ids, as_json)
        return
    if target == "rm":
        if not ids:
            raise InvalidInput("checkpoint rm needs at least one checkpoint ID")
        if name is not None:
            raise InvalidInput("--name does not apply to checkpoint rm")
        _remove_checkpoints(ids, as_json)
        return
    if ids:
        raise InvalidInput(
            f"unexpected argument {ids[0]!r}: use `forkpoint checkpoint SESSION` "
            "or `forkpoint checkpoint rm ID...`"
        )

    async def op(runtime: Runtime) -> Checkpoint:
        return await runtime.checkpoint(target, name=name)

    with spinner(f"checkpointing {target}…"):
        checkpoint = run(op)
    if as_json:
        emit_json(checkpoint)
    else:
        console.print(
            f"[bold green]checkpoint[/] {describe_checkpoint(checkpoint)} of "
            f"[cyan]{checkpoint.session_id}[/] in {format_ms(checkpoint.duration_ms)} [dim]"
            f"(paused {format_ms(checkpoint.pause_ms)}, {format_bytes(checkpoint.size_bytes)})[/]",
            highlight=False,
        )
    prepare_rollback_after(checkpoint.session_id)


_TRANSFERS = ("export", "import", "push", "pull")


def _transfer(
    verb: str, args: list[str], *, name: str | None, output: Path | None, to: str | None,
    source: str | None, endpoint: str | None, as_json: bool,
) -> None:  # fmt: skip
    from forkpoint.models import CheckpointTransfer

    if len(args) != 1:
        what = "FILE" if verb == "import" else "REF" if verb == "pull" else "CHECKPOINT"
        raise InvalidInput(f"checkpoint {verb} takes one {what}")
    wanted = {"export": ("-o", output), "push": ("--to", to), "pull": ("--from", source)}
    if verb in wanted and wanted[verb][1] is None:
        raise InvalidInput(f"checkpoint {verb} needs {wanted[verb][0]}")
    given = {"-o": output, "--to": to, "--from": source, "--name": name}
    allowed = {wanted[verb][0]} if verb in wanted else set()
    if endpoint is not None and verb not in ("push", "pull"):
        raise InvalidInput(f"--endpoint does not apply to checkpoint {verb}")
    for option, value in given.items():
        if value is not None and option not in allowed:
            raise InvalidInput(f"{option} does not apply to checkpoint {verb}")
    subject = args[0]

    with _progress(f"{verb} {subject}…", enabled=True) as progress:

        async def op(runtime: Runtime) -> CheckpointTransfer:
            if verb == "export":
                assert output is not None
                return await runtime.export_checkpoint(subject, output, progress=progress)
            if verb == "import":
                return await runtime.import_checkpoint(Path(subject), progress=progress)
            if verb == "push":
                assert to is not None
                return await runtime.push_checkpoint(
                    subject, to, endpoint=endpoint, progress=progress
                )
            assert source is not None
            return await runtime.pull_checkpoint(
                subject, source, endpoint=endpoint, progress=progress
            )

        result = run(op)
    if as_json:
        emit_json(result)
        return
    moved = (
        f"sent {format_bytes(result.sent_bytes)} in {result.sent_objects} objects, "
        f"{result.skipped_objects} already there"
        if verb in ("push", "export")
        else f"received {format_bytes(result.received_bytes)} in {result.received_objects} objects"
    )
    console.print(
        f"[bold green]{verb}[/] {describe_checkpoint(result.checkpoint)} "
        f"{'to' if verb in ('push', 'export') else 'from'} {escape(result.location)} in "
        f"{format_ms(result.duration_ms)} [dim]({moved})[/]\n  digest {result.digest}",
        highlight=False,
    )


@contextmanager
def _progress(message: str, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr (terminals only) that the operation's steps update."""
    if not enabled or not err_console.is_terminal:
        yield lambda _: None
        return
    with err_console.status(message) as status:
        yield lambda step: status.update(escape(step))


def _checkpoint_ids(runtime: Runtime, refs: list[str]) -> list[str]:
    """Each ref's checkpoint id. :raises NotFound: one is unknown."""
    return [runtime.get_checkpoint(ref).id for ref in refs]


def _remove_checkpoints(ids: list[str], as_json: bool) -> None:
    async def op(runtime: Runtime) -> list[str]:
        found = await asyncio.to_thread(_checkpoint_ids, runtime, ids)  # NotFound first
        for checkpoint_id in dict.fromkeys(found):
            await runtime.remove_checkpoint(checkpoint_id)
        return list(dict.fromkeys(found))

    with Timer() as timer:
        removed = run(op)
    if as_json:
        emit_json({"removed": removed, "duration_ms": round(timer.ms, 1)})
        return
    shown = ", ".join(f"[cyan]{checkpoint_id}[/]" for checkpoint_id in removed)
    console.print(f"[bold]removed[/] {shown} in {format_ms(timer.ms)}", highlight=False)


def _verify_checkpoints(ids: list[str], as_json: bool) -> None:
    import dataclasses

    from forkpoint.errors import DamagedCheckpoint

    def verify(runtime: Runtime) -> dict[str, list[dict[str, object]]]:
        found = _checkpoint_ids(runtime, ids)  # NotFound before any work
        return {
            c: [dataclasses.asdict(f) for f in runtime.verify_checkpoint(c)]
            for c in dict.fromkeys(found)
        }

    async def op(runtime: Runtime) -> dict[str, list[dict[str, object]]]:
        return await asyncio.to_thread(verify, runtime)

    with spinner("verifying…"):
        report = run(op)
    bad = [c for c, checks in report.items() if not all(f["ok"] for f in checks)]
    if as_json:
        emit_json([{"checkpoint": c, "ok": c not in bad, "files": f} for c, f in report.items()])
    else:
        for c, checks in report.items():
            for f in checks:
                status = "[green]ok[/]" if f["ok"] else f"[bold red]{escape(str(f['problem']))}[/]"
                console.print(
                    f"[cyan]{c}[/] {f['name']:<14} {format_bytes(int(str(f['size']))):>10} "
                    f"{format_ms(float(str(f['ms']))):>8}  {status}",
                    highlight=False,
                )
    if bad:
        if as_json:
            raise typer.Exit(DamagedCheckpoint.exit_code)
        raise DamagedCheckpoint(f"damaged checkpoint: {', '.join(bad)}")


@reports_errors
def recover_command(as_json: bool = JSON_OPTION) -> None:
    """Bring back every crashed session from its latest checkpoint (after a host restart).

    Each is rolled back: same id, same ports. On a cluster, every session lost with its
    node is revived on the node Ray moved its reservation to: same id, same processes.
    One that cannot be is reported in its place; the exit code is that of the worst failure.
    """

    async def op(runtime: Runtime) -> list[Session | ForkpointError]:
        return await runtime.recover()

    what = "lost" if cluster_address() is not None else "crashed"
    with spinner(f"recovering {what} sessions…"), Timer() as timer:
        results = run(op)
    ok = sum(not isinstance(r, ForkpointError) for r in results)
    headline = (
        f"[bold green]recovered[/] {ok} of {len(results)} {what} session"
        f"{'s' if len(results) != 1 else ''} in {format_ms(timer.ms)}"
    )
    _report_sessions(
        results, as_json, headline, lambda s: console.print(
            f"  [cyan]{s.id}[/] from {s.parent_checkpoint}", highlight=False
        ),
    )  # fmt: skip


def _report_sessions(
    results: list[Session | ForkpointError],
    as_json: bool,
    headline: str,
    show: Callable[[Session], None],
    failed: str = "",
) -> None:
    """Sessions an operation made, each failure in its place; exits with the worst
    failure's code."""
    failures = [r for r in results if isinstance(r, ForkpointError)]
    if as_json:
        emit_json([{"error": r.to_dict()} if isinstance(r, ForkpointError) else r for r in results])
    else:
        console.print(headline, highlight=False)
        for r in results:
            if isinstance(r, ForkpointError):
                err_console.print(
                    f"[bold red]error:[/] {failed}{escape(r.message)}", highlight=False,
                    soft_wrap=True,
                )  # fmt: skip
            else:
                show(r)
    if failures:
        raise typer.Exit(max(f.exit_code for f in failures))


@reports_errors
def checkpoints_command(
    session: Annotated[str | None, typer.Argument(help="Only this session's checkpoints.")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """List checkpoints (of all sessions, or of one). OWN: the disk only it uses; SHARED:
    what it shares with other checkpoints (RAM that did not change between them)."""

    async def op(runtime: Runtime) -> list[Checkpoint]:
        return await asyncio.to_thread(runtime.list_checkpoints, session)

    checkpoints = run(op)
    if as_json:
        emit_json(checkpoints)
        return
    if not checkpoints:
        console.print("no checkpoints: make one with [bold]forkpoint checkpoint SESSION[/]")
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "SESSION", "CREATED", "SIZE", "OWN", "SHARED", "TOOK", "PARENT"):
        right = column in ("SIZE", "OWN", "SHARED")
        table.add_column(column, no_wrap=True, justify="right" if right else "left")
    for c in checkpoints:
        table.add_row(
            c.id,
            escape(c.name or ""),
            c.session_id,
            short_time(c.created_at),
            format_bytes(c.size_bytes),
            format_bytes(c.disk_bytes - c.shared_bytes),
            format_bytes(c.shared_bytes),
            format_ms(c.duration_ms),
            c.parent_checkpoint or "",
        )
    print_table(table)


@reports_errors
def fork_command(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint id or name.")],
    count: Annotated[int, typer.Option("--count", "-n", help="How many sessions.")] = 1,
    spread: Annotated[
        bool,
        typer.Option(
            "--spread/--pack",
            help="On a cluster: ask Ray to spread the forks over nodes, or pack them on "
            "as few as hold them (default: pack; one host: no effect).",
        ),
    ] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Start new sessions from a checkpoint: each wakes up with the same running processes.

    A fork that fails is reported in its place (JSON: {"error": {...}}); the others keep
    running, and the exit code is that of the worst failure (4 or 5).
    """

    async def op(runtime: Runtime) -> list[Session | ForkpointError]:
        return await runtime.fork(checkpoint, count, spread=spread)

    with spinner(f"forking {checkpoint} ×{count}…"), Timer() as timer:
        results = run(op)
    ok = sum(not isinstance(r, ForkpointError) for r in results)
    headline = (
        f"[bold green]forked[/] {ok} session{'s' if ok != 1 else ''} from "
        f"[cyan]{escape(checkpoint)}[/] in {format_ms(timer.ms)}"
    )

    def show(session: Session) -> None:
        console.print(f"  [cyan]{session.id}[/]", highlight=False)
        print_ports(session, indent="    ")

    _report_sessions(results, as_json, headline, show, failed="fork failed: ")


def _rollback_preview(session: str, checkpoint: str | None, *, patch: bool, as_json: bool) -> None:
    from forkpoint.cli.history import print_diff

    async def op(runtime: Runtime) -> StateDiff:
        return await runtime.rollback_preview(session, checkpoint, patch=patch)

    with spinner(f"comparing {session} with its checkpoint…"):
        preview = run(op)
    if as_json:
        emit_json(preview)
        return
    print_diff(
        preview,
        f"rolling back [cyan]{escape(session)}[/] to [cyan]{preview.source}[/] would undo",
        undo=True,
    )


@reports_errors
def rollback_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    checkpoint: Annotated[
        str | None,
        typer.Argument(help="Checkpoint of its lineage (default: its latest own checkpoint)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show what the rollback would undo; change nothing."),
    ] = False,
    patch: Annotated[
        bool, typer.Option("--patch", "-p", help="With --dry-run: diffs of small text files.")
    ] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Reset a session to a checkpoint: same id, same ports, processes restored from memory.

    Also revives a crashed session. --dry-run prints what it would undo (files, processes,
    listening ports; see `forkpoint diff`) and changes nothing. With
    FORKPOINT_ROLLBACK_STANDBYS=N, checkpoint and rollback start the next rollback's QEMU
    ahead once they printed their result (for the N sessions that did so last).
    """
    if dry_run:
        _rollback_preview(session, checkpoint, patch=patch, as_json=as_json)
        return

    async def op(runtime: Runtime) -> Session:
        return await runtime.rollback(session, checkpoint)

    with spinner(f"rolling back {session}…"), Timer() as timer:
        result = run(op)
    if as_json:
        emit_json(result)
    else:
        print_session(
            result,
            f"[bold green]rolled back[/] [cyan]{result.id}[/] to "
            f"[cyan]{result.parent_checkpoint}[/] in {format_ms(timer.ms)}",
        )
    prepare_rollback_after(result.id)
