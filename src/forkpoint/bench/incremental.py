"""Checkpoints that cost what changed: the rows of issue #30's targets.

One 512 MiB session whose guest holds 200 MiB it wrote (a process keeps it):

- ``first``: its first checkpoint after that (every page written since the restore);
- ``unchanged``: again and again with nothing changed on purpose (an idle guest still
  writes a few pages);
- ``changed_8mib``: after the guest wrote 8 MiB more (new random data each time);
- ``new_mib``: what each left on disk of its own (its RAM file's blocks no other file
  shares, plus its device state and frozen disk layer) right after it was taken;
- ``chain``: a fork and a rollback from the 20th checkpoint of that chain, side by side
  with the same from its first;
- ``history``: ``exec`` that writes a few KiB in a session with history minus without,
  the disk a step adds, and the disk of 20 steps after one that wrote 200 MiB (the host
  file system's used space before and after).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from forkpoint.errors import InternalError
from forkpoint.models import Checkpoint, Session
from forkpoint.polling import poll_until
from forkpoint.runtime import Runtime

from .stats import summarize

__all__ = ["measure_incremental"]

MEMORY_MIB = 512
HELD_MIB = 200
CHAIN = 20
_HOLD = (
    "import pathlib, time; b = bytearray({mib} << 20)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
    "pathlib.Path({marker!r}).write_text('ok'); time.sleep(1e9)"
)
_WRITE_8MIB = "head -c 8M /dev/urandom > /dev/shm/changed-{rep}"
_SMALL_STEP = "echo {rep} > /root/step-{rep}.txt"


def _own_mib(checkpoint: Checkpoint) -> float:
    return round((checkpoint.disk_bytes - checkpoint.shared_bytes) / (1 << 20), 2)


def _used_bytes(runtime: Runtime) -> int:
    fs = os.statvfs(runtime.home.root)
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


async def _timed_checkpoint(runtime: Runtime, session_id: str) -> tuple[float, Checkpoint]:
    started = time.perf_counter()
    checkpoint = await runtime.checkpoint(session_id)
    return (time.perf_counter() - started) * 1000, checkpoint


async def _hold(runtime: Runtime, session_id: str, mib: int) -> None:
    """A guest process that wrote ``mib`` MiB and keeps them."""
    marker = f"/tmp/held-{mib}"
    await runtime.spawn(session_id, ["python3", "-c", _HOLD.format(mib=mib, marker=marker)])

    async def written() -> bool | None:
        return (
            True
            if (await runtime.exec(session_id, ["test", "-e", marker])).exit_code == 0
            else None
        )

    await poll_until(
        written, timeout_s=300.0, interval_s=0.3,
        timed_out=lambda: InternalError(f"the guest did not write {mib} MiB in time"),
    )  # fmt: skip


def _row(walls: list[float], checkpoints: list[Checkpoint]) -> dict[str, Any]:
    return {
        "wall": summarize(walls),
        "pause": summarize([c.pause_ms for c in checkpoints]),
        "new_mib_p50": sorted(_own_mib(c) for c in checkpoints)[len(checkpoints) // 2],
    }


async def measure_incremental(
    runtime: Runtime, reps: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """The rows above (see the module doc); ``reps`` of each."""
    out: dict[str, Any] = {}
    made: list[str] = []
    session = await runtime.create(memory_mib=MEMORY_MIB)
    try:
        await _hold(runtime, session.id, HELD_MIB)
        wall, first = await _timed_checkpoint(runtime, session.id)
        made.append(first.id)
        out["first"] = _row([wall], [first])
        walls, taken = [], []
        for _ in range(max(reps, CHAIN - 1)):  # the rest of a chain of CHAIN checkpoints
            wall, checkpoint = await _timed_checkpoint(runtime, session.id)
            made.append(checkpoint.id)
            walls.append(wall)
            taken.append(checkpoint)
        out["unchanged"] = _row(walls, taken)
        walls, taken = [], []
        for rep in range(reps):
            await runtime.exec(session.id, _WRITE_8MIB.format(rep=rep))
            wall, checkpoint = await _timed_checkpoint(runtime, session.id)
            made.append(checkpoint.id)
            walls.append(wall)
            taken.append(checkpoint)
        out["changed_8mib"] = _row(walls, taken)
        for key, label in (("first", "first"), ("unchanged", "again"), ("changed_8mib", "8 MiB")):
            row = out[key]
            log(
                f"checkpoint ({label}, {HELD_MIB} MiB held): wall p50 "
                f"{row['wall']['p50_ms']:.0f} ms, pause {row['pause']['p50_ms']:.0f} ms, "
                f"{row['new_mib_p50']:.1f} MiB new"
            )
        out["chain"] = await _chain(runtime, session, made[0], made[CHAIN - 1], reps, log)
    finally:
        await runtime.remove(session.id)
        for checkpoint_id in reversed(made):
            await runtime.remove_checkpoint(checkpoint_id)
    out["history"] = await _history(runtime, reps, log)
    return out


async def _chain(
    runtime: Runtime, session: Session, first: str, deep: str, reps: int,
    log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """Fork and rollback from the chain's first and its CHAIN-th checkpoint, alternated."""
    samples: dict[str, list[float]] = {}
    for _ in range(reps):
        for label, checkpoint_id in (("first", first), ("deep", deep)):
            started = time.perf_counter()
            forks = await runtime.fork(checkpoint_id, 1)
            samples.setdefault(f"fork_{label}", []).append((time.perf_counter() - started) * 1000)
            for fork in forks:
                if isinstance(fork, Session):
                    await runtime.remove(fork.id)
            started = time.perf_counter()
            await runtime.rollback(session.id, checkpoint_id)
            samples.setdefault(f"rollback_{label}", []).append(
                (time.perf_counter() - started) * 1000
            )
    out = {key: summarize(values) for key, values in samples.items()}
    log(
        f"chain of {CHAIN}: fork {out['fork_first']['p50_ms']:.0f} ms from the first, "
        f"{out['fork_deep']['p50_ms']:.0f} ms from the last; rollback "
        f"{out['rollback_first']['p50_ms']:.0f} / {out['rollback_deep']['p50_ms']:.0f} ms"
    )
    return {**out, "depth": CHAIN}


async def _history(runtime: Runtime, reps: int, log: Callable[[str], None]) -> dict[str, Any]:
    plain = await runtime.create()
    stepped = await runtime.create(history=True)
    try:
        samples: dict[str, list[float]] = {"plain": [], "history": []}
        for rep in range(max(reps, 3)):
            for key, session in (("plain", plain), ("history", stepped)):
                started = time.perf_counter()
                await runtime.exec(session.id, _SMALL_STEP.format(rep=rep))
                samples[key].append((time.perf_counter() - started) * 1000)
        steps = await runtime.history(stepped.id)
        step_mib = sorted(s.size_bytes / (1 << 20) for s in steps[1:])[len(steps[1:]) // 2]
        # A step that writes 200 MiB (a pip install's worth), then 20 small ones.
        await runtime.exec(stepped.id, f"head -c {HELD_MIB}M /dev/urandom > /dev/shm/big")
        before = await asyncio.to_thread(_used_bytes, runtime)
        for rep in range(CHAIN):
            await runtime.exec(stepped.id, _SMALL_STEP.format(rep=1000 + rep))
        twenty_mib = (await asyncio.to_thread(_used_bytes, runtime) - before) / (1 << 20)
    finally:
        await runtime.remove(plain.id)
        await runtime.remove(stepped.id)
        left = await asyncio.to_thread(runtime.store.list_checkpoints, session_id=stepped.id)
        for checkpoint in left:
            await runtime.remove_checkpoint(checkpoint.id)  # they outlive their session
    plain_ms, history_ms = summarize(samples["plain"]), summarize(samples["history"])
    extra = round(history_ms["p50_ms"] - plain_ms["p50_ms"], 1)
    log(
        f"history: exec +{extra:.0f} ms with history, {step_mib:.1f} MiB a step; "
        f"{CHAIN} steps after a {HELD_MIB} MiB one: {twenty_mib:.0f} MiB"
    )
    return {
        "exec_plain": plain_ms,
        "exec_history": history_ms,
        "extra_ms": extra,
        "step_mib": step_mib,
        "twenty_steps_mib": round(twenty_mib, 1),
    }
