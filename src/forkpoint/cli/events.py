"""``forkpoint events``: what happened to sessions, and (``--follow``) what happens next."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Annotated

import typer

from forkpoint.cli._run import run, short_time
from forkpoint.cli.output import JSON_OPTION, console, emit_json, reports_errors
from forkpoint.models import to_json_data

if TYPE_CHECKING:
    from forkpoint.models import Event
    from forkpoint.runtime import Runtime

__all__ = ["register"]

_WAIT_S = 30.0


def register(app: typer.Typer) -> None:
    app.command("events")(events_command)


@reports_errors
def events_command(
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="One session's only (id or name).")
    ] = None,
    last: Annotated[
        int, typer.Option("--last", "-n", min=1, max=1000, help="How many past events to show.")
    ] = 20,
    after: Annotated[
        int | None,
        typer.Option("--after", min=0, help="Instead of --last: every event after this id."),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Then print each new event as it happens.")
    ] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """What happened to sessions — created, forked, checkpointed, rolled back, paused,
    resumed, removed, expired — whichever door or process did it (the last 100,000 are
    kept). --follow keeps printing (with --json: one JSON object per line)."""

    async def op(runtime: Runtime) -> list[Event]:
        if after is None:
            found = await asyncio.to_thread(runtime.recent_events, last, session)
        else:
            found = await runtime.events(after, session, limit=1000)
        if not follow:
            return found
        seen = _show(found, as_json, after or 0)
        while True:
            seen = _show(
                await runtime.events(seen, session, wait=_WAIT_S, limit=1000), as_json, seen
            )

    found = run(op)
    if as_json:
        emit_json(found)
    elif not found:
        console.print("no events yet")
    else:
        _show(found, False, 0)


def _show(events: list[Event], as_json: bool, seen: int) -> int:
    """Print ``events`` (one line each); returns the last id seen."""
    for event in events:
        if as_json:
            print(json.dumps(to_json_data(event)), flush=True)
            continue
        detail = " ".join(f"{k}={v}" for k, v in sorted(event.detail.items()))
        checkpoint = f" [dim]{event.checkpoint}[/]" if event.checkpoint else ""
        console.print(
            f"{event.id:>6} {short_time(event.at)} [bold]{event.kind:<12}[/] "
            f"[cyan]{event.session}[/]{checkpoint} {detail}".rstrip(),
            highlight=False,
        )
    return events[-1].id if events else seen
