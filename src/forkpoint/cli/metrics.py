"""``forkpoint metrics``: a session's CPU, memory and disk over the last minutes;
``forkpoint host``: the host's room against the limits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from forkpoint.cli._run import print_table, run, short_time
from forkpoint.cli.output import JSON_OPTION, console, emit_json, reports_errors

if TYPE_CHECKING:
    from forkpoint.models import HostStatus, Metric
    from forkpoint.runtime import Runtime

__all__ = ["register"]

_MIB = 1024 * 1024


def register(app: typer.Typer) -> None:
    app.command("metrics")(metrics_command)
    app.command("host")(host_command)


@reports_errors
def metrics_command(
    session: Annotated[str, typer.Argument(help="Session id or name.")],
    minutes: Annotated[
        float, typer.Option("--minutes", "-m", min=0.1, max=60, help="How far back to show.")
    ] = 10,
    as_json: bool = JSON_OPTION,
) -> None:
    """CPU, memory and disk of a running session, one sample every 5 s while a long-lived
    door (`forkpoint serve`, the E2B gateway, MCP) runs; kept an hour. CPU is the host
    CPU its VM used, as a share of its vCPUs; memory and disk as the guest counts them."""

    async def op(runtime: Runtime) -> list[Metric]:
        return await runtime.metrics(session, datetime.now(UTC) - timedelta(minutes=minutes))

    samples = run(op)
    if as_json:
        emit_json(samples)
        return
    if not samples:
        console.print(
            f"no samples in the last {minutes:g} min: sessions are sampled while "
            "`forkpoint serve` (or the E2B gateway, or MCP) runs"
        )
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("TIME", "CPU", "MEMORY", "CACHE", "DISK"):
        table.add_column(column, justify="left" if column == "TIME" else "right")
    for m in samples:
        table.add_row(
            short_time(m.at), f"{m.cpu_used_pct:.1f}% of {m.cpu_count}",
            f"{m.mem_used // _MIB}/{m.mem_total // _MIB} MiB", f"{m.mem_cache // _MIB} MiB",
            f"{m.disk_used // _MIB}/{m.disk_total // _MIB} MiB",
        )  # fmt: skip
    print_table(table)


@reports_errors
def host_command(as_json: bool = JSON_OPTION) -> None:
    """The host's room against forkpoint's limits: running sessions (of
    FORKPOINT_MAX_SESSIONS), memory available and given to guests, free disk (against
    FORKPOINT_DISK_RESERVE), and the VMs started ahead (warm VMs, rollback standbys)."""

    async def op(runtime: Runtime) -> HostStatus:
        import asyncio

        return await asyncio.to_thread(runtime.host_status)

    host = run(op)
    if as_json:
        emit_json(host)
        return
    gib = 1 << 30
    rows = (
        ("sessions", f"{host.sessions_running} running of {host.sessions_max} allowed"),
        ("cpus", f"{host.cpus} (load {host.load_1m:g})"),
        ("memory", f"{host.memory_available_mib} MiB available of {host.memory_total_mib} MiB; "
                   f"{host.memory_sessions_mib} MiB given to running guests"),
        ("disk", f"{host.disk_free_bytes / gib:.1f} GiB free, "
                 f"{host.disk_reserve_bytes / gib:.1f} GiB kept in reserve"),
        ("ahead", f"{host.warm_vms} warm VM(s), {host.standbys} rollback standby(s)"),
    )  # fmt: skip
    for name, value in rows:
        console.print(f"[bold]{name:9}[/] {value}")
