"""Reservations: Ray decides where sessions run.

Every session holds one bundle of a placement group — its guest memory plus what QEMU
and passt use beside it, its vCPUs, one VM slot (:data:`~.connection.SLOT`) — from the
moment it is placed until it is removed, so ``ray status`` shows what forkpoint holds and
Ray's scheduler, not forkpoint, picks the node. A fork of N asks for N bundles in one
group, with Ray's ``PACK`` (default: forks share their checkpoint's pages on one node,
spilling over when it is full) or ``SPREAD`` strategy. Ray cannot shrink a group, so a
group is removed with the last of its sessions; when a node dies, Ray moves that node's
bundles to nodes with room, and :meth:`~.runtime.ClusterRuntime.recover` revives each lost
session where its bundle now is.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from forkpoint.cluster.connection import SLOT
from forkpoint.errors import LimitExceeded

__all__ = [
    "OVERHEAD_MIB",
    "Placement",
    "Strategy",
    "bundle_node",
    "group_exists",
    "release",
    "reserve",
]

#: What a VM uses beside its guest memory (QEMU, passt, the volume server), reserved too.
OVERHEAD_MIB = 128
#: How long Ray may take to find room before a create or fork is refused.
_PLACE_TIMEOUT_S = 30.0
_PREFIX = "fp-"


class Strategy(StrEnum):
    PACK = "pack"
    SPREAD = "spread"

    @classmethod
    def of(cls, spread: bool) -> Strategy:
        return cls.SPREAD if spread else cls.PACK


@dataclass(frozen=True)
class Placement:
    group: str  # the placement group's name
    nodes: tuple[str, ...]  # the Ray node id of each bundle


def bundle(memory_mib: int, cpus: int) -> dict[str, float]:
    return {"CPU": float(cpus), "memory": float((memory_mib + OVERHEAD_MIB) << 20), SLOT: 1.0}


def reserve(
    count: int,
    memory_mib: int,
    cpus: int,
    strategy: Strategy,
    on_nodes_labelled: Mapping[str, str] | None = None,
) -> Placement:
    """Reserve ``count`` sessions' room in one request; Ray places them, on nodes with
    the labels ``on_nodes_labelled`` if given (a checkpoint's QEMU build).

    :raises LimitExceeded: Ray found no room for them in time (nothing stays reserved)."""
    import ray
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )

    name = _PREFIX + secrets.token_hex(6)
    group = placement_group(
        [bundle(memory_mib, cpus)] * count,
        strategy=strategy.value.upper(),
        name=name,
        lifetime="detached",  # outlives the client that asked
        bundle_label_selector=[dict(on_nodes_labelled)] * count if on_nodes_labelled else None,
    )
    try:
        ray.get(group.ready(), timeout=_PLACE_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        where = "".join(f" labelled {k}={v}" for k, v in (on_nodes_labelled or {}).items())
        raise LimitExceeded(
            f"the cluster has no room for {count} session(s) of {memory_mib} MiB and "
            f"{cpus} vCPU on nodes{where}: Ray placed none within {_PLACE_TIMEOUT_S:.0f} s "
            "(`forkpoint cluster status` shows what is reserved)"
        ) from None
    table = placement_group_table(group)["bundles_to_node_id"]
    return Placement(name, tuple(str(table[i]) for i in range(count)))


def bundle_node(group: str, bundle: int) -> str | None:
    """Where bundle ``bundle`` of ``group`` is now (None: not placed: no node has room)."""
    import ray
    from ray.util.placement_group import placement_group_table

    try:
        table = placement_group_table(ray.util.get_placement_group(group))
    except ValueError:  # removed
        return None
    node = table["bundles_to_node_id"].get(bundle)
    return str(node) if node else None


def group_exists(group: str) -> bool:
    """Whether Ray has ``group`` (placed or waiting for room)."""
    import ray

    try:
        ray.util.get_placement_group(group)
    except ValueError:
        return False
    return True


def release(group: str) -> None:
    """Give ``group``'s room back to Ray (gone already: nothing to do)."""
    import ray
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(ray.util.get_placement_group(group))
    except ValueError:
        pass


def reservations() -> list[dict[str, object]]:
    """forkpoint's live placement groups, as Ray reports them."""
    from ray.util.placement_group import placement_group_table

    return [
        table
        for table in placement_group_table().values()
        if str(table.get("name", "")).startswith(_PREFIX) and table.get("state") != "REMOVED"
    ]
