"""``forkpoint cluster status``: the nodes, what runs on each, reserved against free."""

from __future__ import annotations

from dataclasses import dataclass

from forkpoint.cluster.connection import QEMU_LABEL, SLOT
from forkpoint.cluster.placement import reservations
from forkpoint.cluster.runtime import ClusterRuntime

__all__ = ["ClusterStatus", "NodeStatus", "cluster_status"]

_MIB = 1 << 20


@dataclass(frozen=True)
class NodeStatus:
    name: str
    id: str
    address: str
    alive: bool
    daemon: bool  # a forkpoint node daemon runs there
    qemu: str | None  # its QEMU build (label): checkpoints fork only onto the same
    sessions: int
    slots: int
    slots_reserved: int
    memory_mib: int
    memory_reserved_mib: int
    cpus: float
    cpus_reserved: float


@dataclass(frozen=True)
class ClusterStatus:
    address: str
    nodes: tuple[NodeStatus, ...]
    reservations: int  # bundles forkpoint holds in Ray (one per session placed)
    groups: int  # their placement groups


def cluster_status(cluster: ClusterRuntime) -> ClusterStatus:
    groups = reservations()
    reserved: dict[str, dict[str, float]] = {}
    bundles = 0
    for group in groups:
        for index, node in group["bundles_to_node_id"].items():  # type: ignore[attr-defined]
            bundles += 1
            held = reserved.setdefault(str(node), {})
            for key, amount in group["bundles"][index].items():  # type: ignore[index]
                held[key] = held.get(key, 0.0) + float(amount)
    sessions = cluster.records.sessions()
    daemons = set(cluster.forkpoint_nodes())
    nodes = []
    for view in cluster.nodes().values():
        held = reserved.get(view.id, {})
        total = view.resources
        nodes.append(
            NodeStatus(
                name=view.name,
                id=view.id,
                address=view.address,
                alive=view.alive,
                daemon=view.id in daemons,
                qemu=view.labels.get(QEMU_LABEL),
                sessions=sum(e.node == view.id for e in sessions),
                slots=int(total.get(SLOT, 0)),
                slots_reserved=int(held.get(SLOT, 0)),
                memory_mib=int(total.get("memory", 0)) // _MIB,
                memory_reserved_mib=int(held.get("memory", 0)) // _MIB,
                cpus=total.get("CPU", 0.0),
                cpus_reserved=held.get("CPU", 0.0),
            )  # fmt: skip
        )
    nodes.sort(key=lambda n: (not n.daemon, n.name))
    return ClusterStatus(cluster.address, tuple(nodes), bundles, len(groups))
