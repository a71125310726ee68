"""The flagship scenario, step by step, as a plain consumer of the runtime.

1. create a session (guest port 8000 forwarded), build the dashboard, start
   ``python3 -m http.server 8000`` in ``/app``, wait for the forward, screenshot;
2. checkpoint, fork x3; each fork's process list shows the server at the parent's PID
   before anyone touches it; steer each fork differently; screenshot each;
3. on the parent: SIGKILL the server, delete ``/app``, show the forward is dead; roll
   back; the file is back and the server runs at the same PID (not restarted); the page
   is pixel-identical except for the pulsing dot;
4. every platform operation is timed.

The scenario only records facts; :mod:`forkpoint.demo.report` renders them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import httpx
from rich.markup import escape

from forkpoint.browser import Browser, ScreenshotResult, compose_overview, diff_images
from forkpoint.demo.builder import APP_DIR, PAGE_PATH, STEPS, Builder, StepResult
from forkpoint.demo.chart import check_chart
from forkpoint.errors import ForkpointError, InternalError
from forkpoint.models import to_json_data

if TYPE_CHECKING:
    from forkpoint.agent_client import ProcessInfo
    from forkpoint.models import Session
    from forkpoint.runtime import Runtime

__all__ = [
    "DIFF_LIMIT",
    "FORK_DIFF_MIN",
    "FORK_STEPS",
    "REFERENCE_MS",
    "Log",
    "Scenario",
]

T = TypeVar("T")
Log = Callable[[str], None]

GUEST_PORT: Final = 8000
WIDTH, HEIGHT = 1280, 800
#: The reference system's timings (ms) for the same operations.
REFERENCE_MS: Final = {"create": 15_400.0, "checkpoint": 25_200.0, "fork3": 15_300.0,
                       "rollback": 5_600.0}  # fmt: skip
#: Largest share of pixels the rollback capture may differ in (only the dot animates).
DIFF_LIMIT: Final = 0.001
#: Smallest share of pixels a fork's capture must differ in to count as a new design.
FORK_DIFF_MIN: Final = 0.01
FORK_STEPS: Final = ("scandinavian", "crt", "chart")
SERVER_START_TIMEOUT_S: Final = 120.0
_RESTORED_SERVE_TIMEOUT_S = 30.0
_DEAD_PROBE_TIMEOUT_S = 3.0
_SERVER_ARGV = ["python3", "-m", "http.server", str(GUEST_PORT)]

SHOTS: Final = {
    "original": "01-original.png",
    "fork1": "02-fork1-scandinavian.png",
    "fork2": "03-fork2-crt.png",
    "fork3": "04-fork3-chart.png",
    "rollback": "05-rollback.png",
}
ROLLBACK_DIFF_PNG: Final = "06-rollback-diff.png"
OVERVIEW_PNG: Final = "overview.png"


@dataclass
class Scenario:
    """One run of the demo into ``out``; :meth:`run` returns the facts (report.json)."""

    runtime: Runtime
    builder: Builder
    out: Path
    log: Log = field(default=lambda _message: None)
    keep: bool = False
    facts: dict[str, Any] = field(default_factory=dict)
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))
    _browser: Browser | None = None
    _original_page: bytes = b""

    async def run(self) -> dict[str, Any]:
        """Run every step; cleans up (unless ``keep``) whatever happens.

        :raises ForkpointError: a platform operation or the builder failed (``facts``
            keeps what was recorded up to then).
        """
        await asyncio.to_thread(self.out.mkdir, parents=True, exist_ok=True)
        facts = self.facts
        facts.update(builder=self.builder.name, timings_ms={}, steps=[], screenshots={})
        sessions: list[str] = []
        checkpoint: str | None = None
        try:
            self._browser = await self._in_browser(Browser)
            await self._in_browser(self._browser.open)
            parent = await self._create(sessions)
            await self._build_and_serve(parent)
            checkpoint = await self._checkpoint(parent)
            forks = await self._fork(checkpoint, sessions)
            await self._steer_forks(forks)
            await self._break_and_roll_back(parent, checkpoint)
            self._overview()
            facts["checks"] = self.checks()
            facts["ok"] = all(facts["checks"].values())
            return facts
        finally:
            with contextlib.suppress(Exception):
                if self._browser is not None:
                    await self._in_browser(self._browser.close)
            self._pool.shutdown(wait=False)
            if self.keep:
                facts["kept"] = {"sessions": sessions, "checkpoint": checkpoint}
            else:
                await self._clean_up(sessions, checkpoint)

    # -- the steps ---------------------------------------------------------------------

    async def _create(self, sessions: list[str]) -> Session:
        self._step("1", "create a session with guest port 8000 forwarded")
        # The first create on a machine boots the image once (its template); keep that
        # one-time cost out of the create timing, and say so.
        template_ms = await self.runtime.prepare()
        self.facts["template_ms"] = round(template_ms, 1)
        self._fact("image template ready (booted once per image, then cached)", template_ms)
        started = time.perf_counter()
        parent = await self.runtime.create(ports=[GUEST_PORT])
        self._time("create", started)
        sessions.append(parent.id)
        url = _url(parent)
        self.facts.update(session_id=parent.id, url=url)
        self._fact(f"session [cyan]{parent.id}[/] → {url}", self.facts["timings_ms"]["create"])
        return parent

    async def _build_and_serve(self, parent: Session) -> None:
        rt, facts = self.runtime, self.facts
        self._fact(f"builder ({escape(self.builder.name)}): {STEPS['original'].title.lower()}")
        await self._record(await self.builder.build(STEPS["original"], parent.id))
        spawned = await rt.spawn(parent.id, _SERVER_ARGV, cwd=APP_DIR)
        facts["server_pid"] = spawned.pid
        self._fact(f"started `{' '.join(_SERVER_ARGV)}` in {APP_DIR}: pid {spawned.pid}")
        url = facts["url"]
        waited = await _wait_http(url, SERVER_START_TIMEOUT_S)
        facts["server_ready_s"] = round(waited, 1)
        self._fact(f"the forward answers after {waited:.1f} s (guest python under emulation)")
        self._original_page = await rt.read_file(parent.id, PAGE_PATH)
        facts["page_bytes"] = len(self._original_page)
        facts["page_sha256"] = hashlib.sha256(self._original_page).hexdigest()
        processes = await rt.ps(parent.id)
        facts["parent_ps"] = _ps(processes)
        facts["server_started_ticks"] = await self._start_ticks(parent.id, spawned.pid)
        shot = await self._shot("original", url)
        facts["original_text"] = shot.text
        facts["original_title"] = shot.title

    async def _checkpoint(self, parent: Session) -> str:
        self._step("2", "checkpoint, fork x3, steer each fork differently")
        started = time.perf_counter()
        checkpoint = await self.runtime.checkpoint(parent.id, name="demo-dashboard")
        self._time("checkpoint", started)
        self.facts["checkpoint_id"] = checkpoint.id
        self.facts["checkpoint"] = to_json_data(checkpoint)
        self._fact(
            f"checkpoint [cyan]{checkpoint.id}[/] (VM paused {checkpoint.pause_ms:.0f} ms, "
            f"{checkpoint.size_bytes / 2**20:.1f} MiB)",
            self.facts["timings_ms"]["checkpoint"],
        )
        return checkpoint.id

    async def _fork(self, checkpoint: str, sessions: list[str]) -> list[Session]:
        rt, facts = self.runtime, self.facts
        started = time.perf_counter()
        results = await rt.fork(checkpoint, 3)
        self._time("fork3", started)
        forks = [r for r in results if not isinstance(r, ForkpointError)]
        sessions.extend(f.id for f in forks)
        failed = [r for r in results if isinstance(r, ForkpointError)]
        if failed:
            raise failed[0]
        facts["fork_ids"] = [f.id for f in forks]
        facts["fork_urls"] = [_url(f) for f in forks]
        self._fact(
            "forks " + ", ".join(f"[cyan]{f.id}[/]" for f in forks), facts["timings_ms"]["fork3"]
        )
        # Before any instruction: the server is already there, at the parent's PID.
        listings = await asyncio.gather(*(rt.ps(f.id) for f in forks))
        facts["fork_ps"] = [_ps(p) for p in listings]
        facts["fork_server_pids"] = [_server_pid(p) for p in listings]
        same = all(pid == facts["server_pid"] for pid in facts["fork_server_pids"])
        self._fact(
            f"before any instruction, each fork already runs the server: pids "
            f"{facts['fork_server_pids']} (parent: {facts['server_pid']})",
            ok=same,
        )
        return forks

    async def _steer_forks(self, forks: list[Session]) -> None:
        rt, facts = self.runtime, self.facts
        results = await asyncio.gather(
            *(
                self.builder.build(STEPS[key], f.id)
                for key, f in zip(FORK_STEPS, forks, strict=True)
            )
        )
        for result in results:
            await self._record(result)
        diffs: list[dict[str, Any]] = []
        for index, (key, fork) in enumerate(zip(FORK_STEPS, forks, strict=True), start=1):
            url = _url(fork)
            await _wait_http(url, _RESTORED_SERVE_TIMEOUT_S)
            name = f"fork{index}"
            await self._shot(name, url, f"{STEPS[key].title.lower()} → {url}")
            diff = diff_images(self._path("original"), self._path(name))
            diffs.append({"fork": name, "design": key, "fraction": round(diff.fraction, 4)}
                         | diff.to_dict())  # fmt: skip
        facts["fork_diffs"] = diffs
        facts["fork_design_differs"] = [d["fraction"] > FORK_DIFF_MIN for d in diffs]
        self._fact(
            "each fork looks different from the original: "
            + ", ".join(f"{d['design']} {d['fraction']:.1%}" for d in diffs),
            ok=all(facts["fork_design_differs"]),
        )
        html = (await rt.read_file(forks[2].id, PAGE_PATH)).decode(errors="replace")
        check = check_chart(html)
        facts["chart_check"] = check.to_dict()
        bars = ", ".join(f"{b.label}→{b.height:g}px" for b in check.bars)
        problems = "; ".join(check.problems)
        self._fact(f"chart read back from the guest: {bars or 'no bars'} {problems}", ok=check.ok)

    async def _break_and_roll_back(self, parent: Session, checkpoint: str) -> None:
        rt, facts = self.runtime, self.facts
        url, pid = facts["url"], facts["server_pid"]
        self._step("3", "on the parent: kill the server, delete the app, roll back")
        await rt.kill_process(parent.id, pid, "KILL")
        await rt.remove_file(parent.id, APP_DIR)
        facts["server_running_after_kill"] = _server_pid(await rt.ps(parent.id)) is not None
        error = await _probe_dead(url)
        facts["forward_dead_after_kill"] = error is not None
        facts["forward_error_after_kill"] = error
        self._fact(
            f"SIGKILL pid {pid}, rm -r {APP_DIR}: {url} → {escape(error or 'still answers!')}",
            ok=error is not None,
        )
        started = time.perf_counter()
        rolled = await rt.rollback(parent.id, checkpoint)
        self._time("rollback", started)
        facts["rollback_same_url"] = _url(rolled) == url
        self._fact(f"rolled back to [cyan]{checkpoint}[/]", facts["timings_ms"]["rollback"])
        page = await rt.read_file(parent.id, PAGE_PATH)
        facts["file_back_after_rollback"] = page == self._original_page
        processes = await rt.ps(parent.id)
        facts["rollback_ps"] = _ps(processes)
        facts["rollback_server_pid"] = _server_pid(processes)
        ticks = await self._start_ticks(parent.id, facts["rollback_server_pid"])
        facts["rollback_server_started_ticks"] = ticks
        # Same PID *and* same kernel start time: the very process, restored from memory.
        facts["server_restarted"] = not (
            facts["rollback_server_pid"] == pid and ticks == facts["server_started_ticks"]
        )
        self._fact(
            f"{PAGE_PATH} is back ({len(page)} bytes, identical: "
            f"{facts['file_back_after_rollback']}); server at pid "
            f"{facts['rollback_server_pid']}, start time unchanged → not restarted",
            ok=facts["file_back_after_rollback"] and not facts["server_restarted"],
        )
        await _wait_http(url, _RESTORED_SERVE_TIMEOUT_S)
        await self._shot("rollback", url)
        diff = diff_images(
            self._path("original"), self._path("rollback"), out=self.out / ROLLBACK_DIFF_PNG
        )
        facts["rollback_diff"] = diff.to_dict() | {"fraction": diff.fraction}
        facts["rollback_diff_image"] = ROLLBACK_DIFF_PNG
        boxes = ", ".join(f"{w}x{h} at ({x},{y})" for x, y, w, h in diff.boxes) or "none"
        self._fact(
            f"pixel diff against the first capture: {diff.differing_pixels} of "
            f"{diff.total_pixels} px ({diff.fraction:.4%}); regions: {boxes}",
            ok=diff.fraction < DIFF_LIMIT,
        )

    def _overview(self) -> None:
        facts = self.facts
        pids = facts["fork_server_pids"]
        captions = {
            "original": f"original · server pid {facts['server_pid']}",
            "fork1": f"fork 1 · Scandinavian · pid {pids[0]}",
            "fork2": f"fork 2 · CRT terminal · pid {pids[1]}",
            "fork3": f"fork 3 · + 7-day chart · pid {pids[2]}",
            "rollback": (
                f"parent after rollback · pid {facts['rollback_server_pid']}\n"
                f"diff {facts['rollback_diff']['differing_pixels']} px"
            ),
        }
        items = [(captions[key], self._path(key)) for key in SHOTS]
        compose_overview(items, self.out / OVERVIEW_PNG, thumb_width=480, columns=5)
        facts["overview"] = OVERVIEW_PNG

    # -- facts -------------------------------------------------------------------------

    def checks(self) -> dict[str, bool]:
        """The scenario's claims, each true or false."""
        f = self.facts
        text = f.get("original_text", "")
        pid = f.get("server_pid")
        return {
            "page_rendered": "roast" in text.lower(),
            "forks_run_server_at_same_pid": bool(f.get("fork_server_pids"))
            and all(p == pid for p in f["fork_server_pids"]),
            "fork_designs_differ": bool(f.get("fork_design_differs"))
            and all(f["fork_design_differs"]),
            "chart_bars_proportional": bool(f.get("chart_check", {}).get("ok")),
            "forward_dead_after_kill": bool(f.get("forward_dead_after_kill")),
            "file_back_after_rollback": bool(f.get("file_back_after_rollback")),
            "server_same_pid_after_rollback": f.get("rollback_server_pid") == pid,
            "server_not_restarted": f.get("server_restarted") is False,
            "rollback_pixel_identical_but_dot": f.get("rollback_diff", {}).get("fraction", 1.0)
            < DIFF_LIMIT,
        }

    # -- helpers -----------------------------------------------------------------------

    async def _in_browser(self, fn: Callable[..., T], *args: Any) -> T:
        # Playwright's sync objects belong to the thread that made them: one thread, always.
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _shot(self, key: str, url: str, label: str | None = None) -> ScreenshotResult:
        assert self._browser is not None
        out = self._path(key)
        result = await self._in_browser(self._browser.screenshot, url, out, WIDTH, HEIGHT)
        self.facts["screenshots"][key] = out.name
        self._fact(f"screenshot {label or key}: {out.name} ({result.duration_ms:.0f} ms)")
        return result

    def _path(self, key: str) -> Path:
        return self.out / SHOTS[key]

    async def _record(self, result: StepResult) -> None:
        self.facts["steps"].append(result.to_dict())
        usage = f", usage {result.usage}" if result.usage else ""
        self._fact(f"  {result.step} on {result.session_id}: {result.duration_ms:.0f} ms{usage}")

    async def _start_ticks(self, session_id: str, pid: int | None) -> int | None:
        """The process's start time (clock ticks after boot, /proc/PID/stat field 22)."""
        if pid is None:
            return None
        result = await self.runtime.exec(session_id, ["cat", f"/proc/{pid}/stat"])
        if result.exit_code != 0:
            return None
        fields = result.stdout.rsplit(")", 1)[-1].split()
        return int(fields[19]) if len(fields) > 19 else None

    def _time(self, op: str, started: float) -> None:
        self.facts["timings_ms"][op] = round((time.perf_counter() - started) * 1000, 1)

    def _step(self, number: str, title: str) -> None:
        self.log(f"\n[bold]{number}. {escape(title)}[/]")

    def _fact(self, text: str, ms: float | None = None, ok: bool | None = None) -> None:
        mark = {None: "[dim]·[/]", True: "[green]✓[/]", False: "[bold red]✗[/]"}[ok]
        timing = f"  [yellow]{ms:.0f} ms[/]" if ms is not None else ""
        self.log(f"  {mark} {text}{timing}")

    async def _clean_up(self, sessions: list[str], checkpoint: str | None) -> None:
        problems: list[str] = []
        for session in reversed(sessions):  # forks first, then the parent
            try:
                await self.runtime.remove(session)
            except ForkpointError as error:
                problems.append(error.message)
        if checkpoint is not None:
            try:
                await self.runtime.remove_checkpoint(checkpoint)
            except ForkpointError as error:
                problems.append(error.message)
        if problems:
            self.facts["cleanup_problems"] = problems
            self.log(f"[yellow]cleanup: {escape('; '.join(problems))}[/]")
        else:
            self.log("[dim]cleaned up: forks, parent and checkpoint removed[/]")


def _url(session: Session) -> str:
    port = session.port(GUEST_PORT)
    if port is None:
        raise InternalError(f"session {session.id} has no forward for guest port {GUEST_PORT}")
    return port.url


def _ps(processes: list[ProcessInfo]) -> list[dict[str, Any]]:
    return [{"pid": p.pid, "ppid": p.ppid, "cmd": p.cmd} for p in processes]


def _server_pid(processes: list[ProcessInfo]) -> int | None:
    return next((p.pid for p in processes if "http.server" in p.cmd), None)


async def _wait_http(url: str, timeout_s: float) -> float:
    """Poll ``url`` until it answers 200; returns seconds waited. :raises InternalError:"""
    started = time.perf_counter()
    last = "no answer"
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.perf_counter() - started < timeout_s:
            try:
                response = await client.get(url)
                if response.status_code == 200:
                    return time.perf_counter() - started
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as error:
                last = type(error).__name__
            await asyncio.sleep(0.25)
    raise InternalError(f"{url} did not answer within {timeout_s:g} s (last: {last})")


async def _probe_dead(url: str) -> str | None:
    """None if ``url`` still answers, else how the request failed."""
    try:
        async with httpx.AsyncClient(timeout=_DEAD_PROBE_TIMEOUT_S) as client:
            response = await client.get(url)
    except httpx.HTTPError as error:
        return f"{type(error).__name__}: {error}".rstrip(": ") or type(error).__name__
    return None if response.status_code < 500 else f"HTTP {response.status_code}"
