"""``forkpoint create | ls | show | rm | port``: the lifecycle of sessions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from forkpoint.cli._run import (
    Timer,
    format_ms,
    print_ports,
    print_session,
    print_table,
    run,
    short_time,
    spinner,
)
from forkpoint.cli._run import styled_state as _state
from forkpoint.cli.core import get_session, list_sessions
from forkpoint.cli.output import JSON_OPTION, console, emit_json, reports_errors

if TYPE_CHECKING:
    from forkpoint.models import Limits, Port, Session
    from forkpoint.runtime import Runtime

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("create")(create_command)
    app.command("ls")(ls_command)
    app.command("show")(show_command)
    app.command("rm")(rm_command)
    app.command("port")(port_command)


@reports_errors
def create_command(
    image: Annotated[str, typer.Option("--image", help="Image name (see `image ls`).")] = "default",
    memory: Annotated[int, typer.Option("--memory", help="Guest RAM, MiB.")] = 512,
    cpus: Annotated[int, typer.Option("--cpus", help="Virtual CPUs.")] = 1,
    name: Annotated[
        str | None, typer.Option("--name", help="A name to use instead of the id.")
    ] = None,
    port: Annotated[
        list[int] | None,
        typer.Option("--port", help="Guest port to forward to 127.0.0.1 (repeatable)."),
    ] = None,
    network: Annotated[
        str, typer.Option("--network", help="'user' (NAT, port forwards) or 'none'.")
    ] = "user",
    allow_net: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-net",
            help="CIDR the guest may reach despite the default denies (repeatable).",
        ),
    ] = None,
    deny_net: Annotated[
        list[str] | None,
        typer.Option("--deny-net", help="CIDR the guest may not reach (repeatable)."),
    ] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Create a session (a running microVM) from an image.

    Its guest reaches the internet but not the host, link-local (metadata services) or
    private addresses; --allow-net and --deny-net adjust that.

    The first session of an image boots it once to build its template: that can take
    minutes under TCG. Every later create forks the template in milliseconds.
    """

    async def op(runtime: Runtime) -> Session:
        return await runtime.create(
            image=image, memory_mib=memory, cpus=cpus, name=name, ports=port or [],
            network=network, allow_net=allow_net or [], deny_net=deny_net or [],
        )  # fmt: skip

    with spinner(f"creating a session from image {image}…"), Timer() as timer:
        session = run(op)
    if as_json:
        emit_json(session)
        return
    label = f" ({escape(session.name)})" if session.name else ""
    print_session(
        session, f"[bold green]created[/] [cyan]{session.id}[/]{label} in {format_ms(timer.ms)}"
    )


@reports_errors
def ls_command(as_json: bool = JSON_OPTION) -> None:
    """List sessions."""

    sessions = list_sessions()
    if as_json:
        emit_json(sessions)
        return
    if not sessions:
        console.print("no sessions: create one with [bold]forkpoint create[/]")
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "IMAGE", "STATE", "CREATED", "FROM"):
        table.add_column(column, no_wrap=True)
    table.add_column("PORTS")
    for s in sessions:
        table.add_row(
            s.id,
            escape(s.name or ""),
            escape(s.image),
            _state(s.state),
            short_time(s.created_at),
            s.parent_checkpoint or "",
            ", ".join(f"{p.guest_port}→{p.url}" for p in s.ports),
        )
    print_table(table)


@reports_errors
def show_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    as_json: bool = JSON_OPTION,
) -> None:
    """Show one session."""

    s = get_session(session)
    if as_json:
        emit_json(s)
        return
    rows = [
        ("id", s.id),
        ("name", escape(s.name or "-")),
        ("state", _state(s.state)),
        ("image", escape(s.image)),
        ("created", f"{s.created_at} ({short_time(s.created_at)} local)"),
        ("from", s.parent_checkpoint or "-"),
        ("machine", f"{s.memory_mib} MiB, {s.cpus} cpu, network {s.network}"),
        ("limits", _limits(s.limits)),
        ("egress", _describe_egress(s)),
    ]
    for key, value in rows:
        console.print(f"[bold]{key:<8}[/] {value}", highlight=False)
    if s.ports:
        console.print("[bold]ports[/]", highlight=False)
        print_ports(s)


def _limits(limits: Limits | None) -> str:
    """The cgroup limits in force, and what is not enforced (in bold: it should be)."""
    if limits is None:
        return "- (no VM running)"
    shown = [
        f"memory {limits.memory_bytes >> 20} MiB" if limits.memory_bytes is not None else "",
        f"cpu {limits.cpus:g}" if limits.cpus is not None else "",
        f"pids {limits.pids_max}" if limits.pids_max is not None else "",
        f"io weight {limits.io_weight}" if limits.io_weight is not None else "",
    ]
    text = ", ".join(part for part in shown if part) or "none"
    if limits.not_enforced:
        text += f"; [bold]not enforced: {', '.join(limits.not_enforced)}[/]"
    return text


def _describe_egress(s: Session) -> str:
    if s.network != "user":
        return "none"
    parts = ["internet; not the host, private or link-local addresses"]
    parts += [f"allow {cidr}" for cidr in s.egress.get("allow", [])]
    parts += [f"deny {cidr}" for cidr in s.egress.get("deny", [])]
    return "; ".join(parts)


@reports_errors
def rm_command(
    sessions: Annotated[list[str], typer.Argument(help="Session ids or names.")],
    as_json: bool = JSON_OPTION,
) -> None:
    """Remove sessions: kill their VMs and delete their files.

    Every id is looked up first: if one is unknown, nothing is removed.
    """

    async def op(runtime: Runtime) -> list[str]:
        ids = [runtime.get(s).id for s in sessions]  # NotFound before anything changes
        for session_id in dict.fromkeys(ids):
            await runtime.remove(session_id)
        return list(dict.fromkeys(ids))

    with Timer() as timer:
        removed = run(op)
    if as_json:
        emit_json({"removed": removed, "duration_ms": round(timer.ms, 1)})
        return
    shown = ", ".join(f"[cyan]{session_id}[/]" for session_id in removed)
    console.print(f"[bold]removed[/] {shown} in {format_ms(timer.ms)}", highlight=False)


@reports_errors
def port_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    guest_port: Annotated[int, typer.Argument(help="Port inside the guest (1-65535).")],
    as_json: bool = JSON_OPTION,
) -> None:
    """Forward a guest port to 127.0.0.1 on the host (idempotent) and print its URL."""

    async def op(runtime: Runtime) -> Port:
        return await runtime.forward_port(session, guest_port)

    info = run(op)
    if as_json:
        emit_json(info)
        return
    console.print(f"port {info.guest_port} → {info.url}", highlight=False)
