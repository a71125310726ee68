"""``forkpoint demo``: the flagship scenario end to end, and its parts.

The scenario runs ONCE per test session (module fixture, a real ``forkpoint demo --json``
subprocess); the VM tests assert the facts in its report.json. The pure parts (chart
check, usage parsing, pages, report rendering) are tested without a VM.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from forkpoint.browser import diff_images
from forkpoint.demo import AgentStepFailed, CommandBuilder, check_chart, parse_usage, write_report
from forkpoint.demo.builder import STEPS
from forkpoint.demo.pages import VARIANTS, page

FORKPOINT = [sys.executable, "-m", "forkpoint.cli.app"]
DEMO_TIMEOUT_S = 900


# -- without a VM ------------------------------------------------------------------------


def test_pages_are_single_self_contained_files() -> None:
    for variant in VARIANTS:
        html = page(variant)
        assert "Ember & Oak" in html and "Recent roast batches" in html
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), variant
        assert "@import" not in html and "url(" not in html
        assert "Date.now()" in html  # only the dot's phase depends on the clock
    assert page("original") != page("scandinavian") != page("crt")


def test_chart_check_accepts_honest_bars_and_rejects_a_liar() -> None:
    good = check_chart(page("chart"))
    assert good.ok, good.problems
    assert [b.label for b in good.bars] == ["168", "192", "144", "210", "186", "96", "72"]
    lying = page("chart").replace('height="168.0"', 'height="160"')
    bad = check_chart(lying)
    assert not bad.ok and "210" in bad.problems[0]
    assert not check_chart(page("original")).ok
    assert not check_chart("<svg><rect").ok  # malformed: a problem, not an exception


def test_chart_check_follows_group_translation() -> None:
    bars = "".join(
        f'<g transform="translate({i * 40},0)"><rect x="0" y="{100 - v}" width="30" '
        f'height="{v}"/><text x="15" y="90">{v} kg</text></g>'
        for i, v in enumerate((10, 20, 30, 40, 50, 60, 70))
    )
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="400" height="120">{bars}</svg>'
    result = check_chart(f"<html><body>{svg}</body></html>")
    assert result.ok, result.problems
    assert result.scale == pytest.approx(1.0)


def test_parse_usage() -> None:
    out = 'working…\n{"type":"result","usage":{"input_tokens":10,"output_tokens":5},'
    out += '"total_cost_usd":0.02}\n'
    assert parse_usage(out) == {"input_tokens": 10, "output_tokens": 5, "total_cost_usd": 0.02}
    assert parse_usage('{"prompt_tokens": 3, "completion_tokens": 4}') == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
    }
    assert parse_usage("no json here\n{not json}\n[1]") is None


def test_report_renders_partial_facts(tmp_path: Path) -> None:
    facts: dict[str, Any] = {
        "builder": "scripted",
        "timings_ms": {"create": 77.0},
        "steps": [],
        "screenshots": {},
        "error": {"code": "internal", "message": "boom"},
    }
    md, js = write_report(facts, tmp_path)
    assert "boom" in md.read_text()
    assert "| create | **77 ms** | 15.4 s | 200x |" in md.read_text()
    assert json.loads(js.read_text())["speedup"] == {"create": 200.0}


# -- the scenario, once, against real QEMU -----------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [*FORKPOINT, "demo", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    report = json.loads((out / "report.json").read_text())
    assert json.loads(proc.stdout) == report
    return report, out


@pytest.mark.vm
@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_forks_and_rollback_keep_the_same_server(demo: tuple[dict[str, Any], Path]) -> None:
    report, out = demo
    assert report["ok"] and all(report["checks"].values()), report["checks"]
    pid = report["server_pid"]
    assert isinstance(pid, int) and pid > 1
    assert report["fork_server_pids"] == [pid, pid, pid]
    assert report["rollback_server_pid"] == pid
    assert report["server_restarted"] is False
    assert report["forward_dead_after_kill"] is True
    assert report["file_back_after_rollback"] is True
    assert set(report["timings_ms"]) == {"create", "checkpoint", "fork3", "rollback"}
    assert all(ms > 0 for ms in report["timings_ms"].values())
    for name in ("report.md", "report.json", "overview.png"):
        assert (out / name).stat().st_size > 0
    markdown = (out / "report.md").read_text()
    for name in report["screenshots"].values():
        assert f"]({name})" in markdown  # images inline by relative path


@pytest.mark.vm
@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_screenshots(demo: tuple[dict[str, Any], Path]) -> None:
    report, out = demo
    shots = {key: out / name for key, name in report["screenshots"].items()}
    assert set(shots) == {"original", "fork1", "fork2", "fork3", "rollback"}
    # The original is a real render: several colours, and the dashboard's words.
    with Image.open(shots["original"]) as image:
        assert image.size == (1280, 800)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 20
    text = report["original_text"]
    for words in ("Ember & Oak Coffee Roasters", "Recent roast batches", "Batches today"):
        assert words.lower() in text.lower()
    # Rollback: identical except the pulsing dot.
    diff = report["rollback_diff"]
    assert diff["differing_pixels"] < 0.001 * diff["total_pixels"]
    again = diff_images(shots["original"], shots["rollback"])
    assert again.differing_pixels == diff["differing_pixels"]
    # Every fork's page differs visibly from the original.
    for key in ("fork1", "fork2", "fork3"):
        assert diff_images(shots["original"], shots[key]).fraction > 0.01, key
    assert all(report["fork_design_differs"])
    chart = report["chart_check"]
    assert chart["ok"] and len(chart["bars"]) == 7
    ratios = [bar["height"] / bar["value"] for bar in chart["bars"]]
    assert max(ratios) - min(ratios) < 0.01


@pytest.mark.vm
@pytest.mark.timeout(300)
def test_agent_builder_runs_a_command_in_the_guest() -> None:
    """``--agent CMD``'s builder with a trivial shell "agent" (cheap: no server, no fork)."""
    from forkpoint.runtime import Runtime

    agent = (
        'printf "<h1>%s</h1>" "$FORKPOINT_STEP" > index.html && '
        'cp "$FORKPOINT_PROMPT_FILE" prompt.md && '
        'echo "{\\"usage\\": {\\"input_tokens\\": 12, \\"output_tokens\\": 34}}"'
    )

    async def scenario() -> None:
        runtime = Runtime.open()
        session = await runtime.create()
        try:
            result = await CommandBuilder(runtime, agent).build(STEPS["original"], session.id)
            assert result.exit_code == 0
            assert result.usage == {"input_tokens": 12, "output_tokens": 34}
            assert await runtime.read_file(session.id, "/app/index.html") == b"<h1>original</h1>"
            prompt = await runtime.read_file(session.id, "/app/prompt.md")
            assert prompt.decode() == STEPS["original"].prompt
            with pytest.raises(AgentStepFailed) as failed:
                await CommandBuilder(runtime, "echo nope >&2; exit 3").build(
                    STEPS["crt"], session.id
                )
            assert failed.value.exit_code == 1 and "nope" in failed.value.message
        finally:
            await runtime.remove(session.id)
            runtime.close()

    asyncio.run(scenario())
