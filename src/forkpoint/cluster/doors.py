"""The runtime a door serves: this host's, or the cluster's when ``FORKPOINT_CLUSTER`` is
set. Every door (CLI, REST, SDK, MCP, the E2B gateway) opens its runtime here, so each
of them works on a cluster the same way; Ray is imported only in cluster mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from forkpoint.config import cluster_address

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = ["open_runtime"]


def open_runtime() -> Runtime:
    """This host's runtime, or with ``FORKPOINT_CLUSTER`` set the cluster's
    (:class:`~.runtime.ClusterRuntime`: the same operations' names and arguments; one it
    does not offer yet fails with one line)."""
    address = cluster_address()
    if address is None:
        from forkpoint.runtime import Runtime

        return Runtime.open()
    from forkpoint.cluster.runtime import ClusterRuntime

    return cast("Runtime", ClusterRuntime(address))
