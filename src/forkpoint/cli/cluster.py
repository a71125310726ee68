"""``forkpoint cluster join | status``: many hosts as one forkpoint, on Ray."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from forkpoint.cli._run import print_table, spinner
from forkpoint.cli.core import emit_json
from forkpoint.cli.output import JSON_OPTION, console, reports_errors
from forkpoint.config import cluster_address
from forkpoint.errors import NotConfigured

if TYPE_CHECKING:
    from forkpoint.cluster.status import NodeStatus

__all__ = ["register"]

cluster_app = typer.Typer(
    help="Many hosts as one forkpoint: Ray places sessions (see README, Many hosts).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")
    cluster_app.command("join")(join_command)
    cluster_app.command("status")(status_command)


def _address(given: str | None) -> str:
    address = given or cluster_address()
    if address is None:
        raise NotConfigured("no cluster: give --address HEAD:6379 or set FORKPOINT_CLUSTER")
    return address


@reports_errors
def join_command(
    address: Annotated[
        str | None, typer.Option("--address", help="The Ray head, HOST:PORT.")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="This node's name (default: the host name).")
    ] = None,
    slots: Annotated[
        int, typer.Option("--slots", min=1, help="How many VMs this node may run.")
    ] = 8,
    cpus: Annotated[
        int | None, typer.Option("--cpus", min=1, help="CPUs offered to Ray (default: all).")
    ] = None,
    start_ray: Annotated[
        bool,
        typer.Option(
            "--start-ray/--ray-running",
            help="Start this host's Ray node (or use the one `ray start` started).",
        ),
    ] = True,
    auto_recover: Annotated[
        bool,
        typer.Option(
            "--auto-recover",
            help="Revive, on their own, lost sessions whose reservations Ray moves here "
            "(default: only `forkpoint recover` does). Joining again sets it anew.",
        ),
    ] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Join this host to the cluster: its Ray node and its forkpoint node daemon.

    Needs Ray's token authentication (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN) and the
    cluster's S3 store (FORKPOINT_CLUSTER_STORE, AWS_ENDPOINT_URL and credentials).
    """
    from forkpoint.cluster.join import join

    node = name or socket.gethostname()
    with spinner(f"joining {node} to the cluster…"):
        info = join(
            _address(address), node, slots=slots, cpus=cpus, start_ray=start_ray,
            auto_recover=auto_recover,
        )  # fmt: skip
    if as_json:
        emit_json(info)
        return
    console.print(
        f"[bold green]joined[/] node [cyan]{info['name']}[/] ({info['node_id'][:12]}), "
        f"home {info['home']}, {info['sessions']} session(s)"
        + (", auto-recover on" if info["auto_recover"] else ""),
        highlight=False,
    )
    if info["readopted"]:  # Ray had forgotten this node (a head restarted without GCS FT)
        console.print(
            f"kept {len(info['readopted'])} session(s) running here under this node's new "
            f"Ray id: {', '.join(info['readopted'])}",
            highlight=False,
        )
    if info["removed_stale"]:  # revived elsewhere while this node was away
        console.print(
            f"removed {len(info['removed_stale'])} session(s) the cluster had revived "
            f"elsewhere: {', '.join(info['removed_stale'])}",
            highlight=False,
        )


@reports_errors
def status_command(
    address: Annotated[
        str | None, typer.Option("--address", help="The Ray head, HOST:PORT.")
    ] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """The cluster's nodes: their sessions, and what forkpoint reserved of each."""
    from forkpoint.cluster.runtime import ClusterRuntime
    from forkpoint.cluster.status import cluster_status

    status = cluster_status(ClusterRuntime(_address(address)))
    if as_json:
        emit_json(status)
        return
    table = Table(box=None, header_style="bold")
    for column in ("NODE", "ADDRESS", "STATE", "QEMU", "SESSIONS", "SLOTS", "MEMORY MIB", "CPUS"):
        table.add_column(column, no_wrap=True)
    for node in status.nodes:
        table.add_row(
            node.name, node.address, _state(node), node.qemu or "-", str(node.sessions),
            f"{node.slots_reserved}/{node.slots}",
            f"{node.memory_reserved_mib}/{node.memory_mib}",
            f"{node.cpus_reserved:g}/{node.cpus:g}",
        )  # fmt: skip
    print_table(table)
    console.print(
        f"{status.reservations} reservation(s) in {status.groups} placement group(s) "
        "(reserved/total per node)",
        highlight=False,
    )


def _state(node: NodeStatus) -> str:
    if not node.alive:
        return "[red]dead[/]"
    return "[green]forkpoint[/]" if node.daemon else "ray only"
