"""Render the scenario's facts: ``report.json`` (machine-readable) and ``report.md``
(for people: steps, facts, the timing table, images inline by relative path)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from forkpoint.demo.pages import ROASTERY
from forkpoint.demo.scenario import DIFF_LIMIT, REFERENCE_MS

__all__ = ["REPORT_JSON", "REPORT_MD", "format_ms", "speedups", "timing_rows", "write_report"]

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
_OPS = (("create", "create"), ("checkpoint", "checkpoint"), ("fork3", "fork x3"),
        ("rollback", "rollback"))  # fmt: skip
_CHECK_TEXT = {
    "page_rendered": "the dashboard rendered in a real browser through the forward",
    "forks_run_server_at_same_pid": "every fork woke up with the server running at the "
    "parent's PID, before any instruction",
    "fork_designs_differ": "each fork's page looks different from the original",
    "chart_bars_proportional": "the chart's bar heights are proportional to their labels",
    "forward_dead_after_kill": "after SIGKILL + rm -r /app the forward stopped answering",
    "file_back_after_rollback": "after rollback /app/index.html is back, byte for byte",
    "server_same_pid_after_rollback": "after rollback the server runs at the same PID",
    "server_not_restarted": "... and the same process start time: restored, not restarted",
    "rollback_pixel_identical_but_dot": "the page is pixel-identical except the pulsing dot",
}


def format_ms(ms: float) -> str:
    """``85 ms`` below 10 s, else ``12.3 s``."""
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def speedups(timings_ms: dict[str, float]) -> dict[str, float]:
    """Reference time / measured time per operation (higher is better)."""
    return {
        op: round(REFERENCE_MS[op] / ms, 1)
        for op, ms in timings_ms.items()
        if op in REFERENCE_MS and ms > 0
    }


def timing_rows(facts: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(operation, measured, reference, speed-up)`` for each timed operation."""
    timings = facts.get("timings_ms", {})
    factors = speedups(timings)
    return [
        (label, format_ms(timings[op]), format_ms(REFERENCE_MS[op]), f"{factors[op]:g}x")
        for op, label in _OPS
        if op in timings and op in factors
    ]


def write_report(facts: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``out``; returns their paths."""
    facts["reference_ms"] = dict(REFERENCE_MS)
    facts["speedup"] = speedups(facts.get("timings_ms", {}))
    json_path = _write(out / REPORT_JSON, json.dumps(facts, indent=2, default=str) + "\n")
    md_path = _write(out / REPORT_MD, _markdown(facts))
    return md_path, json_path


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _markdown(f: dict[str, Any]) -> str:
    lines: list[str] = [f"# forkpoint demo: {ROASTERY}", ""]
    checks: dict[str, bool] = f.get("checks", {})
    if "error" in f:
        lines += [f"**The demo stopped with an error:** {f['error'].get('message', '')}", ""]
    elif checks:
        failed = [k for k, ok in checks.items() if not ok]
        verdict = (
            f"**All {len(checks)} checks passed.**"
            if not failed
            else f"**{len(failed)} of {len(checks)} checks failed:** {', '.join(failed)}"
        )
        lines += [verdict, ""]
    if f.get("overview"):
        lines += [f"![original, three forks, rollback]({f['overview']})", ""]
    lines += _timings(f)
    lines += _build_section(f)
    lines += _fork_section(f)
    lines += _rollback_section(f)
    if checks:
        lines += ["## Checks", ""]
        lines += [f"- [{'x' if ok else ' '}] {_CHECK_TEXT.get(k, k)}" for k, ok in checks.items()]
        lines.append("")
    lines += _steps_section(f)
    return "\n".join(lines)


def _timings(f: dict[str, Any]) -> list[str]:
    rows = timing_rows(f)
    if not rows:
        return []
    out = ["## Timings", "", "| operation | forkpoint | reference system | speed-up |",
           "|---|--:|--:|--:|"]  # fmt: skip
    out += [f"| {op} | **{ms}** | {ref} | {factor} |" for op, ms, ref, factor in rows]
    out += [
        "",
        "Wall time of each platform call (`time.perf_counter()`), measured in this run.",
        "",
    ]
    return out


def _build_section(f: dict[str, Any]) -> list[str]:
    if "session_id" not in f:
        return []
    out = [
        "## 1. Build the dashboard and serve it",
        "",
        f"- Session `{f['session_id']}` with guest port 8000 forwarded to {f['url']}.",
        f"- Builder: {f['builder']}.",
    ]
    if "server_pid" in f:
        out.append(
            f"- `python3 -m http.server 8000` started in `/app` in the background: "
            f"**pid {f['server_pid']}**; the forward answered after {f.get('server_ready_s')} s."
        )
    if "original" in f.get("screenshots", {}):
        out += ["", f"![the original dashboard]({f['screenshots']['original']})"]
    return [*out, ""]


def _fork_section(f: dict[str, Any]) -> list[str]:
    if "checkpoint_id" not in f:
        return []
    ck = f.get("checkpoint", {})
    out = [
        "## 2. Checkpoint, fork three ways, steer each fork",
        "",
        f"- Checkpoint `{f['checkpoint_id']}`: VM paused {ck.get('pause_ms', '?')} ms, "
        f"{ck.get('size_bytes', 0) / 2**20:.1f} MiB on disk.",
    ]
    if "fork_ids" not in f:
        return [*out, ""]
    out += [
        "- Before any instruction, each fork's process list already shows the server at the "
        "parent's PID (nobody started it):",
        "",
        "| fork | session | URL | server pid | design | pixels changed vs original |",
        "|---|---|---|--:|---|--:|",
    ]
    diffs = f.get("fork_diffs", [{}, {}, {}])
    for i, (sid, url, pid) in enumerate(
        zip(f["fork_ids"], f["fork_urls"], f["fork_server_pids"], strict=True)
    ):
        d = diffs[i] if i < len(diffs) else {}
        share = f"{d['fraction']:.1%}" if "fraction" in d else "?"
        out.append(f"| {i + 1} | `{sid}` | {url} | {pid} | {d.get('design', '?')} | {share} |")
    out.append("")
    for i in (1, 2, 3):
        name = f.get("screenshots", {}).get(f"fork{i}")
        if name:
            design = diffs[i - 1].get("design", "") if i - 1 < len(diffs) else ""
            out += [f"**Fork {i}: {design}**", "", f"![fork {i}]({name})", ""]
    chart = f.get("chart_check")
    if chart:
        verdict = "proportional" if chart["ok"] else "NOT proportional"
        out += [
            f"The chart was read back from fork 3 (`/app/index.html`) and its SVG parsed: bars "
            f"are **{verdict}** (scale {chart.get('scale_px_per_unit')} px per kg, largest "
            f"error {chart.get('max_error_px')} px, tolerance {chart.get('tolerance_px')} px).",
            "",
            "| label | value | height (px) | px per unit |",
            "|---|--:|--:|--:|",
        ]
        for bar in chart["bars"]:
            per = bar["height"] / bar["value"] if bar["value"] else float("nan")
            out.append(f"| {bar['label']} | {bar['value']:g} | {bar['height']:g} | {per:.3f} |")
        out += [f"- problem: {p}" for p in chart.get("problems", [])]
        out.append("")
    return out


def _rollback_section(f: dict[str, Any]) -> list[str]:
    if "forward_dead_after_kill" not in f:
        return []
    out = [
        "## 3. Break the parent, then roll it back",
        "",
        f"- `kill -KILL {f['server_pid']}` and `rm -r /app` in the parent; the forward "
        f"{'stopped answering' if f['forward_dead_after_kill'] else 'STILL ANSWERED'}"
        f" ({f.get('forward_error_after_kill') or 'answered'}).",
    ]
    if "rollback_server_pid" in f:
        back = "is back, byte for byte" if f.get("file_back_after_rollback") else "is NOT back"
        restarted = "restarted?!" if f.get("server_restarted") else "not restarted"
        out += [
            f"- Rolled back to `{f['checkpoint_id']}` in "
            f"{format_ms(f['timings_ms'].get('rollback', 0))}; same URL: "
            f"{f.get('rollback_same_url')}.",
            f"- `/app/index.html` {back} ({f.get('page_bytes')} bytes).",
            f"- The killed server runs again at **pid {f['rollback_server_pid']}** with the "
            f"same kernel start time ({f.get('rollback_server_started_ticks')} ticks after "
            f"boot): restored from memory, {restarted}.",
        ]
    diff = f.get("rollback_diff")
    if diff:
        boxes = ", ".join(f"{w}x{h} px at ({x}, {y})" for x, y, w, h in diff["boxes"]) or "none"
        out += [
            f"- Pixel diff against the first screenshot: **{diff['differing_pixels']} of "
            f"{diff['total_pixels']} pixels** ({diff['fraction']:.4%}, limit "
            f"{DIFF_LIMIT:.1%}); changed regions: {boxes} (the pulsing status dot).",
            "",
            f"![after rollback]({f['screenshots'].get('rollback', '')})",
            "",
            f"![diff: changed pixels in red]({f.get('rollback_diff_image', '')})",
        ]
    return [*out, ""]


def _steps_section(f: dict[str, Any]) -> list[str]:
    steps = f.get("steps") or []
    if not steps:
        return []
    out = ["## Builder steps", "", "| step | session | wall time | usage |", "|---|---|--:|---|"]
    for s in steps:
        usage = ", ".join(f"{k} {v}" for k, v in (s.get("usage") or {}).items()) or "–"
        out.append(
            f"| {s['step']} | `{s['session_id']}` | {format_ms(s['duration_ms'])} | {usage} |"
        )
    return [*out, ""]
