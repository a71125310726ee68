"""Many hosts as one forkpoint, on Ray (``forkpoint[cluster]``).

Ray decides where every session runs: each holds a bundle of a placement group (its
guest memory and overhead, its vCPUs, one VM slot) for as long as it lives, and the node
that bundle lands on restores it. A node daemon (a Ray actor per host, :mod:`.node`) owns
that host's ``$FORKPOINT_HOME`` and VMs and does what the local runtime does; the
cluster's S3 store carries checkpoints between nodes and the record of every session
(:mod:`.records`), so a session outlives its node. :class:`~.runtime.ClusterRuntime` is
what the doors hold instead of the local runtime when ``FORKPOINT_CLUSTER`` is set.

Nothing here is imported on one host: ``ray`` is loaded only in cluster mode.
"""
