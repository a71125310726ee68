"""forkpoint bench: the statistics, the report rendering, and one real quick run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from forkpoint.bench import build_result, op_rows, percentile, render_markdown, summarize
from forkpoint.bench.fanout import fanout_rows, pss_mib
from forkpoint.bench.report import BASELINES, OPS, READY, TARGETS, write_report

# -- stats -----------------------------------------------------------------------------


def test_percentile_of_known_data() -> None:
    data = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(data, 50) == pytest.approx(50.5)
    assert percentile(data, 95) == pytest.approx(95.05)
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 100.0


def test_percentile_interpolates_and_ignores_order() -> None:
    assert percentile([30.0, 10.0, 20.0], 50) == 20.0
    assert percentile([40.0, 10.0, 30.0, 20.0], 50) == 25.0  # mean of the middle two
    assert percentile([10.0, 20.0], 95) == pytest.approx(19.5)
    assert percentile([7.0], 95) == 7.0


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize() -> None:
    summary = summarize([100.0, 120.0, 110.0, 400.0, 105.0])
    assert summary == {"p50_ms": 110.0, "p95_ms": 344.0, "n": 5}


def test_pss_of_this_process_and_of_no_process() -> None:
    assert pss_mib(os.getpid()) > 1.0
    assert pss_mib(2**22 + 12345) == 0.0  # above pid_max's default: never a process


# -- report ----------------------------------------------------------------------------


def _synthetic() -> dict[str, Any]:
    def s(p50: float, n: int = 10) -> dict[str, Any]:
        return {"p50_ms": p50, "p95_ms": p50 * 1.5, "n": n}

    ops = {
        "create": s(100.0),
        "checkpoint": s(200.0),
        "fork1": s(120.0),
        "fork3": s(240.0),
        "fork20": s(2500.0),
        "rollback": s(150.0),
    }
    baselines = {
        "cold_boot_create": s(4000.0),
        "full_ram_checkpoint": s(1000.0),
        "full_ram_restore": s(600.0),
        "qemu_start_floor": s(40.0),
        "ram_copy_floor": s(30.0),
    }
    ready = {name: s(ops[name]["p50_ms"] * 4) for name in READY}
    return build_result(
        ops=ops,  # type: ignore[arg-type]
        ready=ready,  # type: ignore[arg-type]
        baselines=baselines,  # type: ignore[arg-type]
        memory={"fork20_total_mib": 2048.4, "method": "pss"},
        scaling=[
            {"in_use_mib": 64, "configured_mib": 2048, "checkpoint_p50_ms": 90.0},
            {"in_use_mib": 1024, "configured_mib": 2048, "checkpoint_p50_ms": 700.0},
        ],
        host={"cpus": 2, "accel": "tcg", "qemu_version": "7.2.22"},
        fork20_serving=20,
        wall_s=321.0,
    )


def test_result_shape_and_targets() -> None:
    result = _synthetic()
    assert set(result["ops"]) == set(OPS)
    assert set(result["baselines"]) == set(BASELINES)
    assert result["targets"] == TARGETS
    ops = result["ops"]
    assert ops["create"]["meets_target"] is True  # 100 <= 150
    assert ops["checkpoint"]["meets_target"] is False  # 200 > 150
    assert ops["fork3"]["meets_target"] is True
    assert ops["rollback"]["meets_target"] is True  # equal counts as met
    assert ops["fork20"]["meets_target"] is False
    assert ops["fork1"]["meets_target"] is None  # no target
    assert result["memory"]["meets_target"] is True
    json.dumps(result)  # serialisable


def test_rows_compare_with_baselines() -> None:
    rows = {row[0]: row for row in op_rows(_synthetic())}
    assert rows["create"][1:4] == ["100 ms", "150 ms", "10"]
    assert rows["create"][4].startswith("≤ 150 ms")
    assert rows["create"][5] == "400 ms"  # ready
    assert rows["create"][7] == "40× faster than cold boot"
    assert rows["checkpoint"][5] == "—"
    assert rows["checkpoint"][7] == "5.0× faster than full-RAM save"
    assert rows["fork x20"][6] == "full-RAM restore 600 ms ×20"
    assert rows["fork x20"][7] == "4.8× faster than full-RAM restore (per VM)"
    assert rows["fork x1"][4] == "—"


def test_fanout_rows_show_before_target_and_peer() -> None:
    base = _synthetic()
    base["scaling"][1]["pause_p50_ms"] = 80.0
    idle = {"forks": 20, "qemu_mib": 40.0, "helper_mib": 18.0, "per_fork_mib": 58.0}
    base["fanout"] = {
        "density": {"20": {**idle, "idle_cpu_pct": 0.5}},
        "fork100": {"op": {"p50_ms": 9000.0}, "ready": {"p50_ms": 30000.0}},
        "fork100_warm": {
            "op": {"p50_ms": 1500.0},
            "ready": {"p50_ms": 3500.0},
            "serving": 99,
            "count": 100,
        },
        "rollback_standby": {"p50_ms": 45.0},
    }
    rows = {row[0]: row for row in fanout_rows(base)}
    assert rows["rollback with a standby QEMU"][1:4] == [
        "45 ms",
        "91 ms (no standby: the last full run's rollback)",
        "≤ 50 ms ✅",
    ]
    assert rows["fork x100 from warm VMs"][1:4] == ["1500 ms", "— (`fork --count 64`: 16.5 s)", "—"]
    assert rows["fork x100 from warm VMs, all serving"][3] == "≤ 4000 ms ✅"
    assert rows["fork x20"][1:4] == ["2500 ms", "1.62 s", "≤ 500 ms ❌"]
    assert "CubeSandbox" in rows["fork x20"][4]
    assert rows["fork x100, all serving"][1:4] == ["30.0 s", "—", "≤ 4000 ms ❌"]
    memory = rows["memory per idle fork, 20 live (QEMU 40 + passt 18)"]
    assert memory[1:4] == ["58 MiB", "51 MiB (measured as they served, not idle)", "≤ 20 MiB ❌"]
    assert rows["checkpoint pause, 1 GiB written"][1:4] == [
        "80 ms",
        "≈ 530 ms (whole checkpoint)",
        "≤ 100 ms ✅",
    ]
    assert rows["CPU of an idle VM (QEMU + passt)"][3] == "≤ 1.0 % ✅"
    assert "## Fan-out and density" in render_markdown(base)
    assert "Of 100 from warm VMs: 99/100." in render_markdown(base)
    assert fanout_rows(_synthetic())[-1][0] == "rollback"  # nothing of what was not measured


def test_markdown_report(tmp_path: Path) -> None:
    json_path, md_path = write_report(_synthetic(), tmp_path / "out")
    assert json.loads(json_path.read_text())["ops"]["create"]["n"] == 10
    text = md_path.read_text()
    assert text == render_markdown(_synthetic())
    assert "| create | 100 ms | 150 ms | 10 | ≤ 150 ms ✅ |" in text
    assert "| checkpoint | 200 ms | 300 ms | 10 | ≤ 150 ms ❌ |" in text
    assert "| 1024 MiB | 2048 MiB | — | — | 700 ms |" in text
    assert "**2048 MiB**" in text
    assert "QEMU 7.2.22" in text and "20/20" in text


def test_slower_than_baseline_is_said_so() -> None:
    result = _synthetic()
    result["ops"]["checkpoint"]["p50_ms"] = 2000.0
    assert op_rows(result)[1][7] == "2.0× slower than full-RAM save"


# -- the real thing ----------------------------------------------------------------------


@pytest.mark.vm
@pytest.mark.timeout(600)
def test_quick_bench_runs_and_reports(tmp_path: Path) -> None:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", "bench", "--quick", "--json",
         "--out", str(tmp_path)],
        capture_output=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=590,
    )  # fmt: skip
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    result = json.loads(proc.stdout)
    assert json.loads((tmp_path / "bench.json").read_text()) == result
    assert "| create |" in (tmp_path / "bench.md").read_text()
    for group, names in (("ops", OPS), ("baselines", BASELINES)):
        assert set(result[group]) == set(names)
        for name in names:
            entry = result[group][name]
            assert entry["n"] >= 1 and entry["p50_ms"] > 0, (group, name, entry)
            assert entry["p95_ms"] >= entry["p50_ms"]
    assert set(result["ready"]) == set(READY)
    for name in READY:  # usable no sooner than the call returned
        assert result["ready"][name]["p50_ms"] >= result["ops"][name]["p50_ms"]
    assert result["memory"]["method"] == "pss"
    assert result["memory"]["fork20_total_mib"] > 0
    assert result["fork20_serving"] >= 1
    assert result["fanout"]["create_warm"]["n"] >= 1
    assert result["fanout"]["rollback_standby"]["n"] >= 1
    idle = result["fanout"]["density"]["20"]
    assert idle["forks"] >= 1 and idle["qemu_mib"] > 0 and idle["helper_mib"] > 0, idle
    assert 0 < idle["idle_cpu_pct"] < 100, idle
    assert "## Fan-out and density" in (tmp_path / "bench.md").read_text()
    assert [row["in_use_mib"] for row in result["scaling"]] == [64, 256]
    assert all(row["checkpoint_p50_ms"] > 0 for row in result["scaling"])
    assert result["host"]["cpus"] >= 1 and result["host"]["accel"] in ("kvm", "tcg")
    assert set(result["cli"]) == {"ls", "show", "exec"}
    assert result["cli"]["ls"]["target_ms"] == 120 and result["cli"]["ls"]["n"] >= 1
    assert "## CLI overhead" in (tmp_path / "bench.md").read_text()
    for label in ("fresh", "child"):  # push/pull (localbucket: a development dependency)
        row = result["portable"][label]
        assert row["push_bytes"] > 0 and row["pull_bytes"] == row["push_bytes"], row
        assert row["push_ms"] > 0 and row["pull_ms"] > 0, row
    assert result["portable"]["child"]["push_bytes"] < result["portable"]["fresh"]["push_bytes"]
    assert "## Push and pull" in (tmp_path / "bench.md").read_text()
    # How long the bench took is part of its report, not a pass/fail deadline here (a
    # loaded host or a slower release stretches TCG guests).
    assert 0 < result["wall_s"] <= wall + 1, (result["wall_s"], wall)
    assert "- bench wall time: " in (tmp_path / "bench.md").read_text()


def test_history_section() -> None:
    def s(p50: float, n: int = 3) -> dict[str, Any]:
        return {"p50_ms": p50, "p95_ms": p50 * 1.5, "n": n}

    base = _synthetic()
    history = {
        "diff_10k_cold": s(3400.0), "diff_10k_warm": s(1400.0, 6), "entries": 18110,
        "diff_target_ms": 3000.0,
    }  # fmt: skip
    result = build_result(
        ops=base["ops"], ready=base["ready"], baselines=base["baselines"],
        memory={"fork20_total_mib": 2048.4, "method": "pss"}, scaling=base["scaling"],
        host=base["host"], fork20_serving=20, history=history,
    )  # fmt: skip
    assert result["history"]["meets_target"] is True
    text = render_markdown(result)
    assert "## History" in text and "18,110 paths" in text
    assert "| diff, warm (target ≤ 3000 ms ✅) | 1400 ms | 2100 ms | 6 |" in text
    assert "## History" not in render_markdown(base)


def test_incremental_section_judges_each_target() -> None:
    def s(p50: float) -> dict[str, Any]:
        return {"p50_ms": p50, "p95_ms": p50, "n": 3}

    def row(wall: float, pause: float, new: float) -> dict[str, Any]:
        return {"wall": s(wall), "pause": s(pause), "new_mib_p50": new}

    base = _synthetic()
    incremental = {
        "first": row(936.0, 460.0, 216.3),
        "unchanged": row(103.0, 17.0, 0.2),
        "changed_8mib": row(289.0, 46.0, 12.4),  # too slow: ❌
        "chain": {
            "depth": 20, "fork_first": s(100.0), "fork_deep": s(105.0),
            "rollback_first": s(80.0), "rollback_deep": s(96.0),  # 20 % slower: ❌
        },
        "history": {"extra_ms": 30.0, "step_mib": 3.5, "twenty_steps_mib": 270.0},
    }  # fmt: skip
    result = build_result(
        ops=base["ops"], ready=base["ready"], baselines=base["baselines"],
        memory={"fork20_total_mib": 2048.4, "method": "pss"}, scaling=base["scaling"],
        host=base["host"], fork20_serving=20, incremental=incremental,
    )  # fmt: skip
    text = render_markdown(result)
    assert (
        "| again, nothing changed | 103 ms | 17 ms | 0.2 MiB | ≤ 150 ms / ≤ 60 ms / ≤ 4 MiB ✅ |"
        in text
    )
    assert (
        "| after 8 MiB written | 289 ms | 46 ms | 12.4 MiB | ≤ 200 ms / ≤ 80 ms / ≤ 16 MiB ❌ |"
        in text
    )
    assert "| fork | 100 ms | 105 ms | within 10 % ✅ |" in text
    assert "| rollback | 80 ms | 96 ms | within 10 % ❌ |" in text
    assert "(targets ≤ 40 ms, ≤ 4 MiB ✅)" in text and "270 MiB in all" in text
    assert "cost what changed" not in render_markdown(base)
