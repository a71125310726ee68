"""``forkpoint diff | history | undo``: what changed, and stepping back.

``forkpoint diff`` also compares two PNG files (pixels, see ``browser.py``): when both
arguments are files on the host, it is that diff; otherwise they are checkpoints or
sessions. A session or checkpoint is never a host path, so the two never meet.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from forkpoint.cli._run import Timer, format_ms, print_table, run, short_time, spinner
from forkpoint.cli.output import JSON_OPTION, console, emit_json, reports_errors
from forkpoint.cli.warm import prepare_rollback_after

if TYPE_CHECKING:
    from forkpoint.models import HistoryStep, Session, StateDiff
    from forkpoint.runtime import Runtime

__all__ = ["print_diff", "register"]

_MAX_SHOWN = 200  # file lines printed for people (--json has them all)


def register(app: typer.Typer) -> None:
    app.command("diff")(diff_command)
    app.command("history")(history_command)
    app.command("undo")(undo_command)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


@reports_errors
def history_command(
    session: Annotated[str, typer.Argument(help="Session id or name (created with --history).")],
    as_json: bool = JSON_OPTION,
) -> None:
    """The steps of a session created with --history: the checkpoint before each, its
    label (command or path), time, the space it costs and the forks started from it."""

    async def op(runtime: Runtime) -> list[HistoryStep]:
        return await runtime.history(session)

    steps = run(op)
    if as_json:
        emit_json(steps)
        return
    if not steps:
        console.print("no steps yet")
        return
    table = Table(box=None, header_style="bold")
    for column in ("STEP", "CHECKPOINT", "TIME", "SIZE", "FORKS", "LABEL"):
        table.add_column(column, no_wrap=column != "LABEL")
    for step in steps:
        label = escape(step.label) if step.automatic else f"[bold]{escape(step.label)}[/]"
        table.add_row(
            str(step.step), step.checkpoint, short_time(step.created_at), _size(step.size_bytes),
            ", ".join(step.forks), label,
        )  # fmt: skip
    print_table(table)
    total = sum(s.size_bytes for s in steps)
    console.print(
        f"[dim]{len(steps)} checkpoints, {_size(total)}; "
        "undo N rolls back to before the last N steps[/]"
    )


@reports_errors
def undo_command(
    session: Annotated[str, typer.Argument(help="Session id or name (created with --history).")],
    steps: Annotated[int, typer.Option("--steps", "-n", help="How many steps to undo.")] = 1,
    as_json: bool = JSON_OPTION,
) -> None:
    """Undo the last N steps (exec or file write), processes included: roll back to the
    checkpoint taken before them."""

    async def op(runtime: Runtime) -> Session:
        return await runtime.undo(session, steps)

    with spinner(f"undoing {steps} step(s) of {session}…"), Timer() as timer:
        result = run(op)
    if as_json:
        emit_json(result)
    else:
        console.print(
            f"[bold green]undid[/] {steps} step{'s' if steps != 1 else ''} of "
            f"[cyan]{result.id}[/]: back at [cyan]{result.parent_checkpoint}[/] "
            f"in {format_ms(timer.ms)}"
        )
    prepare_rollback_after(result.id)


def _is_image_pair(a: str, b: str | None) -> bool:
    return b is not None and Path(a).is_file() and Path(b).is_file()


@reports_errors
def diff_command(
    a: Annotated[str, typer.Argument(help="Checkpoint or session (or a PNG file).")],
    b: Annotated[
        str | None,
        typer.Argument(help="Checkpoint or session (default: A's session now; or a PNG)."),
    ] = None,
    patch: Annotated[
        bool, typer.Option("--patch", "-p", help="Unified diffs of small text files.")
    ] = False,
    include_tmp: Annotated[bool, typer.Option("--include-tmp", help="Compare /tmp too.")] = False,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Also leave out this path (repeat).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="PNGs: write a diff image here.")
    ] = None,
    threshold: Annotated[
        int, typer.Option(help="PNGs: largest per-channel difference (0-255) counted equal.")
    ] = 0,
    as_json: bool = JSON_OPTION,
) -> None:
    """What changed between two checkpoints or sessions: files, processes, listening ports.

    \b
    forkpoint diff CHECKPOINT          the checkpoint against its session now
    forkpoint diff SESSION             since its latest checkpoint (what rollback undoes)
    forkpoint diff A B                 any two checkpoints or sessions
    forkpoint diff A.png B.png [-o D]  pixels of two images (both are host files)

    Left out unless asked: /proc /sys /dev /run /tmp (--include-tmp) and /etc/hostname
    (each restored VM writes its own).
    """
    if _is_image_pair(a, b):
        from forkpoint.cli.browser import diff_command as image_diff

        assert b is not None
        image_diff(Path(a), Path(b), out=out, threshold=threshold, as_json=as_json)
        return

    async def op(runtime: Runtime) -> StateDiff:
        return await runtime.diff(
            a, b, patch=patch, include_tmp=include_tmp, exclude=tuple(exclude or ())
        )

    with spinner("comparing…"), Timer():
        result = run(op)
    if as_json:
        emit_json(result)
        return
    print_diff(result, f"[bold]{result.source}[/] → [bold]{result.target}[/]")


def print_diff(diff: StateDiff, headline: str, *, undo: bool = False) -> None:
    """The diff for people; ``undo``: worded as what a rollback undoes."""
    console.print(headline + f" ({diff.entries:,} paths compared in {format_ms(diff.duration_ms)})")
    if diff.empty:
        console.print("no changes" + (": the rollback would change nothing" if undo else ""))
        return
    signs = {"added": "[green]+[/]", "removed": "[red]-[/]", "modified": "[yellow]~[/]"}
    if diff.files:
        console.print(f"[bold]files[/] ({len(diff.files)})")
    for change in diff.files[:_MAX_SHOWN]:
        mode = (
            change.mode
            if change.old_mode in (None, change.mode)
            else f"{change.old_mode}→{change.mode}"
        )
        size = (
            f"{change.size:,} B"
            if change.old_size in (None, change.size)
            else f"{change.old_size:,}→{change.size:,} B"
        )
        kind = "" if change.type == "file" else f" ({change.type})"
        console.print(
            f"  {signs[change.change]} {escape(change.path)}{kind}  {size}  {mode}", highlight=False
        )
        if change.patch:
            console.print(change.patch.rstrip("\n"), markup=False, highlight=False, style="dim")
    if len(diff.files) > _MAX_SHOWN:
        console.print(f"  … and {len(diff.files) - _MAX_SHOWN:,} more (--json lists all)")
    if diff.processes:
        console.print(f"[bold]processes[/] ({len(diff.processes)})")
    for proc in diff.processes:
        sign = "[green]+[/]" if proc.change == "started" else "[red]-[/]"
        console.print(f"  {sign} {proc.pid:>6}  {escape(proc.command)}", highlight=False)
    if diff.ports:
        console.print(f"[bold]listening ports[/] ({len(diff.ports)})")
    for port in diff.ports:
        sign = "[green]+[/]" if port.change == "opened" else "[red]-[/]"
        owner = f"  pid {port.pid} {escape(port.command)}" if port.pid else ""
        console.print(f"  {sign} {port.address}:{port.port}{owner}", highlight=False)
    if undo:
        console.print(
            "[dim]rolling back undoes these: [green]+[/] goes away, [red]-[/] comes back, "
            "[yellow]~[/] returns to its old content[/]"
        )
