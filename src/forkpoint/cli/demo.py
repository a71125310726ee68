"""``forkpoint demo``: run the flagship scenario and write a report (see forkpoint.demo)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from forkpoint.cli._run import run
from forkpoint.cli.output import JSON_OPTION, console, emit_json, err_console, reports_errors
from forkpoint.errors import ForkpointError

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)


@reports_errors
def demo_command(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for report.md/json and the PNGs.")
    ] = Path("demo-out"),
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            metavar="CMD",
            help="Build with a real coding-agent CLI run in the guest (cwd /app; the prompt "
            "in $FORKPOINT_PROMPT and the file $FORKPOINT_PROMPT_FILE) instead of the "
            "built-in scripted builder.",
        ),
    ] = None,
    agent_timeout: Annotated[
        float, typer.Option("--agent-timeout", help="Seconds each --agent step may take.")
    ] = 1800.0,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the sessions and the checkpoint afterwards.")
    ] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Build a dashboard in a session, checkpoint, fork x3, break it, roll back; report.

    Every platform operation is timed against the reference system. Exit code 1 if any
    of the scenario's checks fails (the report says which).
    """
    from forkpoint.demo import CommandBuilder, Scenario, ScriptedBuilder, write_report

    def log(message: str) -> None:
        err_console.print(message, highlight=False)

    async def op(runtime: Runtime) -> dict[str, Any]:
        builder = (
            CommandBuilder(runtime, agent, agent_timeout)
            if agent is not None
            else ScriptedBuilder(runtime)
        )
        scenario = Scenario(runtime, builder, out, log=log, keep=keep)
        log(f"[bold]forkpoint demo[/] → {escape(str(out))}/  (builder: {escape(builder.name)})")
        try:
            return await scenario.run()
        except ForkpointError as error:
            scenario.facts["error"] = error.to_dict()
            write_report(scenario.facts, out)
            raise

    facts = run(op)
    md_path, json_path = write_report(facts, out)
    _summary(facts, md_path, json_path, to_stderr=as_json)
    if as_json:
        emit_json(facts)
    failed = [name for name, ok in facts["checks"].items() if not ok]
    if failed:
        err_console.print(
            f"[bold red]error:[/] {len(failed)} check(s) failed: {', '.join(failed)}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)


def _summary(facts: dict[str, Any], md_path: Path, json_path: Path, to_stderr: bool) -> None:
    from forkpoint.demo import timing_rows

    target = err_console if to_stderr else console
    table = Table(title="platform operations", title_justify="left")
    table.add_column("operation")
    table.add_column("forkpoint", justify="right", style="bold green")
    table.add_column("reference", justify="right")
    table.add_column("speed-up", justify="right", style="bold")
    for row in timing_rows(facts):
        table.add_row(*row)
    target.print()
    target.print(table)
    checks = facts["checks"]
    passed = sum(checks.values())
    colour = "green" if passed == len(checks) else "red"
    target.print(
        f"[{colour}]{passed}/{len(checks)} checks passed[/] · report: {escape(str(md_path))} "
        f"· {escape(str(json_path))} · overview: {escape(str(md_path.parent / 'overview.png'))}",
        highlight=False,
        soft_wrap=True,
    )
