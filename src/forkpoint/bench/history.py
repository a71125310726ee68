"""The history measurements: ``diff`` with 10,000 files in the tree.

- ``diff_10k``: a session with 10,000 more files (100 directories of 100) than the image
  is checkpointed, three files change, then ``diff CHECKPOINT`` runs. ``cold``: the first
  diff against that checkpoint (a fork of it is scanned too, side by side with the
  session); ``warm``: later ones (the checkpoint's scan is kept, only the session is
  walked). Target ≤ 3 s.

A history step's cost is measured with the checkpoints' (``incremental.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from forkpoint.runtime import Runtime

from .stats import summarize

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
    """``{diff_10k_cold, diff_10k_warm: Summary, entries, diff_target_ms}``."""
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
    out["diff_target_ms"] = DIFF_TARGET_MS
    return out
