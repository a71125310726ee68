"""The runtime a door serves: this host's, or the cluster's when ``FORKPOINT_CLUSTER`` is
set. Every door (CLI, REST, SDK, MCP, the E2B gateway) opens its runtime here, so each
of them works on a cluster the same way; Ray is imported only in cluster mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from forkpoint.config import cluster_address

if TYPE_CHECKING:
    from forkpoint.e2b.tables import GatewayTables
    from forkpoint.runtime import Runtime

__all__ = ["gateway_tables", "open_runtime"]


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


def gateway_tables(runtime: Runtime) -> GatewayTables:
    """Where the E2B gateway serving ``runtime`` keeps its rows: on one host in its store;
    on a cluster its sandboxes' in the cluster's store (a revived sandbox keeps its
    tokens), its template builds' in this host's (closed with it by the caller)."""
    from forkpoint.e2b.tables import GatewayTables

    if cluster_address() is None:
        return GatewayTables.beside(runtime.store)
    from forkpoint.cluster.records import SandboxEntries
    from forkpoint.cluster.runtime import ClusterRuntime
    from forkpoint.store import Store

    cluster = cast("ClusterRuntime", runtime)
    return GatewayTables(SandboxEntries(cluster.records.store), Store.open(runtime.home))
