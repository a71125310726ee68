"""The history measurements: ``diff`` with 10,000 files in the tree, and a history step.

- ``diff_10k``: a session with 10,000 more files (100 directories of 100) than the image
  is checkpointed, three files change, then ``diff CHECKPOINT`` runs. ``cold``: the first
  diff against that checkpoint (a fork of it is scanned too, side by side with the
  session); ``warm``: later ones (the checkpoint's scan is kept, only the session is
  walked). Target ≤ 3 s.
- ``step``: ``exec true`` in a session created with ``history`` minus the same in one
  without (the automatic checkpoint); ``step_bytes``: the disk each step's checkpoint
  takes (its RAM file: the memory in use, see the docs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from forkpoint.runtime import Runtime

from .stats import Summary, summarize

__all__ = ["DIFF_TARGET_MS", "measure_history"]

DIFF_TARGET_MS = 3000.0
FILES = 10_000
_MAKE_FILES = (
    "import os\n"
    "for i in range(100):\n"
    "    d = f'/root/bench-tree/d{i}'\n"
    "    os.makedirs(d, exist_ok=True)\n"
    "    for j in range(100):\n"
    "        with open(f'{d}/f{j}.txt', 'w') as f:\n"
    "            f.write(f'{i} {j}\\n')\n"
)
# Three changes, new ones in every repetition (the tree is not reset between them).
_CHANGE = (
    "rm /root/bench-tree/d1/f{rep}.txt; echo changed >> /root/bench-tree/d2/f2.txt; "
    "echo new > /root/bench-tree/new-{rep}.txt"
)


async def measure_history(
    runtime: Runtime, reps: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """``{diff_10k_cold, diff_10k_warm, step: Summary, entries, step_bytes, ...}``."""
    out: dict[str, Any] = {}
    tree = await runtime.create()
    try:
        await runtime.exec(tree.id, ["python3", "-S", "-c", _MAKE_FILES], timeout=600)
        cold: list[float] = []
        warm: list[float] = []
        entries = 0
        for rep in range(reps):
            checkpoint = await runtime.checkpoint(tree.id)
            await runtime.exec(tree.id, _CHANGE.format(rep=rep))
            for samples in (cold, warm, warm):
                started = time.perf_counter()
                diff = await runtime.diff(checkpoint.id)
                samples.append((time.perf_counter() - started) * 1000)
                entries = diff.entries
                if len(diff.files) != 3:
                    log(f"diff_10k: expected 3 changed files, got {len(diff.files)}")
            await runtime.remove_checkpoint(checkpoint.id)
        out["diff_10k_cold"], out["diff_10k_warm"] = summarize(cold), summarize(warm)
        out["entries"] = entries
        log(
            f"diff ({entries:,} paths): cold p50 {out['diff_10k_cold']['p50_ms']:.0f} ms, "
            f"warm p50 {out['diff_10k_warm']['p50_ms']:.0f} ms"
        )
    finally:
        await runtime.remove(tree.id)
    out.update(await _steps(runtime, reps, log))
    out["diff_target_ms"] = DIFF_TARGET_MS
    return out


async def _steps(runtime: Runtime, reps: int, log: Callable[[str], None]) -> dict[str, Any]:
    plain = await runtime.create()
    stepped = await runtime.create(history=True)
    try:
        samples: dict[str, list[float]] = {"plain": [], "history": []}
        for _ in range(reps):
            for key, session in (("plain", plain), ("history", stepped)):
                started = time.perf_counter()
                await runtime.exec(session.id, "true")
                samples[key].append((time.perf_counter() - started) * 1000)
        steps = await runtime.history(stepped.id)
        plain_ms: Summary = summarize(samples["plain"])
        with_history: Summary = summarize(samples["history"])
        step_bytes = [s.size_bytes for s in steps]
        log(
            f"history step: exec {with_history['p50_ms']:.0f} ms with history, "
            f"{plain_ms['p50_ms']:.0f} ms without; {step_bytes[-1] / 2**20:.0f} MiB a step"
        )
        return {
            "exec_plain": plain_ms,
            "exec_history": with_history,
            "step_ms": round(with_history["p50_ms"] - plain_ms["p50_ms"], 1),
            "step_bytes": int(sum(step_bytes) / len(step_bytes)),
        }
    finally:
        await runtime.remove(plain.id)
        await runtime.remove(stepped.id)
        left = await asyncio.to_thread(runtime.store.list_checkpoints, session_id=stepped.id)
        for checkpoint in left:
            await runtime.remove_checkpoint(checkpoint.id)  # they outlive their session
