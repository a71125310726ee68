"""``forkpoint bench``: time every platform operation next to the baselines (see
forkpoint.bench); writes bench.json and bench.md."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.markup import escape
from rich.table import Table

from forkpoint.cli._run import run
from forkpoint.cli.output import JSON_OPTION, console, emit_json, err_console, reports_errors
from forkpoint.errors import InvalidInput

if TYPE_CHECKING:
    from forkpoint.cluster.runtime import ClusterRuntime
    from forkpoint.runtime import Runtime

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)


@reports_errors
def bench_command(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for bench.json and bench.md.")
    ] = Path("bench-out"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Few repetitions: a smoke run of under a minute.")
    ] = False,
    on_cluster: Annotated[
        bool,
        typer.Option(
            "--cluster",
            help="Measure the cluster FORKPOINT_CLUSTER names instead: placement, transfer "
            "per MiB and fork x12 packed vs spread, against a node's own runtime.",
        ),
    ] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Time create, checkpoint, fork x1/x3/x20/x100 and rollback of a 512 MiB guest running
    a web server, side by side with cold boot and a naive full-RAM save/restore; measure
    idle forks' memory and CPU (fork x100 only where FORKPOINT_MAX_SESSIONS allows it).

    Progress goes to stderr. Every session and checkpoint it makes is removed again.
    """
    from forkpoint.bench import Plan, Suite, write_report

    def log(message: str) -> None:
        err_console.print(f"[dim]bench[/] {escape(message)}", highlight=False)

    if on_cluster:
        _bench_cluster(out, rounds=2 if quick else 5, log=log, as_json=as_json)
        return

    async def op(runtime: Runtime) -> dict[str, Any]:
        plan = Plan.quick() if quick else Plan.full()
        log(f"{'quick' if quick else 'full'} run → {out}/")
        return await Suite(runtime, plan, log=log).run()

    result = run(op)
    json_path, md_path = write_report(result, out)
    if as_json:
        emit_json(result)
        err_console.print(f"report: {escape(str(md_path))}", highlight=False)
        return
    _print_tables(result)
    console.print(f"report: {escape(str(md_path))} · {escape(str(json_path))}", highlight=False)


def _bench_cluster(out: Path, *, rounds: int, log: Callable[[str], None], as_json: bool) -> None:
    import json

    from forkpoint.bench.cluster import cluster_lines, cluster_suite
    from forkpoint.config import cluster_address

    if cluster_address() is None:
        raise InvalidInput("--cluster measures a cluster: set FORKPOINT_CLUSTER=HEAD:6379")

    async def op(runtime: Runtime) -> dict[str, Any]:
        log(f"cluster at {cluster_address()}, {rounds} rounds → {out}/cluster.json")
        return await cluster_suite(cast("ClusterRuntime", runtime), rounds, log)

    result = run(op)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cluster.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if as_json:
        emit_json(result)
        return
    for line in cluster_lines(result):
        console.print(escape(line), highlight=False)
    console.print(f"report: {escape(str(path))}", highlight=False)


def _print_tables(result: dict[str, Any]) -> None:
    from forkpoint.bench import fanout_rows, op_rows

    table = Table(title="forkpoint operations (512 MiB guest, web server)", title_justify="left")
    for column, justify in (
        ("operation", "left"), ("p50", "right"), ("p95", "right"), ("n", "right"),
        ("target", "left"), ("baseline", "left"), ("vs baseline", "left"),
    ):  # fmt: skip
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in op_rows(result):
        table.add_row(*row)
    console.print(table)
    fanout = fanout_rows(result)
    if fanout:
        table = Table(title="fan-out and density (before, target, peer)", title_justify="left")
        for column in ("measure", "now", "before", "target", "peer"):
            table.add_column(column, justify="right" if column == "now" else "left")
        for row in fanout:
            table.add_row(*row)
        console.print(table)
    scaling = Table(title="checkpoint vs memory in use", title_justify="left")
    for column in ("in use", "configured", "first checkpoint", "again p50"):
        scaling.add_column(column, justify="right")
    for entry in result["scaling"]:
        scaling.add_row(
            f"{entry['in_use_mib']} MiB",
            f"{entry['configured_mib']} MiB",
            f"{entry.get('first_ms', 0):.0f} ms",
            f"{entry['checkpoint_p50_ms']:.0f} ms",
        )
    console.print(scaling)
    memory, host = result["memory"], result["host"]
    if memory.get("fork20_total_mib") is not None:
        console.print(
            f"memory: {result['fork20_count']} forks use {memory['fork20_total_mib']:.0f} MiB "
            f"({memory['method']}, target ≤ {memory['target_mib']} MiB) · serving "
            f"{result['fork20_serving']}/{result['fork20_count']}",
            highlight=False,
        )
    console.print(
        f"host: {host['cpus']} CPUs, {host['accel']}, QEMU {host['qemu_version']}"
        + (f" · wall {result['wall_s']:.0f} s" if "wall_s" in result else ""),
        highlight=False,
    )
