"""``forkpoint cluster join``: this host becomes a node of the cluster.

It starts this host's Ray node (unless one runs) with forkpoint's VM slots and name, then
the node daemon pinned to it. The raylet is told not to kill its workers' children when
a worker exits: the daemon's VMs must outlive it, as they outlive a CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from forkpoint.cluster.connection import (
    NODE_LABEL,
    QEMU_LABEL,
    SLOT,
    connect,
    daemon_name,
    require_token_auth,
    store_url,
)
from forkpoint.config import home
from forkpoint.errors import InternalError, NotConfigured

__all__ = ["join"]

_DAEMON_START_S = 120.0
#: What the daemon takes from the joiner's environment: its home and the cluster's store.
_PASSED = (
    "FORKPOINT_CLUSTER_STORE",
    "FORKPOINT_CLUSTER_PUSH",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
)


def join(
    address: str,
    name: str,
    *,
    slots: int,
    cpus: int | None,
    start_ray: bool,
    auto_recover: bool = False,
) -> dict[str, Any]:
    """Join the cluster at ``address`` as node ``name`` offering ``slots`` VMs (again: set
    its daemon's ``auto_recover`` policy); the daemon's own description once it answers.

    :raises NotConfigured: no token authentication or store; :raises InternalError:
        ``ray start`` failed."""
    from forkpoint.vm import qemu_build

    require_token_auth()
    store_url()
    labels = {NODE_LABEL: name, QEMU_LABEL: qemu_build().digest}
    if start_ray:
        _start_ray(address, labels, slots, cpus)
    connect(address)

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from forkpoint.cluster.node import NodeDaemon

    node = _this_node(labels)
    env = {k: os.environ[k] for k in _PASSED if k in os.environ}
    env["FORKPOINT_HOME"] = str(home().root)
    daemon: Any = (
        ray.remote(NodeDaemon)
        .options(
            name=daemon_name(node),
            lifetime="detached",  # lives with its node, not with this command
            get_if_exists=True,
            num_cpus=0,
            max_restarts=-1,  # a daemon that died comes back; its VMs kept running
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote(name, env)
    )
    reconciled = ray.get(daemon.reconcile.remote(node), timeout=_DAEMON_START_S)
    ray.get(daemon.set_auto_recover.remote(auto_recover), timeout=_DAEMON_START_S)
    info: dict[str, Any] = ray.get(daemon.info.remote(), timeout=_DAEMON_START_S)
    return dict(info, node_id=node, **reconciled)


def _this_node(labels: dict[str, str]) -> str:
    """The Ray node of this host: the live one labelled with its name (a driver's own
    node id can be another raylet's where several share a machine, as in the tests), and
    with this host's QEMU build.

    :raises NotConfigured: no such node, or its labels are not this host's."""
    import ray

    wanted = _label_arg(labels)
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        has = node.get("Labels", {})
        if node["Alive"] and has.get(NODE_LABEL) == labels[NODE_LABEL]:
            if any(has.get(k) != v for k, v in labels.items()):
                raise NotConfigured(f"this host's Ray node must be labelled {wanted}")
            return str(node["NodeID"])
    raise NotConfigured(
        f"no live Ray node is labelled {NODE_LABEL}={labels[NODE_LABEL]}: start this host's "
        f"Ray node with `--labels {wanted}` (or let `forkpoint cluster join` start it)"
    )


def _label_arg(labels: dict[str, str]) -> str:
    """``ray start --labels``'s form: ``k1=v1,k2=v2``."""
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _start_ray(address: str, labels: dict[str, str], slots: int, cpus: int | None) -> None:
    argv = [
        str(Path(sys.executable).with_name("ray")), "start", "--address", address,
        "--resources", json.dumps({SLOT: slots}),
        "--labels", _label_arg(labels),
        "--disable-usage-stats",
    ]  # fmt: skip
    if cpus is not None:
        argv += ["--num-cpus", str(cpus)]
    env = dict(os.environ, RAY_kill_child_processes_on_worker_exit="0")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InternalError(
            f"ray start failed (exit {done.returncode})", log_tail=done.stderr[-2000:]
        )
