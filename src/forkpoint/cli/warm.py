"""``forkpoint warm``: QEMU processes started ahead of creates (see runtime/sessions/warm.py)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from forkpoint.cli._run import print_table, run, short_time, spinner
from forkpoint.cli.options import CpusOption, ImageOption, MemoryOption, NetworkOption
from forkpoint.cli.output import JSON_OPTION, console, emit_json, err_console, reports_errors
from forkpoint.errors import ForkpointError, InvalidInput
from forkpoint.models import DEFAULT_CPUS, DEFAULT_MEMORY_MIB

if TYPE_CHECKING:
    from forkpoint.config import HostLimits
    from forkpoint.runtime import Runtime

__all__ = ["prepare_rollback_after", "refill_after_create", "register"]


def register(app: typer.Typer) -> None:
    app.command("warm")(warm_command)


@reports_errors
def warm_command(
    image: ImageOption = "default",
    memory: MemoryOption = DEFAULT_MEMORY_MIB,
    cpus: CpusOption = DEFAULT_CPUS,
    network: NetworkOption = "user",
    port: Annotated[
        list[int] | None,
        typer.Option("--port", help="Guest port creates forward (repeatable), as `create`'s."),
    ] = None,
    from_checkpoint: Annotated[
        str | None,
        typer.Option("--from", help="For forks of this checkpoint instead of creates."),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("--count", help="Warm VMs to have (default: FORKPOINT_WARM_VMS)."),
    ] = None,
    drain: Annotated[bool, typer.Option("--drain", help="Stop every warm VM instead.")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Start VMs ahead for creates of this kind (or forks of a checkpoint, with --from):
    started, loaded and connected, with host ports for their forwards, so a create or fork
    only runs one (no QEMU start-up, no load); or stop them all (--drain). Each waits
    paused: no CPU, ≈ 41 MiB.

    Creates and forks take them; with FORKPOINT_WARM_VMS set, creates refill them."""
    if count is not None and not 0 <= count <= 64:
        raise InvalidInput(f"--count must be 0-64, not {count}")

    async def op(runtime: Runtime) -> dict[str, Any]:
        if drain:
            changed = runtime.warm.drain()
        else:
            changed = await runtime.fill_warm(
                image=image, memory_mib=memory, cpus=cpus, network=network, ports=port or [],
                checkpoint=from_checkpoint, count=count,
            )  # fmt: skip
        return {"drained" if drain else "started": changed, "warm": _rows(runtime)}

    with spinner("stopping warm VMs…" if drain else "starting warm VMs…"):
        result = run(op)
    if as_json:
        emit_json(result)
        return
    verb = "stopped" if drain else "started"
    console.print(f"{verb} {result.get('drained', result.get('started'))} warm VM(s)")
    if not drain and not result["warm"]:
        console.print("[dim]none kept: give --count N, or set FORKPOINT_WARM_VMS[/]")
    if result["warm"]:
        table = Table(box=None, header_style="bold")
        for column in ("SESSION ID", "FROM", "PORTS", "QEMU PID", "SINCE"):
            table.add_column(column)
        for w in result["warm"]:
            ports = ", ".join(f"{p['host_port']}→{p['guest_port']}" for p in w["ports"]) or "-"
            table.add_row(
                w["id"], w["checkpoint"], ports, str(w["qemu_pid"]), short_time(w["created_at"])
            )
        print_table(table)


def refill_after_create(image: str, memory: int, cpus: int, network: str, ports: list[int]) -> None:
    """After a create has printed its result: top the warm VMs up again (when
    FORKPOINT_WARM_VMS asks for some). A failure is reported, the create stands."""
    _after_result(
        lambda limits: limits.warm_vms,
        lambda rt: rt.fill_warm(
            image=image, memory_mib=memory, cpus=cpus, network=network, ports=ports
        ),
        "warm VMs not refilled",
    )


def prepare_rollback_after(session: str) -> None:
    """After a checkpoint or rollback has printed its result: start the session's rollback
    standby (when FORKPOINT_ROLLBACK_STANDBYS asks for them; see runtime/restore/standby.py)."""
    _after_result(
        lambda limits: limits.rollback_standbys,
        lambda rt: rt.prepare_rollback(session),
        "rollback standby not started",
    )


def _after_result(
    wanted: Callable[[HostLimits], int],
    work: Callable[[Runtime], Awaitable[object]],
    failed: str,
) -> None:
    """Start VMs ahead once the command's result is out, if ``wanted`` of the host's
    limits asks for any. A failure is reported on stderr; the command stands."""
    from forkpoint.config import cluster_address
    from forkpoint.runtime.capacity import host_limits

    if cluster_address() is not None:
        return  # the VMs are the nodes': none start on the client's host
    try:
        if wanted(host_limits()) == 0:
            return
    except InvalidInput:
        return  # the command reported it already
    sys.stdout.flush()  # the result is out before the VMs start
    try:
        run(work)
    except ForkpointError as error:
        err_console.print(f"forkpoint: {failed}: {escape(error.message)}")


def _rows(runtime: Runtime) -> list[dict[str, Any]]:
    return [
        {
            "id": w.id,
            "checkpoint": w.checkpoint_id,
            "ports": [{"host_port": h, "guest_port": g} for h, g in w.forwards],
            "qemu_pid": w.qemu_pid,
            "passt_pid": w.passt_pid,
            "created_at": w.created_at,
        }
        for w in runtime.warm.rows.all()
    ]
