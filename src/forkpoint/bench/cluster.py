"""``forkpoint bench --cluster``: what the cluster costs against one host, measured side by
side on the cluster ``FORKPOINT_CLUSTER`` names.

- placement: a create through the cluster against creates by the node's own runtime (run
  by its daemon, on the same node), and its parts: Ray's placement alone (a placement
  group made ready and removed), a daemon round trip, the session's record written to the
  store;
- transfer: a checkpoint with 64 MiB just written, pushed as taken, then pulled from the
  store by every other node, per MiB received; then fetched by them again directly from
  the node holding it (its export, once, timed apart);
- fork: one fork through the cluster against one by the node's own runtime (the
  checkpoint there already), and fork ×12 packed on as few nodes as hold them against
  spread over them.

Medians of repeated runs in one process (no CLI start-up). Every session and checkpoint it
makes is removed again.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forkpoint.cluster.runtime import ClusterRuntime

__all__ = ["cluster_lines", "cluster_suite"]

_MEMORY_MIB = 256
_FANOUT = 12


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


async def _timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await call()
    return time.perf_counter() - start, result


async def _median_of(times: int, call: Callable[[], Awaitable[Any]]) -> float:
    return _median_ms([(await _timed(call))[0] for _ in range(times)])


async def cluster_suite(
    cluster: ClusterRuntime, rounds: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """Every measure of this module, as plain data (``cluster.json``)."""
    from forkpoint.cluster.placement import Strategy, release, reserve

    out: dict[str, Any] = {"rounds": rounds, "memory_mib": _MEMORY_MIB}
    log("a first session (boots its node's template)")
    first = await cluster.create(memory_mib=_MEMORY_MIB)
    checkpoint: str | None = None
    try:
        entry = await asyncio.to_thread(cluster.records.session, first.id)
        node = entry.node
        out["node"] = (await asyncio.to_thread(cluster.nodes))[node].name
        log(f"create ×{rounds} through the cluster, and by node {out['node']} itself")
        creates = []
        for _ in range(rounds):
            seconds, made = await _timed(lambda: cluster.create(memory_mib=_MEMORY_MIB))
            creates.append(seconds)
            await cluster.remove(made.id)
        out["create_ms"] = _median_ms(creates)
        local = await cluster.call(node, "time_creates", rounds, _MEMORY_MIB)
        out["local_create_ms"] = _median_ms(local)
        places = []
        for _ in range(rounds * 2):
            start = time.perf_counter()
            placed = await asyncio.to_thread(reserve, 1, _MEMORY_MIB, 1, Strategy.PACK)
            places.append(time.perf_counter() - start)
            await asyncio.to_thread(release, placed.group)
        out["placement_ms"] = _median_ms(places)
        trip = functools.partial(cluster.call, node, "info")
        out["daemon_round_trip_ms"] = await _median_of(rounds * 2, trip)
        write = functools.partial(asyncio.to_thread, cluster.records.put_session, entry)
        out["record_write_ms"] = await _median_of(rounds * 2, write)

        log("checkpoint with 64 MiB just written, pushed as taken; pulled by the others")
        await cluster.exec(first.id, ["sh", "-c", "head -c 64M /dev/urandom > /root/state"])
        seconds, taken = await _timed(lambda: cluster.checkpoint(first.id))
        checkpoint = taken.id
        out["checkpoint_and_push_ms"] = round(seconds * 1000, 1)
        await _transfers(cluster, node, taken.id, out)
        log(f"fork ×{rounds} one at a time through the cluster, and by node {out['node']}")
        forks = []
        for _ in range(rounds):
            seconds, made = await _timed(lambda: cluster.fork(taken.id, 1))
            forks.append(seconds)
            await _remove_all(cluster, made)
        out["fork_ms"] = _median_ms(forks)
        local = await cluster.call(node, "time_forks", taken.id, rounds)
        out["local_fork_ms"] = _median_ms(local)
        for spread in (False, True):
            log(f"fork ×{_FANOUT} {'spread' if spread else 'packed'}")
            out[f"fork{_FANOUT}_{'spread' if spread else 'pack'}"] = await _fan_out(
                cluster, taken.id, spread
            )
    finally:
        try:
            await cluster.remove(first.id)
        finally:
            if checkpoint is not None:
                await cluster.remove_checkpoint(checkpoint)
    return out


async def _transfers(
    cluster: ClusterRuntime, holder: str, checkpoint: str, out: dict[str, Any]
) -> None:
    """Every other node pulls the checkpoint from the store; then, its copy removed, the
    same nodes fetch it again directly from the holder (which exports it once)."""
    others = [n for n in await asyncio.to_thread(cluster.forkpoint_nodes) if n != holder]
    pulls = [await cluster.call(other, "pull", checkpoint) for other in others]
    out["pulls"] = _moved(pulls)
    for other in others:
        await cluster.call(other, "remove_checkpoint", checkpoint)
    seconds, _ = await _timed(lambda: cluster.call(holder, "export", checkpoint))
    out["export_ms"] = round(seconds * 1000, 1)
    try:
        direct = [await cluster.call(other, "pull", checkpoint, holder) for other in others]
    finally:
        await cluster.call(holder, "export_drop", checkpoint)
    out["direct"] = _moved(direct)
    out["pull_ms_per_mib"] = _per_mib(out["pulls"])
    out["direct_ms_per_mib"] = _per_mib(out["direct"])


def _moved(transfers: list[Any]) -> list[dict[str, float]]:
    return [{"bytes": t.received_bytes, "ms": t.duration_ms} for t in transfers if t is not None]


def _per_mib(moved: list[dict[str, float]]) -> float | None:
    mib = sum(m["bytes"] for m in moved) / (1 << 20)
    return round(sum(m["ms"] for m in moved) / mib, 1) if mib else None


async def _remove_all(cluster: ClusterRuntime, made: list[Any]) -> None:
    """Remove the forks made; the first fork that failed raised."""
    for fork in made:
        if isinstance(fork, Exception):
            raise fork
        await cluster.remove(fork.id)


async def _fan_out(cluster: ClusterRuntime, checkpoint: str, spread: bool) -> dict[str, Any]:
    seconds, forks = await _timed(lambda: cluster.fork(checkpoint, _FANOUT, spread=spread))
    made = [f for f in forks if not isinstance(f, Exception)]
    for fork in made:
        await cluster.remove(fork.id)
    return {
        "ms": round(seconds * 1000, 1),
        "nodes": sorted({str(f.node) for f in made}),
        "failed": [str(f) for f in forks if isinstance(f, Exception)],
    }


def cluster_lines(result: dict[str, Any]) -> list[str]:
    """The report, a line per measure."""
    extra = round(result["create_ms"] - result["local_create_ms"], 1)
    lines = [
        f"create: {result['create_ms']} ms through the cluster vs {result['local_create_ms']} "
        f"ms by node {result['node']} itself (+{extra} ms; Ray's placement alone "
        f"{result['placement_ms']} ms, a daemon round trip {result['daemon_round_trip_ms']} ms, "
        f"the record written to the store {result['record_write_ms']} ms)",
        f"checkpoint + push (64 MiB just written): {result['checkpoint_and_push_ms']} ms",
        f"fork ×1: {result['fork_ms']} ms through the cluster vs {result['local_fork_ms']} ms "
        f"by node {result['node']} itself "
        f"(+{round(result['fork_ms'] - result['local_fork_ms'], 1)} ms)",
    ]
    if result["pull_ms_per_mib"] is None:
        lines.append("pull: no other node to pull to")
    else:
        received = sum(p["bytes"] for p in result["pulls"]) / (1 << 20)
        lines.append(
            f"pull from the store: {result['pull_ms_per_mib']} ms per MiB received "
            f"({received:.0f} MiB by {len(result['pulls'])} node(s))"
        )
        fetched = sum(p["bytes"] for p in result["direct"]) / (1 << 20)
        lines.append(
            f"fetch from the holding node: {result['direct_ms_per_mib']} ms per MiB received "
            f"({fetched:.0f} MiB; its export once before: {result['export_ms']} ms)"
        )
    for key in (f"fork{_FANOUT}_pack", f"fork{_FANOUT}_spread"):
        fork = result[key]
        failed = f", {len(fork['failed'])} failed" if fork["failed"] else ""
        lines.append(f"{key}: {fork['ms']} ms on {', '.join(fork['nodes'])}{failed}")
    return lines
