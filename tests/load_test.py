"""The load test: sessions driven at once through the REST server (``forkpoint serve
--port``, 127.0.0.1 only) by a bounded load generator, for a while.

Each worker owns one session and loops over a random mix — exec, file write + read,
checkpoint, fork (and removing the fork), rollback, rm (and creating its session anew) —
with random pauses. A ``Busy`` answer (HTTP 429, the server's admission limit) is waited
out as its ``Retry-After`` says and counted apart: it is the documented back-pressure,
not an error. Reported: count and p50/p95/p99 per operation, errors by code, the server's
RSS and open descriptors over time, and what leaked at the end (VMs, layers, files: the
fault campaign's invariants). ``make load`` runs 20 sessions for 10 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from forkpoint.config import home
from forkpoint.errors import Busy, ForkpointError
from forkpoint.runtime.housekeeping.invariants import check_home, home_processes
from forkpoint.sdk import AsyncCheckpoint, AsyncSandbox
from forkpoint.store import Store

FORKPOINT = str(Path(sys.executable).parent / "forkpoint")
OPS = {"exec": 30, "write+read": 25, "checkpoint": 12, "fork": 8, "rollback": 10, "rm": 5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Load:
    def __init__(self, url: str, seed: int, memory: int) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.memory = memory
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.busy = 0

    async def timed(self, op: str, work: Any) -> Any:
        while True:
            started = time.perf_counter()
            try:
                result = await work()
            except Busy as error:
                self.busy += 1
                await asyncio.sleep(error.retry_after_s or 1)
                continue
            except ForkpointError as error:
                self.errors[f"{op}: {error.code}"] += 1
                return None
            self.latency[op].append((time.perf_counter() - started) * 1000)
            return result

    async def new_session(self) -> AsyncSandbox:
        while True:
            sb = await self.timed(
                "create", lambda: AsyncSandbox.create(base_url=self.url, memory_mib=self.memory)
            )
            if sb is not None:
                return sb  # type: ignore[no-any-return]
            await asyncio.sleep(1)

    async def worker(self, n: int, deadline: float) -> None:
        sb = await self.new_session()
        checkpoints: list[AsyncCheckpoint] = []
        i = 0
        while time.monotonic() < deadline:
            i += 1
            op = self.rng.choices(list(OPS), weights=list(OPS.values()))[0]
            sb = await self.step(op, f"{n}-{i}", sb, checkpoints)
            await asyncio.sleep(self.rng.uniform(0, 2))
        await self.timed("rm", sb.kill)

    async def step(
        self, op: str, tag: str, sb: AsyncSandbox, checkpoints: list[AsyncCheckpoint]
    ) -> AsyncSandbox:
        """One operation on the worker's session; returns its session (``rm`` makes anew)."""
        if op == "exec":
            await self.timed(op, lambda: sb.commands.run(f"echo {tag}"))
        elif op == "write+read":
            path, data = f"/root/load-{tag[-1]}", f"{tag}\n" * 100

            async def write_read() -> None:
                await sb.files.write(path, data)
                if await sb.files.read_text(path) != data:
                    raise ForkpointError("read back something else")

            await self.timed(op, write_read)
        elif op == "checkpoint":
            ck = await self.timed(op, lambda: sb.checkpoint())
            if ck is not None:
                checkpoints.append(ck)
        elif op == "fork" and checkpoints:
            forks = await self.timed(op, lambda: checkpoints[-1].fork(1))
            for f in forks or []:
                if isinstance(f, AsyncSandbox):
                    await self.timed("rm", f.kill)
                else:
                    self.errors[f"fork: {f.code}"] += 1
        elif op == "rollback" and checkpoints:
            target = self.rng.choice(checkpoints)
            await self.timed(op, lambda: sb.rollback(target))
        elif op == "rm":
            await self.timed(op, sb.kill)
            checkpoints.clear()
            return await self.new_session()
        return sb


def _proc_stats(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open descriptors) of the server."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(sessions: int, seconds: float, seed: int, memory: int, out: Path) -> dict[str, Any]:
    port = _free_port()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "server.log", "wb") as log:  # its token goes to stdout: not kept
        server = subprocess.Popen(
            [FORKPOINT, "serve", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=log
        )
    samples: list[tuple[float, int, int]] = []
    try:
        token_file = home().token
        for _ in range(200):
            if token_file.exists() and _listening(port):
                break
            await asyncio.sleep(0.1)
        os.environ["FORKPOINT_TOKEN"] = token_file.read_text().strip()
        load = Load(f"http://127.0.0.1:{port}", seed, memory)
        started = time.monotonic()
        deadline = started + seconds

        async def sample() -> None:
            while True:
                rss, fds = _proc_stats(server.pid)
                samples.append((round(time.monotonic() - started, 1), rss, fds))
                await asyncio.sleep(10)

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(load.worker(n, deadline) for n in range(sessions)))
        sampler.cancel()
        rss, fds = _proc_stats(server.pid)
        samples.append((round(time.monotonic() - started, 1), rss, fds))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    store = Store.open(home())
    try:
        left = [s.id for s in store.list_sessions()]
        leaked = check_home(home(), store)
    finally:
        store.close()
    return {
        "sessions": sessions, "seconds": seconds, "memory_mib": memory,
        "operations": {
            op: {"count": len(v), "p50_ms": round(statistics.median(v)),
                 "p95_ms": round(_percentile(v, 0.95)), "p99_ms": round(_percentile(v, 0.99))}
            for op, v in sorted(load.latency.items())
        },
        "errors": dict(load.errors), "busy_retries": load.busy,
        "server": {"rss_kib": [s[1] for s in samples], "fds": [s[2] for s in samples],
                   "at_s": [s[0] for s in samples]},
        "sessions_left": left, "leaked": leaked,
        "vms_left": len(home_processes(home(), left)),
    }  # fmt: skip


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--memory", type=int, default=256, help="MiB per session")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--out", type=Path, default=Path("load-out"))
    args = parser.parse_args()
    report = asyncio.run(run(args.sessions, args.seconds, args.seed, args.memory, args.out))
    (args.out / "load.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 1 if report["errors"] or report["leaked"] or report["vms_left"] else 0


if __name__ == "__main__":
    sys.exit(main())
