"""The benchmark run: forkpoint's operations and the baselines, side by side, one run.

Everything it creates (sessions, checkpoints, scratch VMs and files) is removed in a
``finally``, also when the run is interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from forkpoint.errors import ForkpointError, InternalError
from forkpoint.images import get_image
from forkpoint.models import Session
from forkpoint.polling import poll_until
from forkpoint.runtime import Runtime
from forkpoint.runtime.capacity import host_limits
from forkpoint.runtime.sessions.machines import boot_files, has_restore_listeners
from forkpoint.store import SessionRecord, Store
from forkpoint.vm import BootFiles, MachineShape, detect_accel

from .baselines import Baselines
from .e2b import measure_e2b
from .fanout import density
from .history import measure_history
from .incremental import measure_incremental
from .portable import measure_portable
from .report import build_result
from .stats import Summary, summarize

__all__ = ["Plan", "Suite"]

T = TypeVar("T")

GUEST_PORT = 8000
MEMORY_MIB = 512
# A minimal HTTP server on the socket module alone: ``python3 -m http.server`` spends
# 10-20 s importing under TCG, which a quick run cannot afford.
SERVER_CODE = (
    "import socket\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {GUEST_PORT}))\n"
    "s.listen(64)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    c.recv(65536)\n"
    "    c.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: 3\\r\\n\\r\\nok\\n')\n"
    "    c.close()\n"
)
_SERVER_CMD = ["python3", "-S", "-c", SERVER_CODE]
_SERVER_TIMEOUT_S = 120.0
# A process that asks to be told of every restore (guest/restore.py), and does nothing.
_LISTENER = "import forkpoint_guest, time\nforkpoint_guest.on_restore(print)\ntime.sleep(1e9)"
_SERVING_TIMEOUT_S = 15.0
_FAN_SERVING_TIMEOUT_S = 180.0  # 100 TCG guests re-translating on 2 cores
_FORK_BUDGET_MIB = 160  # host memory a fork may need at most while it settles
_ALLOC_TIMEOUT_S = 300.0
_CLI_REPS = 10  # cheap: a process each


@dataclass(frozen=True)
class Plan:
    """How many repetitions of what. ``full()`` is the reference run, ``quick()`` a smoke
    run that finishes in under a minute."""

    reps: int  # create, checkpoint, fork1, fork3, rollback
    fork20_reps: int
    cold_boot_reps: int
    baseline_reps: int  # full-RAM checkpoint/restore, QEMU start, RAM copy
    scaling_mib: tuple[int, ...]
    scaling_reps: int
    scaling_memory_mib: int  # configured RAM of the scaling VM: more than it will use
    fork_wide: int = 20
    fork_widest: int = 100  # 0 leaves fork x100 out
    fork_warm: bool = True  # fork x20 from warm VMs too
    fork100_reps: int = 1
    # idle forks: wait for them to settle, then measure their CPU over a window
    idle_settle_s: float = 5.0
    idle_window_s: float = 10.0
    # diff with 10,000 files and history steps (bench/history.py): 0 leaves them out
    history_reps: int = 3

    @classmethod
    def full(cls) -> Plan:
        return cls(
            reps=10, fork20_reps=10, cold_boot_reps=10, baseline_reps=10,
            scaling_mib=(64, 256, 1024), scaling_reps=5, scaling_memory_mib=2048,
        )  # fmt: skip

    @classmethod
    def quick(cls) -> Plan:
        # The scaling VM uses the benchmark's own machine shape: its template exists.
        return cls(
            reps=3, fork20_reps=1, cold_boot_reps=1, baseline_reps=2,
            scaling_mib=(64, 256), scaling_reps=2, scaling_memory_mib=MEMORY_MIB,
            history_reps=0,  # making the 10,000 files alone takes a quick run's budget
            fork_widest=0, fork_warm=False, idle_settle_s=0.5, idle_window_s=2.0,
        )  # fmt: skip


async def _timed(awaitable: Awaitable[T]) -> tuple[float, T]:
    started = time.perf_counter()
    result = await awaitable
    return (time.perf_counter() - started) * 1000, result


class Suite:
    """One benchmark run against ``runtime``. ``log`` receives progress lines."""

    def __init__(
        self, runtime: Runtime, plan: Plan, log: Callable[[str], None] = lambda _: None
    ) -> None:
        self.runtime = runtime
        self.plan = plan
        self.log = log
        self._sessions: set[str] = set()
        self.fork_failures = 0
        self._baseline_runner: Baselines | None = None
        self._checkpoints: list[str] = []
        self._scratch = runtime.home.cache / f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._http = httpx.AsyncClient(timeout=5.0, trust_env=False)

    async def run(self) -> dict[str, Any]:
        """Measure everything; returns the ``bench.json`` document (see report)."""
        started = time.perf_counter()
        try:
            return await self._run(started)
        finally:
            await self._cleanup()

    async def _run(self, started: float) -> dict[str, Any]:
        plan = self.plan
        image = get_image(images=self.runtime.home.images)
        accel = detect_accel(self.runtime.build, self.runtime.home.cache, image.kernel)
        shape = MachineShape.for_build(self.runtime.build, accel, MEMORY_MIB, 1)
        boot = boot_files(image, shape)
        host = {
            "cpus": os.cpu_count() or 1,
            "accel": accel,
            "qemu_version": self.runtime.build.version,
        }
        self.log(f"host: {host['cpus']} cpus, {accel}, QEMU {host['qemu_version']}")

        # Warm-up (not timed): builds the image's template on first use.
        t, server = await _timed(self._create())
        self.log(f"warm-up create (template ready): {t:.0f} ms")

        ops: dict[str, Summary] = {}
        ready: dict[str, Summary] = {}
        ops["create"], ready["create"] = await self._repeat("create", plan.reps, self._create_once)
        fanout: dict[str, Any] = {"density": {}}
        fanout["create_warm"], _ = await self._repeat(
            "create (warm VM)", plan.reps, self._create_warm_once
        )

        t_srv = time.perf_counter()
        await self.runtime.spawn(server.id, _SERVER_CMD)
        url = _url(server)
        await self._wait_http(url, _SERVER_TIMEOUT_S)
        self.log(f"web server answering on {url} after {time.perf_counter() - t_srv:.1f} s")

        # Unique: a bench killed before its cleanup leaves its checkpoint behind.
        checkpoint = await self.runtime.checkpoint(server.id, name=f"bench-{uuid.uuid4().hex[:8]}")
        self._checkpoints.append(checkpoint.id)
        ops["checkpoint"], _ = await self._repeat(
            "checkpoint", plan.reps, lambda: self._checkpoint_once(server.id)
        )
        for count in (1, 3):
            ops[f"fork{count}"], ready[f"fork{count}"] = await self._repeat(
                f"fork{count}", plan.reps, functools.partial(self._fork, checkpoint.id, count)
            )

        # The same fork when the guest has a process to tell of it (it waits for that).
        told = await self._checkpoint_with_listener(server.id)
        fanout["fork1_listeners"], _ = await self._repeat(
            "fork1 (restore listeners)", plan.reps, functools.partial(self._fork, told, 1)
        )

        wide = plan.fork_wide
        fanned = await self._fan_out(checkpoint.id, wide, plan.fork20_reps)
        ops["fork20"], ready["fork20"] = summarize(fanned.op_ms), summarize(fanned.ready_ms)
        serving = fanned.serving
        memory: dict[str, Any] = {}
        if fanned.density:
            fanout["density"][str(wide)] = fanned.density
            memory = {
                "fork20_total_mib": fanned.density["total_mib"],
                "method": "pss",
                "forks_measured": fanned.density["forks"],  # fewer than 20 if some failed
            }
        if plan.fork_warm:
            warm = await self._fan_out(checkpoint.id, wide, plan.fork20_reps, warm=True)
            fanout["fork20_warm"] = {
                "op": summarize(warm.op_ms),
                "ready": summarize(warm.ready_ms),
            }
        widest = self._widest_allowed()
        if widest:
            most = await self._fan_out(checkpoint.id, widest, plan.fork100_reps)
            fanout[f"fork{widest}"] = {
                "op": summarize(most.op_ms),
                "ready": summarize(most.ready_ms),
                "serving": min(most.serving),
                "count": widest,
            }
            if most.density:
                fanout["density"][str(widest)] = most.density
            if plan.fork_warm:
                warm_most = await self._fan_out(checkpoint.id, widest, plan.fork100_reps, warm=True)
                fanout[f"fork{widest}_warm"] = {
                    "op": summarize(warm_most.op_ms),
                    "ready": summarize(warm_most.ready_ms),
                    "serving": min(warm_most.serving),
                    "count": widest,
                }

        ops["rollback"], ready["rollback"] = await self._repeat(
            "rollback", plan.reps, lambda: self._rollback_once(server.id, checkpoint.id, url)
        )
        fanout["rollback_standby"], _ = await self._repeat(
            "rollback (standby QEMU)",
            plan.reps,
            lambda: self._rollback_once(server.id, checkpoint.id, url, standby=True),
        )
        cli = await self._cli_overhead(server.id)
        e2b = await measure_e2b(self.runtime, plan.reps, self.log)
        history = (
            await measure_history(self.runtime, plan.history_reps, self.log)
            if plan.history_reps
            else None
        )
        portable = await measure_portable(self.runtime, self._scratch / "portable", self.log)
        incremental = await measure_incremental(self.runtime, plan.reps, self.log)

        baselines = await self._baselines(shape, boot, image, checkpoint.id)
        await self._remove_sessions([server])
        # Last: an idle TCG guest still burns CPU, which would slow the operations above.
        scaling = await self._scaling(await self._scaling_setup())

        result = build_result(
            ops=ops,
            ready=ready,
            baselines=baselines,
            memory=memory,
            scaling=scaling,
            host=host,
            fork20_serving=min(serving) if serving else 0,
            fanout=fanout,
            fork_failures=self.fork_failures,
            fork_wide=wide,
            quick=plan == Plan.quick(),
            wall_s=time.perf_counter() - started,
            cli=cli,
            e2b=e2b,
            history=history,
            portable=portable,
            incremental=incremental,
        )
        return result

    # -- forkpoint operations ----------------------------------------------------------

    async def _repeat(
        self, name: str, reps: int, once: Callable[[], Awaitable[tuple[float, float]]]
    ) -> tuple[Summary, Summary]:
        """Run ``once`` ``reps`` times; it returns (operation ms, ready ms): when the call
        returned, and when what it started was usable (see report)."""
        samples = [await once() for _ in range(reps)]
        summary = summarize([op for op, _ in samples])
        ready = summarize([ready for _, ready in samples])
        self.log(
            f"{name}: p50 {summary['p50_ms']:.0f} ms, p95 {summary['p95_ms']:.0f} ms "
            f"(n={summary['n']}); ready p50 {ready['p50_ms']:.0f} ms"
        )
        return summary, ready

    async def _create(self, memory_mib: int = MEMORY_MIB, *, serve: bool = True) -> Session:
        ports = [GUEST_PORT] if serve else []
        session = await self.runtime.create(memory_mib=memory_mib, ports=ports)
        self._sessions.add(session.id)
        return session

    async def _create_once(self) -> tuple[float, float]:
        """Ready: the new session's agent has run a command."""
        started = time.perf_counter()
        ms, session = await _timed(self._create())
        await self.runtime.exec(session.id, ["true"])
        ready_ms = (time.perf_counter() - started) * 1000
        await self._remove_sessions([session])
        return ms, ready_ms

    async def _create_warm_once(self) -> tuple[float, float]:
        """A create that takes a warm VM (started beforehand, untimed: a server refills
        its warm VMs in the background between creates)."""
        if await self.runtime.fill_warm(count=1, ports=[GUEST_PORT]) != 1:
            raise InternalError("no warm VM could be started")
        await asyncio.sleep(0.2)  # the filler's own CPU is done
        return await self._create_once()

    async def _checkpoint_once(self, session_id: str) -> tuple[float, float]:
        ms, checkpoint = await _timed(self.runtime.checkpoint(session_id))
        self._checkpoints.append(checkpoint.id)
        await self._remove_checkpoint(checkpoint.id)
        return ms, ms  # the VM runs on throughout

    async def _checkpoint_with_listener(self, session_id: str) -> str:
        """A checkpoint of ``session_id`` while a process waits to be told of restores
        (``forkpoint_guest.on_restore``), so its restores wait for the guest to tell it."""
        await self.runtime.spawn(session_id, ["python3", "-c", _LISTENER])
        deadline = time.monotonic() + _SERVER_TIMEOUT_S
        while time.monotonic() < deadline:
            checkpoint = await self.runtime.checkpoint(session_id)
            self._checkpoints.append(checkpoint.id)
            record = await asyncio.to_thread(self.runtime.store.get_checkpoint, checkpoint.id)
            if has_restore_listeners(record):
                return checkpoint.id
            await self._remove_checkpoint(checkpoint.id)
            await asyncio.sleep(0.5)  # the listener is still starting
        raise InternalError("the guest never had a restore listener to checkpoint")

    async def _fork_sessions(self, checkpoint_id: str, count: int) -> list[Session]:
        """The forks that started; a fork that failed is logged and counted, not fatal
        (under heavy host load a restored guest can miss the agent deadline)."""
        results = await self.runtime.fork(checkpoint_id, count)
        forks = [r for r in results if isinstance(r, Session)]
        self._sessions.update(s.id for s in forks)
        failed = [r for r in results if isinstance(r, ForkpointError)]
        if failed:
            self.fork_failures += len(failed)
            self.log(f"{len(failed)} of {count} forks failed: {failed[0].message}")
        if not forks:
            raise InternalError(f"all {count} forks failed: {failed[0].message}")
        return forks

    async def _fork(self, checkpoint_id: str, count: int) -> tuple[float, float]:
        """Ready: every fork answered HTTP through its own forward."""
        started = time.perf_counter()
        ms, forks = await _timed(self._fork_sessions(checkpoint_id, count))
        try:
            if await self._count_serving(forks) < len(forks):
                raise InternalError(f"not all of {len(forks)} forks served HTTP")
            ready_ms = (time.perf_counter() - started) * 1000
        finally:
            await self._remove_sessions(forks)
        return ms, ready_ms

    async def _rollback_once(
        self, session_id: str, checkpoint_id: str, url: str, *, standby: bool = False
    ) -> tuple[float, float]:
        """Ready: the restored web server answered HTTP. ``standby``: its QEMU started
        ahead (not timed; see runtime/restore/standby.py)."""
        if standby and not await self.runtime.prepare_rollback(session_id, checkpoint_id, limit=1):
            raise InternalError("no rollback standby started")
        started = time.perf_counter()
        ms, _ = await _timed(self.runtime.rollback(session_id, checkpoint_id))
        await self._wait_http(url, _SERVING_TIMEOUT_S)
        return ms, (time.perf_counter() - started) * 1000

    async def _count_serving(
        self, sessions: list[Session], timeout_s: float = _SERVING_TIMEOUT_S
    ) -> int:
        answers = await asyncio.gather(*(self._serves(_url(s), timeout_s) for s in sessions))
        return sum(answers)

    async def _fan_out(
        self, checkpoint_id: str, count: int, reps: int, *, warm: bool = False
    ) -> _FanOut:
        """Fork ``count`` at once ``reps`` times: operation and all-serving times; the
        first repetition's forks are also measured idle (memory, CPU) before removal.
        ``warm``: ``count`` warm VMs of the checkpoint are started first (untimed)."""
        result = _FanOut()
        for i in range(reps):
            if warm:
                await self.runtime.fill_warm(checkpoint=checkpoint_id, count=count)
                await asyncio.sleep(1.0)  # the warm VMs' start-up CPU is spent
            started = time.perf_counter()
            ms, forks = await _timed(self._fork_sessions(checkpoint_id, count))
            result.op_ms.append(ms)
            try:
                result.serving.append(await self._count_serving(forks, _FAN_SERVING_TIMEOUT_S))
                result.ready_ms.append((time.perf_counter() - started) * 1000)
                if i == 0 and not warm:
                    records = await asyncio.to_thread(_records, self.runtime.store, forks)
                    result.density = await density(
                        records, settle_s=self.plan.idle_settle_s, window_s=self.plan.idle_window_s
                    )
                    self.log(
                        f"{len(forks)} idle forks: {result.density['per_fork_mib']:.0f} MiB "
                        f"each (PSS), {result.density['idle_cpu_pct']:.2f} % of a core each"
                    )
            finally:
                await self._remove_sessions(forks)
            self.log(
                f"fork{count}{' (warm VMs)' if warm else ''} {i + 1}/{reps}: {ms:.0f} ms, "
                f"{result.serving[-1]} serving "
                f"after {result.ready_ms[-1]:.0f} ms"
            )
        return result

    def _widest_allowed(self) -> int:
        """The widest fan-out this host allows now (0: skipped, with the reason logged)."""
        count = self.plan.fork_widest
        if not count:
            return 0
        limit = host_limits().max_sessions
        if limit < count + 2:
            self.log(
                f"fork{count} skipped: FORKPOINT_MAX_SESSIONS={limit} allows fewer sessions "
                f"(make bench sets {count + 28})"
            )
            return 0
        available = _mem_available_mib()
        if available < count * _FORK_BUDGET_MIB:
            self.log(f"fork{count} skipped: {available} MiB of memory available")
            return 0
        return count

    # -- baselines ---------------------------------------------------------------------

    async def _baselines(
        self, shape: MachineShape, boot: BootFiles, image: Any, checkpoint_id: str
    ) -> dict[str, Summary]:
        plan = self.plan
        await asyncio.to_thread(self._scratch.mkdir, parents=True, exist_ok=True)
        runner = Baselines(self.runtime.build, shape, boot, image, self._scratch, self.log)
        self._baseline_runner = runner
        files = self.runtime.checkpoint_files(checkpoint_id)
        record = await asyncio.to_thread(self.runtime.store.get_checkpoint, checkpoint_id)
        disk_layer = self.runtime.home.layers / record.disk_layer
        out: dict[str, Summary] = {}

        def done(name: str, samples: list[float]) -> None:
            out[name] = summarize(samples)
            self.log(
                f"baseline {name}: p50 {out[name]['p50_ms']:.0f} ms, "
                f"p95 {out[name]['p95_ms']:.0f} ms (n={out[name]['n']})"
            )

        done("cold_boot_create", await runner.cold_boot_create(plan.cold_boot_reps))
        saves, restores = await runner.full_ram(files, disk_layer, plan.baseline_reps)
        self.log(f"full-RAM state file: {runner.full_ram_state_bytes / (1 << 20):.0f} MiB")
        done("full_ram_checkpoint", saves)
        done("full_ram_restore", restores)
        done("qemu_start_floor", await runner.qemu_start_floor(plan.baseline_reps))
        done("ram_copy_floor", await runner.ram_copy_floor(files, plan.baseline_reps))
        return out

    # -- scaling -----------------------------------------------------------------------

    async def _scaling_setup(self) -> Session:
        """A session with more RAM than the largest allocation, holding the first one."""
        memory_mib = self.plan.scaling_memory_mib
        t, session = await _timed(self._create(memory_mib, serve=False))
        self.log(f"scaling: {memory_mib} MiB session ready in {t:.0f} ms")
        first = self.plan.scaling_mib[0]
        await self._allocate(session.id, first, f"/tmp/alloc-{first}")
        return session

    async def _scaling(self, session: Session) -> list[dict[str, Any]]:
        """Checkpoint cost against guest memory in use, in a VM with more RAM than that."""
        plan = self.plan
        rows: list[dict[str, Any]] = []
        allocated = plan.scaling_mib[0]
        try:
            for target in plan.scaling_mib:
                if target > allocated:
                    # Allocations accumulate: freed guest pages would stay in the RAM file.
                    await self._allocate(session.id, target - allocated, f"/tmp/alloc-{target}")
                    allocated = target
                # The first after the allocation copies what it wrote; the next ones
                # what changed since (the one before is removed once the next exists:
                # the session maps it).
                samples: list[float] = []
                pauses: list[float] = []
                copied = 0
                first_ms = 0.0
                previous: str | None = None
                for rep in range(plan.scaling_reps + 1):
                    ms, ck = await _timed(self.runtime.checkpoint(session.id))
                    self._checkpoints.append(ck.id)
                    if previous is not None:
                        await self._remove_checkpoint(previous)
                    previous = ck.id
                    if rep == 0:
                        first_ms, copied = ms, ck.size_bytes
                        continue
                    samples.append(ms)
                    pauses.append(ck.pause_ms)
                if previous is not None:
                    await self._remove_checkpoint(previous)
                p50 = summarize(samples)["p50_ms"]
                rows.append(
                    {
                        "in_use_mib": target,
                        "configured_mib": plan.scaling_memory_mib,
                        "first_ms": round(first_ms, 1),
                        "checkpoint_p50_ms": p50,
                        "pause_p50_ms": summarize(pauses)["p50_ms"],
                        "checkpoint_mib": round(copied / (1 << 20), 1),
                    }
                )
                self.log(
                    f"scaling: {target} MiB in use → first checkpoint {first_ms:.0f} ms "
                    f"({copied / (1 << 20):.0f} MiB), then p50 {p50:.0f} ms"
                )
        finally:
            await self._remove_sessions([session])
        return rows

    async def _allocate(self, session_id: str, mib: int, marker: str) -> None:
        """Start a guest process holding ``mib`` MiB of touched memory; wait until it has."""
        code = (
            f"import pathlib, time; b = bytearray({mib} << 20); "  # zero-filled: touched
            f"pathlib.Path({marker!r}).write_text('ok'); time.sleep(1e9)"
        )
        started = time.perf_counter()
        await self.runtime.spawn(session_id, ["python3", "-c", code])

        async def touched() -> bool | None:
            result = await self.runtime.exec(session_id, ["test", "-e", marker])
            return True if result.exit_code == 0 else None

        await poll_until(
            touched,
            timeout_s=_ALLOC_TIMEOUT_S,
            timed_out=lambda: InternalError(f"allocating {mib} MiB in the guest took too long"),
            interval_s=0.3,
        )
        self.log(f"scaling: guest touched {mib} MiB in {time.perf_counter() - started:.1f} s")

    # -- helpers -----------------------------------------------------------------------

    async def _serves(self, url: str, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await self._http.get(url)).status_code == 200:
                            return True
                    await asyncio.sleep(0.1)
        except TimeoutError:
            return False

    async def _wait_http(self, url: str, timeout_s: float) -> None:
        if not await self._serves(url, timeout_s):
            raise InternalError(f"the guest web server at {url} did not answer in {timeout_s} s")

    async def _cli_overhead(self, session_id: str) -> dict[str, Summary]:
        """Wall time of whole ``forkpoint`` processes (the console script of this Python),
        as a CLI-driven agent pays it per call; with the sessions of the run alive."""
        forkpoint = str(Path(sys.executable).with_name("forkpoint"))
        commands = {
            "ls": ["ls", "--json"],
            "show": ["show", session_id, "--json"],
            "exec": ["exec", session_id, "--", "true"],
        }
        out: dict[str, Summary] = {}
        for name, args in commands.items():
            samples = []
            for _ in range(_CLI_REPS):
                started = time.perf_counter()
                process = await asyncio.create_subprocess_exec(
                    forkpoint, *args, stdout=asyncio.subprocess.DEVNULL
                )
                if await process.wait() != 0:
                    raise InternalError(f"`forkpoint {' '.join(args)}` failed in the bench")
                samples.append((time.perf_counter() - started) * 1000)
            out[name] = summarize(samples)
            self.log(f"cli {name}: p50 {out[name]['p50_ms']:.0f} ms (n={out[name]['n']})")
        return out

    async def _remove_sessions(self, sessions: list[Session]) -> None:
        """Remove sessions side by side (not timed); leftovers are retried at cleanup."""

        async def remove(session_id: str) -> None:
            with contextlib.suppress(ForkpointError):
                await self.runtime.remove(session_id)
                self._sessions.discard(session_id)

        await asyncio.gather(*(remove(s.id) for s in sessions))

    async def _remove_checkpoint(self, checkpoint_id: str) -> None:
        await self.runtime.remove_checkpoint(checkpoint_id)
        self._checkpoints.remove(checkpoint_id)

    async def _cleanup(self) -> None:
        """Remove every session and checkpoint this run made, then the scratch files."""
        with contextlib.suppress(Exception):
            await self._http.aclose()
        for session_id in list(self._sessions):
            try:
                await self.runtime.remove(session_id)
            except ForkpointError as error:
                self.log(f"cleanup: session {session_id}: {error.message}")
            self._sessions.discard(session_id)
        for checkpoint_id in reversed(self._checkpoints):
            try:
                await self.runtime.remove_checkpoint(checkpoint_id)
            except ForkpointError as error:
                self.log(f"cleanup: checkpoint {checkpoint_id}: {error.message}")
        self._checkpoints.clear()
        if self._baseline_runner is not None:
            strays = self._baseline_runner.kill_strays()
            if strays:
                self.log(f"cleanup: killed {strays} baseline VM(s)")
        await asyncio.to_thread(shutil.rmtree, self._scratch, ignore_errors=True)


def _url(session: Session) -> str:
    port = session.port(GUEST_PORT)
    if port is None:
        raise InternalError(f"session {session.id} has no forward for port {GUEST_PORT}")
    return port.url + "/"


def _mem_available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


@dataclass
class _FanOut:
    op_ms: list[float] = field(default_factory=list)
    ready_ms: list[float] = field(default_factory=list)
    serving: list[int] = field(default_factory=list)
    density: dict[str, Any] | None = None


def _records(store: Store, sessions: Sequence[Session]) -> list[SessionRecord]:
    return [store.get_session(session.id) for session in sessions]
