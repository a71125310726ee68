"""``forkpoint create | ls | show | rm | port | timeout | pause | resume``: the lifecycle
of sessions."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from forkpoint.cli._run import (
    Timer,
    format_bytes,
    format_ms,
    print_ports,
    print_session,
    print_table,
    run,
    short_time,
    spinner,
)
from forkpoint.cli._run import styled_state as _state
from forkpoint.cli.core import list_sessions, queries
from forkpoint.cli.options import (
    AllowNetOption,
    CpusOption,
    DenyNetOption,
    ImageOption,
    InjectHeaderOption,
    MemoryOption,
    NetworkOption,
    OnTimeoutOption,
    inject_headers_of,
    volumes_of,
)
from forkpoint.cli.output import JSON_OPTION, console, emit_json, reports_errors
from forkpoint.cli.warm import refill_after_create
from forkpoint.config import cluster_address
from forkpoint.errors import InvalidInput
from forkpoint.models import DEFAULT_CPUS, DEFAULT_MEMORY_MIB, Expiry, SessionState

if TYPE_CHECKING:
    from forkpoint.models import Limits, Metric, Port, Session
    from forkpoint.runtime import Runtime

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("create")(create_command)
    app.command("ls")(ls_command)
    app.command("show")(show_command)
    app.command("rm")(rm_command)
    app.command("port")(port_command)
    app.command("timeout")(timeout_command)
    app.command("egress")(egress_command)
    app.command("pause")(pause_command)
    app.command("resume")(resume_command)
    app.command("console")(console_command)


@reports_errors
def create_command(
    image: ImageOption = "default",
    memory: MemoryOption = DEFAULT_MEMORY_MIB,
    cpus: CpusOption = DEFAULT_CPUS,
    name: Annotated[
        str | None, typer.Option("--name", help="A name to use instead of the id.")
    ] = None,
    port: Annotated[
        list[int] | None,
        typer.Option("--port", help="Guest port to forward to 127.0.0.1 (repeatable)."),
    ] = None,
    network: NetworkOption = "user",
    allow_net: AllowNetOption = None,
    deny_net: DenyNetOption = None,
    inject_header: InjectHeaderOption = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="End the session's lifetime after this many seconds."),
    ] = None,
    on_timeout: OnTimeoutOption = Expiry.REMOVE,
    disk: Annotated[
        str | None,
        typer.Option("--disk", help="Virtual disk size, e.g. 8G (default: the image's)."),
    ] = None,
    history: Annotated[
        bool,
        typer.Option(
            "--history", help="Checkpoint before every exec and file write (history, undo)."
        ),
    ] = False,
    history_keep: Annotated[
        int, typer.Option("--history-keep", help="Automatic checkpoints kept (with --history).")
    ] = 20,
    volume: Annotated[
        list[str] | None,
        typer.Option(
            "--volume",
            "-v",
            metavar="VOLUME:/PATH",
            help="Mount a volume (forkpoint volume create) at PATH in the guest (repeatable). "
            "A volume is outside every checkpoint: forks share it, a rollback does not undo "
            "what was written to it.",
        ),
    ] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Create a session (a running microVM) from an image.

    Its guest reaches the internet but not the host, link-local (metadata services) or
    private addresses; --allow-net and --deny-net adjust that, and --inject-header sets
    credentials on its plain-HTTP requests to a host without the guest ever seeing them.

    --volume mounts a volume (forkpoint volume create): its files are outside every
    checkpoint, so forks share them and a rollback does not undo them.

    The first session of an image boots it once to build its template: that can take
    minutes under TCG. Every later create forks the template in milliseconds.
    """

    async def op(runtime: Runtime) -> Session:
        return await runtime.create(
            image=image, memory_mib=memory, cpus=cpus, name=name, ports=port or [],
            network=network, allow_net=allow_net or [], deny_net=deny_net or [],
            inject_headers=headers, timeout_s=timeout, disk_mib=disk_mib, history=history,
            history_keep=history_keep, on_expiry=on_timeout, volumes=mounts,
        )  # fmt: skip

    disk_mib = _mib(disk) if disk is not None else None
    mounts = volumes_of(volume)
    headers = inject_headers_of(inject_header)

    with spinner(f"creating a session from image {image}…"), Timer() as timer:
        session = run(op)
    if as_json:
        emit_json(session)
    else:
        label = f" ({escape(session.name)})" if session.name else ""
        print_session(
            session,
            f"[bold green]created[/] [cyan]{session.id}[/]{label} in {format_ms(timer.ms)}",
        )
    refill_after_create(image, memory, cpus, network, port or [])


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
    on_nodes = any(s.node for s in sessions)
    if on_nodes:
        table.add_column("NODE", no_wrap=True)
    for column in ("ID", "NAME", "IMAGE", "STATE", "CREATED", "FROM", "DISK", "EXPIRES"):
        table.add_column(column, no_wrap=True, justify="right" if column == "DISK" else "left")
    table.add_column("PORTS")
    for s in sessions:
        table.add_row(
            *([s.node or ""] if on_nodes else []),
            s.id,
            escape(s.name or ""),
            escape(s.image),
            _state(s.state),
            short_time(s.created_at),
            s.parent_checkpoint or "",
            format_bytes(s.disk_bytes),
            short_time(s.expires_at) if s.expires_at else "",
            ", ".join(f"{p.guest_port}→{p.url}" for p in s.ports),
        )
    print_table(table)


@reports_errors
def show_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    as_json: bool = JSON_OPTION,
) -> None:
    """Show one session."""

    with queries() as q:
        s = q.get(session)
        use = q.latest_metrics().get(s.id) if s.state == SessionState.RUNNING else None
    if as_json:
        emit_json(s)
        return
    rows = [
        ("id", s.id),
        *([("node", escape(s.node))] if s.node else []),
        ("name", escape(s.name or "-")),
        ("state", _state(s.state) + (" (paused, its disk only)" if s.paused_on_disk else "")),
        ("image", escape(s.image)),
        ("created", f"{s.created_at} ({short_time(s.created_at)} local)"),
        ("from", s.parent_checkpoint or "-"),
        ("machine", f"{s.memory_mib} MiB, {s.cpus} cpu, network {s.network}"),
        ("limits", _limits(s.limits)),
        ("egress", _describe_egress(s)),
        ("disk", f"{_virtual(s.disk_mib)}, {format_bytes(s.disk_bytes)} used on the host"),
        ("expires", _expiry(s.expires_at) or "never"),
    ]
    if use is not None:  # sampled while a long-lived door runs (`forkpoint metrics`)
        rows.append(("use", _use(use)))
    for key, value in rows:
        console.print(f"[bold]{key:<8}[/] {value}", highlight=False)
    if s.ports:
        console.print("[bold]ports[/]", highlight=False)
        print_ports(s)


def _use(m: Metric) -> str:
    mib = 1 << 20
    return (
        f"cpu {m.cpu_used_pct:.1f}% of {m.cpu_count}, memory {m.mem_used // mib}/"
        f"{m.mem_total // mib} MiB, disk {m.disk_used // mib}/{m.disk_total // mib} MiB "
        f"(at {short_time(m.at)})"
    )


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
    """Remove sessions: kill their VMs and delete their files, side by side.

    Every id is looked up first: if one is unknown, nothing is removed.
    """

    async def op(runtime: Runtime) -> list[str]:
        import asyncio

        # NotFound before anything changes; then all at once (their QEMUs exit together).
        found = await asyncio.gather(*(asyncio.to_thread(runtime.get, s) for s in sessions))
        ids = list(dict.fromkeys(session.id for session in found))
        results = await asyncio.gather(*map(runtime.remove, ids), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return ids

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
    local_port: Annotated[
        int,
        typer.Option(
            "--local-port",
            min=0,
            max=65535,
            help="On a cluster: the port on this machine's 127.0.0.1 (default: any free).",
        ),
    ] = 0,  # fmt: skip
    as_json: bool = JSON_OPTION,
) -> None:
    """Forward a guest port to 127.0.0.1 on the host (idempotent) and print its URL.

    On a cluster (FORKPOINT_CLUSTER), the session's ports stay on its node's loopback:
    this serves the guest port on this machine's 127.0.0.1 instead, tunnelled through the
    cluster to the session's node, until interrupted.
    """
    if cluster_address() is not None:
        _tunnel(session, guest_port, local_port, as_json)
        return

    async def op(runtime: Runtime) -> Port:
        return await runtime.forward_port(session, guest_port)

    info = run(op)
    if as_json:
        emit_json(info)
        return
    console.print(f"port {info.guest_port} → {info.url}", highlight=False)


def _tunnel(session: str, guest_port: int, local_port: int, as_json: bool) -> None:
    import asyncio
    import contextlib

    from forkpoint.cluster.doors import open_runtime
    from forkpoint.runtime.guest.loopback import guest_port_on_loopback

    async def serve() -> None:
        runtime = open_runtime()
        async with guest_port_on_loopback(runtime, session, guest_port, local_port) as port:
            url = f"http://127.0.0.1:{port}"
            if as_json:
                emit_json({"session": session, "guest_port": guest_port, "url": url})
            else:
                shown = f"port {guest_port} → {url} (tunnelled; Ctrl-C ends it)"
                console.print(shown, highlight=False)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


@reports_errors
def timeout_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    seconds: Annotated[
        str,
        typer.Argument(help="End its lifetime this many seconds from now (0: now), or `never`."),
    ],
    on_timeout: Annotated[
        Expiry | None,
        typer.Option("--on-timeout", help="Then remove or pause it (default: as before)."),
    ] = None,
    filesystem_only: Annotated[
        bool | None,
        typer.Option(
            "--filesystem-only/--keep-memory",
            help="A pause then keeps only its disk, or its memory too (default: as before).",
        ),
    ] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Set a session's lifetime, from now: past it, the session is removed (its
    checkpoints stay) or paused (--on-timeout pause). `forkpoint serve` and every CLI
    call enforce it."""

    if seconds == "never":
        lifetime = None
    else:
        try:
            lifetime = float(seconds)
        except ValueError:
            raise InvalidInput(f"not a number of seconds or `never`: {seconds!r}") from None

    async def op(runtime: Runtime) -> Session:
        keep_memory = None if filesystem_only is None else not filesystem_only
        return await runtime.set_timeout(session, lifetime, on_timeout, keep_memory)

    s = run(op)
    if as_json:
        emit_json(s)
        return
    then = "removed" if s.on_expiry == Expiry.REMOVE else "paused"
    when = f"expires {_expiry(s.expires_at)}, then {then}" if s.expires_at else "never expires"
    console.print(f"[cyan]{s.id}[/] {when}", highlight=False)


@reports_errors
def egress_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    allow_net: AllowNetOption = None,
    deny_net: DenyNetOption = None,
    inject_header: InjectHeaderOption = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Replace where a session's guest may connect: --allow-net/--deny-net on top of the
    defaults, and the headers set on its requests, --inject-header (none given: the
    defaults, no headers). A running guest is held to them at once, for every connection
    it opens from then on."""
    headers = inject_headers_of(inject_header)

    async def op(runtime: Runtime) -> Session:
        return await runtime.set_egress(session, allow_net or [], deny_net or [], headers)

    s = run(op)
    if as_json:
        emit_json(s)
        return
    console.print(f"[cyan]{s.id}[/] egress: {_describe_egress(s)}", highlight=False)


@reports_errors
def pause_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    filesystem_only: Annotated[
        bool,
        typer.Option(
            "--filesystem-only",
            help="Keep only its disk: resume boots it anew from that (its processes restart).",
        ),
    ] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Checkpoint a session and stop its VM; `resume` brings it back as it was (same id
    and ports, processes at the same PIDs). A paused session never expires."""

    async def op(runtime: Runtime) -> Session:
        return await runtime.pause(session, keep_memory=not filesystem_only)

    with spinner(f"pausing {session}…"), Timer() as timer:
        s = run(op)
    if as_json:
        emit_json(s)
        return
    kept = " (its disk only)" if s.paused_on_disk else ""
    console.print(f"[cyan]{s.id}[/] paused{kept} in {format_ms(timer.ms)}", highlight=False)


@reports_errors
def resume_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    as_json: bool = JSON_OPTION,
) -> None:
    """Bring a paused session back from the checkpoint it was paused at (one paused
    --filesystem-only: booted anew from its disk)."""

    async def op(runtime: Runtime) -> Session:
        return await runtime.resume(session)

    with spinner(f"resuming {session}…"), Timer() as timer:
        s = run(op)
    if as_json:
        emit_json(s)
        return
    print_session(s, f"[bold green]resumed[/] [cyan]{s.id}[/] in {format_ms(timer.ms)}")


def _mib(size: str) -> int:
    """``--disk`` (``8G``, ``4096M``) in MiB, rounded up. :raises InvalidInput:"""
    from forkpoint.config import parse_size

    try:
        return -(-parse_size(size) // (1 << 20))
    except ValueError:
        raise InvalidInput(f"--disk must be a size like 8G or 4096M, got {size!r}") from None


def _virtual(disk_mib: int | None) -> str:
    return f"{disk_mib} MiB virtual" if disk_mib else "the image's size"


def _expiry(expires_at: str | None) -> str:
    return f"{expires_at} ({short_time(expires_at)} local)" if expires_at else ""


@reports_errors
def console_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    max_bytes: Annotated[
        int, typer.Option("--bytes", help="Show at most this many of the latest bytes.")
    ] = 64 << 10,
    as_json: bool = JSON_OPTION,
) -> None:
    """Print the guest's serial console (its latest output; the host keeps at most 1 MiB)."""

    async def op(runtime: Runtime) -> str:
        return await runtime.console(session, max_bytes)

    text = run(op)
    if as_json:
        emit_json({"console": text})
        return
    sys.stdout.write(text)
    sys.stdout.flush()
