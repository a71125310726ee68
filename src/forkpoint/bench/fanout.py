"""Fan-out and density: what many idle forks cost, and the figures they are compared with.

``density`` measures live forks once they all serve: the PSS of each fork's QEMU and of
its network helper (passt) separately, and the CPU both use per VM over a quiet window.
``fanout_rows`` sets each measurement beside the figure forkpoint had before this work
and the peer figure it chases (both fixed, with their sources), so one report shows
how far each target is.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forkpoint.store import SessionRecord
from forkpoint.vm.process import stat_fields

__all__ = ["density", "fanout_rows", "pss_mib"]

_TICK_S = 1 / os.sysconf("SC_CLK_TCK")

# Targets of the fan-out work (p50; MiB per fork; % of one core per idle VM).
TARGETS: dict[str, float] = {
    "fork20": 500,
    "fork20_ready": 1500,
    "fork100_ready": 4000,
    "memory_per_fork_mib": 20,
    "create": 30,
    "create_warm": 30,
    "rollback": 50,
    "rollback_standby": 50,
    "pause_1gib": 100,
    "idle_cpu_pct": 1.0,
}

# What forkpoint measured before (README table of the last full run on this host, and the
# figures the fan-out issue quotes), and the peers' published figures (vendor numbers on
# KVM hosts with more cores: compare per child and per core).
PREVIOUS: dict[str, str] = {
    "fork20": "1.62 s",
    "fork20_ready": "3.36 s",
    "fork100": "— (`fork --count 64`: 16.5 s)",
    "memory_per_fork_mib": "51 MiB (measured as they served, not idle)",
    "create": "78 ms",
    "create_warm": "78 ms (no warm VMs)",
    "rollback": "105 ms",
    "rollback_standby": "91 ms (no standby: the last full run's rollback)",
    "pause_1gib": "≈ 530 ms (whole checkpoint)",
    "idle_cpu_pct": "≈ 6 % (2.7 % measured alone)",
}
PEERS: dict[str, str] = {
    "fork20": "CubeSandbox ≈ 5.4 ms a child (100 in 541 ms); forkd ≈ 1 ms (100 in 101 ms)",
    "fork100": "CubeSandbox 541 ms; forkd 101 ms",
    "memory_per_fork_mib": "CubeSandbox ≈ 25 MB an idle VM",
    "create": "CubeSandbox local resume 154 ms (XFS, 2 GiB VM)",
    "create_warm": "CubeSandbox local resume 154 ms (XFS, 2 GiB VM)",
    "rollback": "CubeSandbox local resume 154 ms (XFS, 2 GiB VM)",
    "rollback_standby": "CubeSandbox local resume 154 ms (XFS, 2 GiB VM)",
    "pause_1gib": "CubeSandbox pause 106 ms (XFS)",
}


def pss_mib(pid: int) -> float:
    """Proportional set size of ``pid`` in MiB (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 if it is gone)."""
    fields = stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


def _total_cpu_s(pids: Sequence[int]) -> float:
    return sum(_cpu_s(pid) for pid in pids)


def _total_pss_mib(pids: Sequence[int]) -> float:
    return sum(pss_mib(pid) for pid in pids)


async def density(
    records: Sequence[SessionRecord], *, settle_s: float, window_s: float
) -> dict[str, Any]:
    """Memory and idle CPU of live forks, per fork (``records``: their store rows), after
    ``settle_s`` (their guests finish re-translating), CPU over ``window_s``."""
    await asyncio.sleep(settle_s)
    qemus = [r.qemu_pid for r in records if r.qemu_pid]
    helpers = [pid for r in records for pid in r.aux_pids if pid]
    count = max(len(qemus), 1)
    before = await asyncio.to_thread(_total_cpu_s, qemus + helpers)
    await asyncio.sleep(window_s)
    used = await asyncio.to_thread(_total_cpu_s, qemus + helpers) - before
    qemu_mib = await asyncio.to_thread(_total_pss_mib, qemus) / count
    helper_mib = await asyncio.to_thread(_total_pss_mib, helpers) / count
    return {
        "forks": len(qemus),
        "qemu_mib": round(qemu_mib, 1),
        "helper_mib": round(helper_mib, 1),
        "per_fork_mib": round(qemu_mib + helper_mib, 1),
        "total_mib": round((qemu_mib + helper_mib) * len(qemus), 1),
        "idle_cpu_pct": round(used / window_s / count * 100, 2),
        "window_s": window_s,
    }


def fanout_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """Rows: measure, now, before, target (met?), peer. Left out: what was not measured."""
    ops, ready = result["ops"], result.get("ready", {})
    fanout = result.get("fanout", {})
    rows: list[list[str]] = []

    def row(key: str, label: str, now: float | None, unit: str, target_key: str = "") -> None:
        if now is None:
            return
        target = TARGETS.get(target_key or key)
        cell = "—"
        if target is not None:
            cell = f"≤ {_fmt(target, unit)} {'✅' if now <= target else '❌'}"
        prev_key = key if key in PREVIOUS else target_key
        rows.append(
            [label, _fmt(now, unit), PREVIOUS.get(prev_key, "—"), cell,
             PEERS.get(key.removesuffix("_ready"), "—")]
        )  # fmt: skip

    def p50(entry: Mapping[str, Any] | None) -> float | None:
        return None if not entry else float(entry["p50_ms"])

    wide = fanout.get("fork100", {})
    row("fork20", "fork x20", p50(ops.get("fork20")), "ms")
    row("fork20_ready", "fork x20, all serving", p50(ready.get("fork20")), "ms")
    warm20 = fanout.get("fork20_warm", {})
    row("fork20", "fork x20 from warm VMs", p50(warm20.get("op")), "ms")
    row("fork20_ready", "fork x20 from warm VMs, all serving", p50(warm20.get("ready")), "ms")
    row("fork100", "fork x100", p50(wide.get("op")), "ms", "")
    row("fork100_ready", "fork x100, all serving", p50(wide.get("ready")), "ms")
    warm100 = fanout.get("fork100_warm", {})
    row("fork100", "fork x100 from warm VMs", p50(warm100.get("op")), "ms", "")
    row("fork100_ready", "fork x100 from warm VMs, all serving", p50(warm100.get("ready")), "ms")
    for count in ("20", "100"):
        measured = fanout.get("density", {}).get(count)
        if measured:
            row(
                "memory_per_fork_mib",
                f"memory per idle fork, {measured['forks']} live "
                f"(QEMU {measured['qemu_mib']:.0f} + passt {measured['helper_mib']:.0f})",
                measured["per_fork_mib"],
                "MiB",
            )
    row("create", "create", p50(ops.get("create")), "ms")
    row("create_warm", "create from a warm VM", p50(fanout.get("create_warm")), "ms")
    row("rollback", "rollback", p50(ops.get("rollback")), "ms")
    row(
        "rollback_standby",
        "rollback with a standby QEMU",
        p50(fanout.get("rollback_standby")),
        "ms",
    )
    row(
        "fork1_listeners",
        "fork x1 whose guest has a process to tell",
        p50(fanout.get("fork1_listeners")),
        "ms",
    )
    gib = next((r for r in result.get("scaling", []) if r["in_use_mib"] >= 1024), None)
    if gib and gib.get("pause_p50_ms") is not None:
        row("pause_1gib", "checkpoint pause, 1 GiB written", gib["pause_p50_ms"], "ms")
    idle = fanout.get("density", {}).get("20")
    if idle:
        row("idle_cpu_pct", "CPU of an idle VM (QEMU + passt)", idle["idle_cpu_pct"], "%")
    return rows


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"
    if unit == "%":
        return f"{value:.1f} %"
    return f"{value:.0f} {unit}"
