"""Deleting what nothing needs any more: checkpoints on request, the hidden checkpoints of
sessions that are gone, and the disk layers, warm VMs, standbys and cgroups no session or
checkpoint depends on."""

from __future__ import annotations

import asyncio

from forkpoint.errors import ForkpointError
from forkpoint.models import CheckpointKind
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.sessions.cleanup import collect_layers
from forkpoint.runtime.sessions.limits import sweep_cgroups

__all__ = ["Collector"]


class Collector:
    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    def gc(self) -> list[str]:
        """Delete disk layers nothing depends on any more; returns their names.

        Opportunistic: skipped while another process builds an image template (its base
        layer has no referrer until the template checkpoint exists). Empty cgroups of
        sessions that are gone are removed too.
        """
        ctx = self.context
        checkpoints = {c.id for c in ctx.store.list_checkpoints()}
        ctx.warm.drain_stale(checkpoints)
        ctx.standbys.drain(checkpoints)
        warm = {w.id for w in ctx.warm.rows.all()}
        sweep_cgroups({r.id for r in ctx.store.list_sessions()} | warm)
        return collect_layers(ctx.home, ctx.store)

    async def remove_checkpoint(self, checkpoint: str) -> None:
        """Delete a checkpoint. :raises InUse: sessions or checkpoints depend on it."""
        await asyncio.to_thread(self.remove_checkpoint_now, checkpoint)

    def remove_checkpoint_now(self, checkpoint: str) -> None:
        """:meth:`remove_checkpoint`, blocking."""
        from forkpoint.runtime.inspection.diffs import ScanCache

        record = self.context.store.get_checkpoint(checkpoint)
        self.context.checkpointer.delete(record.id)
        ScanCache(self.context.home.root / "scans").forget(record.id)
        self.gc()

    def collect_hidden_checkpoints(self) -> list[str]:
        """Delete the pause and fork checkpoints of sessions that are gone, once nothing
        depends on them (blocking); returns their ids. Newest first: a pause after a resume
        is a child of the previous pause, which is free once the child is gone."""
        store = self.context.store
        live = {r.id for r in store.list_sessions()}
        gone = []
        hidden = store.list_checkpoints(kind=(CheckpointKind.PAUSE, CheckpointKind.FORK))
        for checkpoint in reversed(hidden):
            if checkpoint.session_id in live:
                continue
            try:
                self.remove_checkpoint_now(checkpoint.id)
            except ForkpointError:
                continue  # a fork still maps it
            gone.append(checkpoint.id)
        return gone
