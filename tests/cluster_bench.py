"""``make cluster-bench``: what the cluster costs against one host, measured side by side
on the test cluster of ``cluster_net.py`` (three nodes of 12 VM slots on this machine).

- placement: a create through the cluster against a create by the node's own runtime, and
  Ray's part alone (one placement group made and removed) and a daemon round trip;
- transfer: a checkpoint pulled from the store by a node that lacks it, per MiB;
- fan-out: fork ×12 spread over the three nodes against packed on one.

Every figure is a median of repeated runs in one process (no CLI start-up). All nodes
share this machine's two cores: the spread fork cannot run faster here than packed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

_ROUNDS = 5


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


async def _timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await call()
    return time.perf_counter() - start, result


async def _on_head(address: str) -> dict[str, Any]:
    """Runs in the head's namespace, as a cluster client."""
    from forkpoint.cluster.placement import Strategy, release, reserve
    from forkpoint.cluster.runtime import ClusterRuntime
    from forkpoint.threads import use_fan_out_pool

    use_fan_out_pool()
    cluster = ClusterRuntime(address)
    out: dict[str, Any] = {}
    warm = await cluster.create(memory_mib=256)  # boots the template on its node
    node = cluster.records.session(warm.id).node

    creates = []
    for _ in range(_ROUNDS):
        seconds, made = await _timed(lambda: cluster.create(memory_mib=256))
        creates.append(seconds)
        await cluster.remove(made.id)
    out["create_ms"] = _median_ms(creates)
    places = []
    for _ in range(_ROUNDS * 2):
        start = time.perf_counter()
        placed = reserve(1, 256, 1, Strategy.PACK)
        places.append(time.perf_counter() - start)
        release(placed.group)
    out["placement_ms"] = _median_ms(places)
    trips = []
    for _ in range(_ROUNDS * 2):
        seconds, _info = await _timed(lambda: cluster.call(node, "info"))
        trips.append(seconds)
    out["daemon_round_trip_ms"] = _median_ms(trips)

    # A checkpoint with some state, pushed as taken; pulled by each node that lacks it.
    await cluster.exec(warm.id, ["sh", "-c", "head -c 64M /dev/urandom > /root/state"])
    seconds, checkpoint = await _timed(lambda: cluster.checkpoint(warm.id))
    out["checkpoint_and_push_ms"] = round(seconds * 1000, 1)
    pulls = []
    for other in cluster.forkpoint_nodes():
        if other != node:
            moved = await cluster.call(other, "pull", checkpoint.id)
            pulls.append({"bytes": moved.received_bytes, "ms": moved.duration_ms})
    out["pulls"] = pulls
    mib = sum(p["bytes"] for p in pulls) / (1 << 20)
    out["pull_ms_per_mib"] = round(sum(p["ms"] for p in pulls) / mib, 1) if mib else None

    for strategy in Strategy:
        seconds, forks = await _timed(
            lambda s=strategy: cluster.fork(checkpoint.id, 12, spread=s == Strategy.SPREAD)  # type: ignore[misc]
        )
        nodes = sorted({f.node for f in forks if not isinstance(f, Exception)})
        failed = [str(f) for f in forks if isinstance(f, Exception)]
        out[f"fork12_{strategy.value}"] = {"ms": round(seconds * 1000, 1), "nodes": nodes,
                                           "failed": failed}  # fmt: skip
        for fork in forks:
            if not isinstance(fork, Exception):
                await cluster.remove(fork.id)
    await cluster.remove(warm.id)
    out["node"] = cluster.nodes()[node].name
    return out


async def _on_node() -> dict[str, Any]:
    """Runs in one node's namespace with its home: that host's own runtime."""
    from forkpoint.runtime import Runtime
    from forkpoint.threads import use_fan_out_pool

    use_fan_out_pool()
    runtime = Runtime.open()
    creates = []
    for _ in range(_ROUNDS):
        seconds, made = await _timed(lambda: runtime.create(memory_mib=256))
        creates.append(seconds)
        await runtime.remove(made.id)
    return {"create_ms": _median_ms(creates)}


def main(out_dir: Path) -> None:
    from cluster_net import ClusterNet
    from forkpoint.config import home

    net = ClusterNet(home().ensure().root / "cluster-bench", slots=12)
    net.remove_files()
    try:
        net.start()
        me = str(Path(__file__).resolve())
        head = subprocess.run(
            ["ip", "netns", "exec", "fpc-head", sys.executable, me, "--head", net.address],
            env=net.env(), capture_output=True, text=True, check=True, timeout=1200,
        )  # fmt: skip
        cluster = json.loads(head.stdout.splitlines()[-1])
        node = cluster["node"]
        local = subprocess.run(
            ["ip", "netns", "exec", net.ns(node), sys.executable, me, "--node"],
            env=net.env(FORKPOINT_HOME=str(net.home(node))),
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        results = {"cluster": cluster, "local": json.loads(local.stdout.splitlines()[-1])}
    finally:
        net.stop()
        net.remove_files()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cluster.json").write_text(json.dumps(results, indent=2) + "\n")
    c, local_create = results["cluster"], results["local"]["create_ms"]
    extra = round(c["create_ms"] - local_create, 1)
    print(
        f"create: cluster {c['create_ms']} ms vs the node's own {local_create} ms (+{extra} "
        f"ms: placement {c['placement_ms']}, daemon trip {c['daemon_round_trip_ms']})"
    )
    print(f"checkpoint and push (64 MiB written): {c['checkpoint_and_push_ms']} ms")
    print(f"pull from the store: {c['pull_ms_per_mib']} ms per MiB received ({c['pulls']})")
    for key in ("fork12_pack", "fork12_spread"):
        print(f"{key}: {c[key]['ms']} ms on {c[key]['nodes']} failed {c[key]['failed']}")


if __name__ == "__main__":
    import asyncio

    if sys.argv[1] == "--head":
        print(json.dumps(asyncio.run(_on_head(sys.argv[2]))))
    elif sys.argv[1] == "--node":
        print(json.dumps(asyncio.run(_on_node())))
    else:
        main(Path(sys.argv[1]))
