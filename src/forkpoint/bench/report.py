"""The benchmark's result document (``bench.json``) and its Markdown rendering.

``bench.json``::

    ops        {create, checkpoint, fork1, fork3, fork20, rollback}:
               {p50_ms, p95_ms, n, target_ms, meets_target} -- until the call returns
    ready      {create, fork1, fork3, fork20, rollback}: {p50_ms, p95_ms, n} -- from the
               call until what it started is usable: create until its agent ran a
               command, forks until every fork answered HTTP, rollback until the
               restored server answered
    baselines  {cold_boot_create, full_ram_checkpoint, full_ram_restore,
                qemu_start_floor, ram_copy_floor}: {p50_ms, p95_ms, n}
    memory     {fork20_total_mib, method, forks_measured, target_mib, meets_target}
    scaling    [{in_use_mib, configured_mib, first_ms, checkpoint_p50_ms, pause_p50_ms,
                 checkpoint_mib}]
    fanout     {density: {"20"|"100": {forks, qemu_mib, helper_mib, per_fork_mib, total_mib,
               idle_cpu_pct, window_s}}, fork100: {op, ready: Summary, serving, count},
               create_warm: Summary, fork20_warm: {op, ready: Summary}, fork100_warm: like
               fork100, fork1_listeners: Summary (a fork that waits for its guest to tell
               a registered process)} -- live idle
               forks' PSS and CPU per VM; fork x100 when the host allows it; a create and a
               fork x20 that take warm VMs (runtime/sessions/warm.py)
    cli        {ls, show, exec}: {p50_ms, p95_ms, n} -- wall time of one ``forkpoint`` process
               (``ls --json`` with a few sessions, ``show S --json``, ``exec S -- true``);
               ``ls`` also {target_ms, meets_target}: what a CLI-driven agent pays per call
    host       {cpus, accel, qemu_version}
    targets    {create, checkpoint, fork3, rollback, fork20: ms; fork20_memory_mib: MiB}
    fork20_serving  forks (of the fork20 run with the fewest) that served HTTP
    fork_failures   forks that failed to start over the whole run (0 on a healthy host)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .fanout import fanout_rows
from .stats import Summary

__all__ = [
    "OP_BASELINE",
    "TARGETS",
    "baseline_comparison",
    "build_result",
    "op_rows",
    "render_markdown",
    "write_report",
]

# DESIGN.md "Performance targets": medians in ms (memory in MiB).
TARGETS: dict[str, int] = {
    "create": 150,
    "checkpoint": 150,
    "fork3": 250,
    "rollback": 150,
    "fork20": 2000,
    "fork20_memory_mib": 3072,
    "cli_ls": 120,
}

OPS = ("create", "checkpoint", "fork1", "fork3", "fork20", "rollback")
READY = ("create", "fork1", "fork3", "fork20", "rollback")
BASELINES = (
    "cold_boot_create",
    "full_ram_checkpoint",
    "full_ram_restore",
    "qemu_start_floor",
    "ram_copy_floor",
)

# Which baseline each operation is compared with, and how many VMs it starts: a fork of
# n is compared per VM with one naive restore.
OP_BASELINE: dict[str, tuple[str, int]] = {
    "create": ("cold_boot_create", 1),
    "checkpoint": ("full_ram_checkpoint", 1),
    "fork1": ("full_ram_restore", 1),
    "fork3": ("full_ram_restore", 3),
    "fork20": ("full_ram_restore", 20),
    "rollback": ("full_ram_restore", 1),
}

_BASELINE_LABEL = {
    "cold_boot_create": "cold boot",
    "full_ram_checkpoint": "full-RAM save",
    "full_ram_restore": "full-RAM restore",
    "qemu_start_floor": "QEMU start",
    "ram_copy_floor": "RAM file copy",
}


def build_result(
    *,
    ops: Mapping[str, Summary],
    ready: Mapping[str, Summary],
    baselines: Mapping[str, Summary],
    memory: Mapping[str, Any],
    scaling: Sequence[Mapping[str, Any]],
    host: Mapping[str, Any],
    fork20_serving: int,
    fork_wide: int = 20,
    fork_failures: int = 0,
    quick: bool = False,
    wall_s: float | None = None,
    cli: Mapping[str, Summary] | None = None,
    e2b: Mapping[str, Summary] | None = None,
    history: Mapping[str, Any] | None = None,
    portable: Mapping[str, Any] | None = None,
    fanout: Mapping[str, Any] | None = None,
    incremental: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble ``bench.json`` and judge every operation against its target."""
    op_out: dict[str, Any] = {}
    for name in OPS:
        summary: dict[str, Any] = dict(ops[name])
        target = TARGETS.get(name)
        summary["target_ms"] = target
        summary["meets_target"] = None if target is None else summary["p50_ms"] <= target
        op_out[name] = summary
    mem = dict(memory)
    mem["target_mib"] = TARGETS["fork20_memory_mib"]
    total = mem.get("fork20_total_mib")
    mem["meets_target"] = None if total is None else total <= TARGETS["fork20_memory_mib"]
    result: dict[str, Any] = {
        "ops": op_out,
        "ready": {name: dict(ready[name]) for name in READY},
        "baselines": {name: dict(baselines[name]) for name in BASELINES},
        "memory": mem,
        "scaling": [dict(row) for row in scaling],
        "host": dict(host),
        "targets": dict(TARGETS),
        "fork20_serving": fork20_serving,
        "fork20_count": fork_wide,
        "fork_failures": fork_failures,
        "quick": quick,
    }
    if cli:
        result["cli"] = {name: dict(summary) for name, summary in cli.items()}
        if "ls" in cli:
            ls = result["cli"]["ls"]
            ls["target_ms"] = TARGETS["cli_ls"]
            ls["meets_target"] = ls["p50_ms"] <= TARGETS["cli_ls"]
    if e2b:
        result["e2b"] = {name: dict(summary) for name, summary in e2b.items()}
    if history:
        result["history"] = dict(history)
        warm = history.get("diff_10k_warm")
        if warm:
            result["history"]["meets_target"] = warm["p50_ms"] <= history["diff_target_ms"]
    if portable:
        result["portable"] = dict(portable)
    if incremental:
        result["incremental"] = dict(incremental)
    if fanout:
        result["fanout"] = dict(fanout)
    if wall_s is not None:
        result["wall_s"] = round(wall_s, 1)
    return result


def baseline_comparison(result: Mapping[str, Any], op: str) -> tuple[str, str]:
    """``(baseline cell, ratio cell)`` for ``op``, e.g. ``("cold boot 4512 ms",
    "30× faster than cold boot")``; per VM for multi-VM forks."""
    name, count = OP_BASELINE[op]
    base = result["baselines"].get(name)
    ours = result["ops"][op]["p50_ms"]
    if not base or ours <= 0:
        return "—", "—"
    label = _BASELINE_LABEL[name]
    base_ms = base["p50_ms"] * count
    cell = f"{label} {_ms(base['p50_ms'])}" + (f" ×{count}" if count > 1 else "")
    ratio = base_ms / ours
    if ratio >= 1:
        text = f"{_ratio(ratio)} faster than {label}"
    else:
        text = f"{_ratio(1 / ratio)} slower than {label}"
    return cell, text + (" (per VM)" if count > 1 else "")


def op_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """Rows of the operations table: op, p50, p95, n, target, ready p50, baseline, ratio."""
    rows = []
    for op in OPS:
        entry = result["ops"][op]
        ready = result.get("ready", {}).get(op)
        target = entry.get("target_ms")
        if target is None:
            target_cell = "—"
        else:
            mark = "✅" if entry.get("meets_target") else "❌"
            target_cell = f"≤ {_ms(target)} {mark}"
        baseline, ratio = baseline_comparison(result, op)
        name = f"fork x{op[4:]}" if op.startswith("fork") else op
        rows.append(
            [name, _ms(entry["p50_ms"]), _ms(entry["p95_ms"]), str(entry["n"]), target_cell,
             _ms(ready["p50_ms"]) if ready else "—", baseline, ratio]
        )  # fmt: skip
    return rows


def render_markdown(result: Mapping[str, Any]) -> str:
    """``bench.md``: operations vs targets and baselines, baselines, scaling, memory, host."""
    host = result["host"]
    lines = [
        "# forkpoint bench",
        "",
        f"{MEMORY_NOTE} Host: {host['cpus']} CPUs, accel `{host['accel']}`, "
        f"QEMU {host['qemu_version']}."
        + (" **Quick run** (few repetitions)." if result.get("quick") else ""),
        "",
        "| operation | p50 | p95 | n | target (p50) | ready (p50) | baseline (p50) | vs baseline |",
        "|---|---:|---:|---:|---|---:|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in op_rows(result)]
    lines += [
        "",
        "An operation returns when its VMs run with their restored processes and their "
        "fresh identity (clock, RNG seed, hostname) is handed to the guest. *Ready* is "
        "from the call until what it started was usable: a created session's agent ran a "
        "command; every fork, or the rolled-back session, answered HTTP through its "
        "forward. Under TCG the difference is the guest re-translating its code after a "
        "restore. The full-RAM restore baseline is timed to the same point as the "
        "operations (the VM runs); the cold boot until its agent answers"
        + _ready_vs_cold_boot(result)
        + ".",
    ]
    serving, count = result.get("fork20_serving", 0), result.get("fork20_count", 20)
    widest = [
        f" Of {entry['count']}{' from warm VMs' if key.endswith('_warm') else ''}: "
        f"{entry['serving']}/{entry['count']}."
        for key, entry in result.get("fanout", {}).items()
        if key.startswith("fork") and "serving" in entry
    ]
    lines += [
        "",
        f"Forks x{count} serving HTTP through their own forward: {serving}/{count}."
        + "".join(widest)
        + f" Forks that failed to start during the run: {result.get('fork_failures', 0)}.",
        "",
    ]
    lines += _fanout_lines(result)
    lines += ["## Baselines", "", "| baseline | p50 | p95 | n |", "|---|---:|---:|---:|"]
    for name in BASELINES:
        entry = result["baselines"][name]
        lines.append(f"| {name} | {_ms(entry['p50_ms'])} | {_ms(entry['p95_ms'])} | {entry['n']} |")
    lines += [
        "",
        "## Checkpoint cost vs memory in use",
        "",
        "*First*: the first checkpoint after the guest wrote that memory (it copies it); "
        "*again*: the next ones (they copy what changed since).",
        "",
        "| in use | configured RAM | RAM file | first | again p50 | VM paused p50 |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["scaling"]:
        written, pause = row.get("checkpoint_mib"), row.get("pause_p50_ms")
        first = row.get("first_ms")
        lines.append(
            f"| {row['in_use_mib']} MiB | {row['configured_mib']} MiB | "
            f"{'—' if written is None else f'{written:.0f} MiB'} | "
            f"{'—' if first is None else _ms(first)} | "
            f"{_ms(row['checkpoint_p50_ms'])} | {'—' if pause is None else _ms(pause)} |"
        )
    lines += _cli_lines(result.get("cli", {}))
    lines += _e2b_lines(result.get("e2b", {}))
    lines += _history_lines(result.get("history", {}))
    lines += _incremental_lines(result.get("incremental", {}))
    lines += _portable_lines(result.get("portable", {}))
    memory = result["memory"]
    total = memory.get("fork20_total_mib")
    lines += ["", "## Memory", ""]
    if total is None:
        lines.append("Not measured.")
    else:
        mark = "✅" if memory.get("meets_target") else "❌"
        live = int(memory.get("forks_measured") or count)
        lines.append(
            f"{live} live forks use **{total:.0f} MiB** of host memory together "
            f"({memory['method'].upper()} of their QEMU and network processes; "
            f"{total / live:.0f} MiB each); target ≤ {memory['target_mib']} MiB {mark}."
        )
    lines += [
        "",
        "## Host",
        "",
        f"- CPUs: {host['cpus']}",
        f"- accelerator: {host['accel']}",
        f"- QEMU: {host['qemu_version']}",
    ]
    if "wall_s" in result:
        lines.append(f"- bench wall time: {result['wall_s']:.0f} s")
    return "\n".join(lines) + "\n"


def _fanout_lines(result: Mapping[str, Any]) -> list[str]:
    rows = fanout_rows(result)
    if not rows:
        return []
    lines = [
        "## Fan-out and density",
        "",
        "Each measure beside forkpoint's figure before the fan-out work and the peer figure "
        "it chases (vendor numbers, KVM hosts with more cores: compare per child and per "
        "core). Memory is PSS per live idle fork; CPU is per idle VM, measured on the "
        "live forks once all served.",
        "",
        "| measure | now (p50) | before | target | peer |",
        "|---|---:|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _history_lines(history: Mapping[str, Any]) -> list[str]:
    if not history:
        return []
    mark = "✅" if history.get("meets_target") else "❌"
    cold, warm = history["diff_10k_cold"], history["diff_10k_warm"]
    return [
        "",
        "## History",
        "",
        f"`diff CHECKPOINT` with 10,000 more files than the image ({history['entries']:,} "
        "paths walked): *cold* is the first diff against a checkpoint (a fork of it is "
        "scanned beside the session), *warm* a later one (the checkpoint's scan is kept).",
        "",
        "| measurement | p50 | p95 | n |",
        "|---|---:|---:|---:|",
        f"| diff, cold | {_ms(cold['p50_ms'])} | {_ms(cold['p95_ms'])} | {cold['n']} |",
        f"| diff, warm (target ≤ {_ms(history['diff_target_ms'])} {mark}) | "
        f"{_ms(warm['p50_ms'])} | {_ms(warm['p95_ms'])} | {warm['n']} |",
    ]


# Issue #30's targets: (wall ms, pause ms, new MiB) of a checkpoint.
INCREMENTAL_TARGETS = {"unchanged": (150.0, 60.0, 4.0), "changed_8mib": (200.0, 80.0, 16.0)}


def _incremental_lines(inc: Mapping[str, Any]) -> list[str]:
    if not inc:
        return []

    def mark(ok: bool) -> str:
        return "✅" if ok else "❌"

    lines = [
        "",
        "## Checkpoints that cost what changed",
        "",
        "A 512 MiB guest holding 200 MiB it wrote; *new* is what the checkpoint left on disk",
        "of its own (RAM blocks no other file shares, device state, frozen disk layer).",
        "",
        "| checkpoint | wall p50 | pause p50 | new on disk | target |",
        "|---|---:|---:|---:|---|",
    ]
    for key, label in (
        ("first", "first after writing 200 MiB"),
        ("unchanged", "again, nothing changed"),
        ("changed_8mib", "after 8 MiB written"),
    ):
        row = inc[key]
        wall, pause, new = row["wall"]["p50_ms"], row["pause"]["p50_ms"], row["new_mib_p50"]
        target = INCREMENTAL_TARGETS.get(key)
        verdict = "—"
        if target:
            ok = wall <= target[0] and pause <= target[1] and new <= target[2]
            verdict = f"≤ {_ms(target[0])} / ≤ {_ms(target[1])} / ≤ {target[2]:.0f} MiB {mark(ok)}"
        lines.append(f"| {label} | {_ms(wall)} | {_ms(pause)} | {new:.1f} MiB | {verdict} |")
    chain, hist = inc["chain"], inc["history"]
    lines += [
        "",
        f"| from a chain of {chain['depth']} | its first | its last | target |",
        "|---|---:|---:|---|",
    ]
    for op in ("fork", "rollback"):
        first, deep = chain[f"{op}_first"]["p50_ms"], chain[f"{op}_deep"]["p50_ms"]
        lines.append(
            f"| {op} | {_ms(first)} | {_ms(deep)} | within 10 % {mark(deep <= first * 1.1)} |"
        )
    extra_ok = hist["extra_ms"] <= 40 and hist["step_mib"] <= 4
    lines += [
        "",
        f"History: an `exec` that writes a few KiB costs {_ms(hist['extra_ms'])} more with "
        f"history than without and {hist['step_mib']:.1f} MiB of disk a step "
        f"(targets ≤ 40 ms, ≤ 4 MiB {mark(extra_ok)}); 20 steps after one that wrote "
        f"200 MiB: {hist['twenty_steps_mib']:.0f} MiB in all "
        f"(target ≤ 300 MiB {mark(hist['twenty_steps_mib'] <= 300)}).",
    ]
    return lines


def _portable_lines(portable: Mapping[str, Any]) -> list[str]:
    if not portable:
        return []
    lines = [
        "",
        "## Push and pull",
        "",
        f"To and from an S3-compatible store ({portable['store']}, on this host). *fresh*: "
        "a new session's first checkpoint into an empty store (its lineage, the image "
        "template, goes too) and into an empty home; *child*: a second checkpoint of that "
        "session after the guest wrote 4 MiB (only the pages that differ from its parent's, "
        "and its new disk layer).",
        "",
        "| checkpoint | push | pushed | pull | pulled |",
        "|---|---:|---:|---:|---:|",
    ]
    for label in ("fresh", "child"):
        row = portable.get(label)
        if row:
            lines.append(
                f"| {label} | {_ms(row['push_ms'])} | {row['push_bytes'] / 2**20:.1f} MiB | "
                f"{_ms(row['pull_ms'])} | {row['pull_bytes'] / 2**20:.1f} MiB |"
            )
    return lines


def _e2b_lines(e2b: Mapping[str, Any]) -> list[str]:
    if not e2b:
        return []
    lines = [
        "",
        "## E2B",
        "",
        "The official `e2b` SDK (`AsyncSandbox`) against `forkpoint serve --e2b`'s gateway.",
        "",
        "| operation | p50 | p95 | n |",
        "|---|---:|---:|---:|",
    ]
    for name, label in (
        ("create_first_command", "E2B create → first command result"),
        ("create_first_run_code", "E2B create → first `run_code` result"),
        ("create_template_from_code", "E2B create → a template-from-code's server answers"),
        ("fork3", "E2B fork x3"),
    ):
        entry = e2b.get(name)
        if entry is not None:
            lines.append(
                f"| {label} | {_ms(entry['p50_ms'])} | {_ms(entry['p95_ms'])} | {entry['n']} |"
            )
    return lines


def _cli_lines(cli: Mapping[str, Any]) -> list[str]:
    if not cli:
        return []
    lines = [
        "",
        "## CLI overhead",
        "",
        "Wall time of one `forkpoint` process, as a CLI-driven agent pays it on every call.",
        "",
        "| command | p50 | p95 | n | target (p50) |",
        "|---|---:|---:|---:|---|",
    ]
    for name, command in (
        ("ls", "ls --json"),
        ("show", "show S --json"),
        ("exec", "exec S -- true"),
    ):
        entry = cli.get(name)
        if entry is None:
            continue
        target = "—"
        if entry.get("target_ms") is not None:
            target = f"≤ {_ms(entry['target_ms'])} {'✅' if entry['meets_target'] else '❌'}"
        lines.append(
            f"| `forkpoint {command}` | {_ms(entry['p50_ms'])} | {_ms(entry['p95_ms'])} | "
            f"{entry['n']} | {target} |"
        )
    return lines


MEMORY_NOTE = "512 MiB guest running a web server (a socket-level Python HTTP server), idle."


def write_report(result: Mapping[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``bench.json`` and ``bench.md`` into ``out``; returns their paths."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "bench.json", out / "bench.md"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path.write_text(render_markdown(result))
    return json_path, md_path


def _ready_vs_cold_boot(result: Mapping[str, Any]) -> str:
    ready = result.get("ready", {}).get("create")
    cold = result["baselines"].get("cold_boot_create")
    if not ready or not cold or ready["p50_ms"] <= 0:
        return ""
    ratio = cold["p50_ms"] / ready["p50_ms"]
    return f", which a created session's *ready* beats {_ratio(ratio)}"


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def _ratio(value: float) -> str:
    return f"{value:.1f}×" if value < 10 else f"{value:.0f}×"
