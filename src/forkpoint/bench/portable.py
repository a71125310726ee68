"""Push and pull: time and bytes for a fresh checkpoint and for a child checkpoint.

- *fresh*: the first push of a new session's checkpoint into an empty prefix (so its
  whole lineage goes up: the image template's RAM and disk, then its own pages), and its
  pull into an empty home;
- *child*: a second checkpoint of the same session after the guest wrote 4 MiB, pushed
  to and pulled from the same prefix (only what differs from what is already there).

The store is ``$FORKPOINT_BENCH_S3`` (``s3://BUCKET/PREFIX``, credentials and endpoint
from the usual AWS variables) or else a ``localbucket`` server (a development
dependency) started on 127.0.0.1; without either these rows are skipped. The pulling
"host" is a scratch home beside this one that shares only its image.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from forkpoint.config import Home
from forkpoint.runtime import Runtime

from .local_s3 import local_s3

__all__ = ["measure_portable"]

_WRITE = ["sh", "-c", "head -c 4M /dev/urandom > /root/bench-portable"]


async def measure_portable(
    runtime: Runtime, scratch: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """``{"fresh": {push_ms, push_bytes, pull_ms, pull_bytes}, "child": {...},
    "store": "localbucket" | "s3"}`` (empty when no store is available)."""
    with _store(scratch, log) as url:
        if url is None:
            return {}
        out: dict[str, Any] = {"store": "s3" if os.environ.get("FORKPOINT_BENCH_S3") else
                               "localbucket"}  # fmt: skip
        session = await runtime.create()
        made: list[str] = []
        other = await asyncio.to_thread(
            lambda: Runtime.open(_beside(runtime.home, scratch / "pull-home"))
        )
        try:
            fresh = await runtime.checkpoint(session.id)
            made.append(fresh.id)
            await runtime.exec(session.id, _WRITE)
            child = await runtime.checkpoint(session.id)
            made.append(child.id)
            for label, checkpoint in (("fresh", fresh.id), ("child", child.id)):
                pushed = await runtime.push_checkpoint(checkpoint, url)
                pulled = await other.pull_checkpoint(checkpoint, url)
                out[label] = {
                    "push_ms": round(pushed.duration_ms, 1),
                    "push_bytes": pushed.sent_bytes,
                    "pull_ms": round(pulled.duration_ms, 1),
                    "pull_bytes": pulled.received_bytes,
                }
                log(
                    f"push/pull {label}: push {pushed.duration_ms:.0f} ms "
                    f"{pushed.sent_bytes / 2**20:.1f} MiB, pull {pulled.duration_ms:.0f} ms "
                    f"{pulled.received_bytes / 2**20:.1f} MiB"
                )
        finally:
            other.close()
            await runtime.remove(session.id)
            for checkpoint_id in reversed(made):
                await runtime.remove_checkpoint(checkpoint_id)
        return out


def _beside(home: Home, root: Path) -> Home:
    root.mkdir(parents=True)
    for shared in ("images", "cache"):
        (root / shared).symlink_to(home.root / shared)
    return Home(root)


@contextlib.contextmanager
def _store(scratch: Path, log: Callable[[str], None]) -> Iterator[str | None]:
    given = os.environ.get("FORKPOINT_BENCH_S3")
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    if given:
        yield f"{given.rstrip('/')}/{prefix}"
        return
    if importlib.util.find_spec("localbucket") is None:
        log("push/pull: no $FORKPOINT_BENCH_S3 and no `localbucket` (pip install "
            "'forkpoint[dev]'); skipped")  # fmt: skip
        yield None
        return
    with _localbucket(scratch / "s3"):
        yield f"s3://bench/{prefix}"


@contextlib.contextmanager
def _localbucket(data: Path) -> Iterator[str]:
    try:
        with local_s3(data, "bench") as endpoint:
            yield endpoint
    finally:
        shutil.rmtree(data, ignore_errors=True)
