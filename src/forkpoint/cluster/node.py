"""The node daemon: a Ray actor per host, owning that host's ``$FORKPOINT_HOME``.

It holds the host's local :class:`~forkpoint.runtime.Runtime` and does what it does —
create, fork, checkpoint, remove, exec — for the cluster's clients, plus what only a
cluster needs: a checkpoint fetched from the store before a fork (:meth:`fork`), a lost
session revived under its own id (:meth:`adopt`), and byte streams to a guest port for
the client's tunnel (:meth:`tunnel_open`), so a session's ports never leave its node's
loopback. Its VMs outlive it, as they outlive a CLI: a restarted daemon finds them in
the home's store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forkpoint.errors import ForkpointError, InvalidInput, NotFound

if TYPE_CHECKING:
    from forkpoint.agent_client.tunnel import TunnelReader, TunnelWriter
    from forkpoint.cluster.records import Records, SessionEntry
    from forkpoint.models import (
        BackgroundProcess,
        Checkpoint,
        CheckpointKind,
        CheckpointTransfer,
        CommandResult,
        FileEvent,
        ProcessEvent,
        Session,
    )
    from forkpoint.runtime.checkpoints.portable.objects import TarReader

__all__ = ["NodeDaemon"]

_log = logging.getLogger("forkpoint.cluster")
_REVIVE_EVERY_S = 2.0


class NodeDaemon:
    def __init__(self, name: str, env: Mapping[str, str]) -> None:
        os.environ.update(env)  # the joiner's home and store: this process is the daemon's
        from forkpoint.cluster.connection import store_url
        from forkpoint.runtime import Runtime

        self.name = name
        self.store = store_url()
        self.runtime = Runtime.open()
        self._reaper: asyncio.Task[None] | None = None
        self._reviver: asyncio.Task[None] | None = None  # the auto-recover policy, when on
        self._revives_at_start = self._policy_file.exists()
        self._adopting = asyncio.Lock()
        self._tunnels: dict[int, tuple[contextlib.AsyncExitStack, TunnelReader, TunnelWriter]]
        self._tunnels = {}
        self._ids = itertools.count(1)
        #: Archives of checkpoints other nodes fetch from here (:mod:`.transfer`), and
        #: how many fetches each still serves.
        self._exports: dict[str, asyncio.Future[TarReader]] = {}
        self._fetching: dict[str, int] = {}
        self._reading = asyncio.Lock()  # one read at a time: readers share a file object
        shutil.rmtree(self._exports_dir, ignore_errors=True)  # a restarted daemon's leftovers

    def _ready(self) -> None:
        """Once, in the actor's event loop (it exists only once a call runs): the fan-out
        pool, the reaper — lifetimes end on time and metrics are sampled, as beside
        ``forkpoint serve`` — and the auto-recover policy if this node has it on (kept in
        its home: a daemon Ray restarted keeps it)."""
        if self._reaper is None:
            from forkpoint.runtime.housekeeping.reaper import reap_forever
            from forkpoint.threads import use_fan_out_pool

            use_fan_out_pool()
            self._reaper = asyncio.get_running_loop().create_task(reap_forever(self.runtime))
            self._revive(self._revives_at_start)

    @property
    def _policy_file(self) -> Path:
        return self.runtime.home.root / "cluster-auto-recover"

    @property
    def _exports_dir(self) -> Path:
        return self.runtime.home.root / "cluster-exports"

    async def info(self) -> dict[str, Any]:
        """This node: its name, host, home and how many sessions run here."""
        self._ready()
        sessions = await asyncio.to_thread(self.runtime.list_sessions)
        return {
            "name": self.name,
            "host": socket.gethostname(),
            "home": str(self.runtime.home.root),
            "sessions": len(sessions),
            "auto_recover": self._reviver is not None,
        }

    async def set_auto_recover(self, on: bool) -> None:
        """The automatic recover policy (off by default): every few seconds, revive the
        lost sessions whose reservations Ray moved to this node — Ray's placement picks
        the node, as for a create, so nodes never race for one session."""
        self._ready()
        if on:
            await asyncio.to_thread(self._policy_file.touch)
        else:
            await asyncio.to_thread(self._policy_file.unlink, missing_ok=True)
        self._revive(on)

    def _revive(self, on: bool) -> None:
        """Run the auto-recover policy's loop, or stop it."""
        if on and self._reviver is None:
            self._reviver = asyncio.get_running_loop().create_task(self._revive_forever())
        elif not on and self._reviver is not None:
            self._reviver.cancel()
            self._reviver = None

    async def _revive_forever(self) -> None:
        import ray

        from forkpoint.cluster.runtime import ClusterRuntime

        context = ray.get_runtime_context()
        cluster: ClusterRuntime | None = None
        told: set[str] = set()  # a failure is logged once, not every round
        while True:
            try:
                if cluster is None:
                    cluster = await asyncio.to_thread(ClusterRuntime, context.gcs_address)
                for result in await cluster.recover(on_node=context.get_node_id()):
                    if not isinstance(result, ForkpointError):
                        _log.warning("auto-recover revived %s here", result.id)
                    elif str(result) not in told:
                        told.add(str(result))
                        _log.warning("auto-recover: %s", result)
            except Exception:  # keep going: the next round may find the store back
                _log.exception("auto-recover failed")
            await asyncio.sleep(_REVIVE_EVERY_S)

    async def reconcile(self, node: str) -> dict[str, list[str]]:
        """Make this home and the cluster's records agree as this node joins (Ray id
        ``node``). A session whose record names this node under an id Ray no longer knows
        (a head restarted without GCS fault tolerance forgets every node; a host's Ray
        restarted gets a new id) is this node's again: its record re-pointed, its
        reservation made anew here if its old one is gone. Any other session the cluster
        no longer places here (revived elsewhere while this node was gone, or removed) is
        removed: a node's home belongs to the cluster. The ids of both."""
        from forkpoint.cluster.records import Records
        from forkpoint.runtime.checkpoints.portable.objects import S3Store

        self._ready()
        records = Records(S3Store(self.store))
        entries = {e.id: e for e in await asyncio.to_thread(records.sessions)}
        known = await asyncio.to_thread(_live_nodes)
        readopted, stale = [], []
        for session in await self.sessions():
            entry = entries.get(session.id)
            if entry is not None and entry.node == node:
                continue
            if entry is None or (entry.node in known and entry.node_name != self.name):
                await self.runtime.remove(session.id)  # removed, or revived on a live node
                stale.append(session.id)
            else:  # placed here under another id (a record of before node_name: a dead one)
                await asyncio.to_thread(self._readopt, records, entry, node, entries)
                readopted.append(session.id)
        return {"readopted": readopted, "removed_stale": stale}

    def _readopt(
        self, records: Records, entry: SessionEntry, node: str, entries: dict[str, SessionEntry]
    ) -> None:
        """Point ``entry`` at this node's new id, with a reservation here (made anew if
        its group is gone, or Ray moved its bundle; the old group released once none of
        its sessions holds it)."""
        from forkpoint.cluster.connection import NODE_LABEL
        from forkpoint.cluster.placement import Strategy, bundle_node, release, reserve

        moved = entry.moved(node, self.name)
        if bundle_node(entry.group, entry.bundle) != node:  # gone with the head, or moved
            here = reserve(1, entry.memory_mib, entry.cpus, Strategy.PACK, {NODE_LABEL: self.name})
            moved = dataclasses.replace(moved, group=here.group, bundle=0)
            if not any(e.group == entry.group for e in entries.values() if e.id != entry.id):
                release(entry.group)
        records.put_session(moved)
        entries[entry.id] = moved  # its siblings see the old group as released by it

    async def create(self, options: dict[str, Any]) -> Session:
        self._ready()
        return await self.runtime.create(**options)

    async def time_creates(self, rounds: int, memory_mib: int) -> list[float]:
        """Seconds of each of ``rounds`` creates by this host's own runtime, each session
        removed again: what a create costs here without the cluster (``bench --cluster``)."""
        return await self._timed(rounds, lambda: self.runtime.create(memory_mib=memory_mib))

    async def time_forks(self, checkpoint: str, rounds: int) -> list[float]:
        """The same for single forks of ``checkpoint`` (here already)."""

        async def fork() -> Session:
            made = (await self.runtime.fork(checkpoint, 1))[0]
            if isinstance(made, ForkpointError):
                raise made
            return made

        return await self._timed(rounds, fork)

    async def _timed(self, rounds: int, make: Callable[[], Awaitable[Session]]) -> list[float]:
        self._ready()
        seconds = []
        for _ in range(rounds):
            start = time.perf_counter()
            made = await make()
            seconds.append(time.perf_counter() - start)
            await self.runtime.remove(made.id)
        return seconds

    async def on_session(
        self, method: str, session: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """One of the local runtime's operations on a session of this home, as it is
        (:data:`~.operations.ON_SESSION_NODE`; nothing else runs this way)."""
        from forkpoint.cluster.operations import ON_SESSION_NODE

        if method not in ON_SESSION_NODE:
            raise InvalidInput(f"{method} is not an operation a node runs for the cluster")
        self._ready()
        return await getattr(self.runtime, method)(session, *args, **kwargs)

    async def events(
        self, method: str, session: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> AsyncIterator[ProcessEvent | FileEvent | None]:
        """A stream of events, sent to the client as they come (a Ray streaming
        generator): a guest process's, started here (``start_process``) or re-attached
        (``attach_process``), or a directory's changes (``watch_dir``: None first, once
        it is watched)."""
        self._ready()
        if method == "watch_dir":
            async with self.runtime.watch_dir(session, *args, **kwargs) as watch:
                yield None
                async for change in watch:
                    yield change
            return
        if method not in ("start_process", "attach_process"):
            raise InvalidInput(f"{method} is not a stream of events")
        async for event in getattr(self.runtime, method)(session, *args, **kwargs):
            yield event

    async def fork(
        self, checkpoint: str, count: int, holder: str | None = None
    ) -> list[Session | ForkpointError]:
        """``count`` forks of ``checkpoint``, fetched first if this home lacks it (with
        what it lacks of its lineage): from the store, or from node ``holder``."""
        self._ready()
        await self._have(checkpoint, holder)
        return await self.runtime.fork(checkpoint, count)

    async def adopt(self, checkpoint: str, session_id: str, name: str | None) -> Session:
        """Revive a lost session here: ``checkpoint`` restored under its id and name (once:
        a second ask, as from ``recover`` beside the auto-recover policy, finds it here)."""
        self._ready()
        async with self._adopting:
            with contextlib.suppress(NotFound):
                return await asyncio.to_thread(self.runtime.get, session_id)
            await self._have(checkpoint)
            return await self.runtime.adopt(checkpoint, session_id, name)

    async def checkpoint(
        self, session: str, name: str | None, push: bool, kind: CheckpointKind
    ) -> Checkpoint:
        """Checkpoint ``session``; with ``push``, into the store too (any node can then
        restore it, and a lost session is revived from it)."""
        self._ready()
        made = await self.runtime.checkpoint(session, name=name, kind=kind)
        if push:
            await self.runtime.push_checkpoint(made.id, self.store)
        return made

    async def remove(self, session: str) -> str:
        self._ready()
        return await self.runtime.remove(session)

    async def exec(
        self, session: str, command: Sequence[str], options: dict[str, Any]
    ) -> CommandResult:
        self._ready()
        return await self.runtime.exec(session, command, **options)

    async def spawn(
        self, session: str, command: Sequence[str], options: dict[str, Any]
    ) -> BackgroundProcess:
        self._ready()
        return await self.runtime.spawn(session, command, **options)

    async def checkpoint_here(self, checkpoint: str) -> Checkpoint | None:
        """This home's copy of ``checkpoint`` (taken or pulled here), if any."""
        try:
            return await asyncio.to_thread(self.runtime.get_checkpoint, checkpoint)
        except NotFound:
            return None

    async def remove_checkpoint(self, checkpoint: str) -> bool:
        """Remove this home's copy, if any. :raises InUse: a session here depends on it."""
        if await self.checkpoint_here(checkpoint) is None:
            return False
        await self.runtime.remove_checkpoint(checkpoint)
        return True

    async def sessions(self) -> list[Session]:
        return await asyncio.to_thread(self.runtime.list_sessions)

    async def checkpoints(self, kinds: Sequence[CheckpointKind]) -> list[Checkpoint]:
        """This home's checkpoints of ``kinds`` (taken or pulled here)."""
        return await asyncio.to_thread(self.runtime.list_checkpoints, kinds=kinds)

    async def filters_egress(self) -> bool:
        return self.runtime.filters_egress

    async def read(self, method: str) -> Any:
        """One of the local runtime's reads of this whole node (:data:`~.operations.NODE_READS`)."""
        from forkpoint.cluster.operations import NODE_READS

        if method not in NODE_READS:
            raise InvalidInput(f"{method} is not a read a node answers for the cluster")
        return await asyncio.to_thread(getattr(self.runtime, method))

    async def get(self, session: str) -> Session:
        return await asyncio.to_thread(self.runtime.get, session)

    async def _have(self, checkpoint: str, holder: str | None = None) -> CheckpointTransfer | None:
        """Bring ``checkpoint`` here unless this home has it: from the store, or from the
        node ``holder`` (one taken there with ``FORKPOINT_CLUSTER_PUSH=0``); what moved."""
        if await self.checkpoint_here(checkpoint) is not None:
            return None
        if holder is None:
            return await self.runtime.pull_checkpoint(checkpoint, self.store)
        from forkpoint.cluster.transfer import NodeObjects
        from forkpoint.runtime.checkpoints.portable.common import EXPORT_REF

        objects = await asyncio.to_thread(NodeObjects.of, holder, checkpoint)
        try:
            return await self.runtime.pull_checkpoint(EXPORT_REF, objects)
        finally:
            await asyncio.to_thread(objects.release)

    async def pull(self, checkpoint: str, holder: str | None = None) -> CheckpointTransfer | None:
        """Bring ``checkpoint`` here ahead of a fork or rollback (None: here already)."""
        self._ready()
        return await self._have(checkpoint, holder)

    # -- exports: checkpoints other nodes fetch from here (cluster/transfer.py) ----------

    async def export(self, checkpoint: str) -> None:
        """Write ``checkpoint`` and its lineage into one archive here, once, for a node
        fetching it; each ask is answered by one :meth:`export_drop` (the archive is
        deleted with the last)."""
        self._ready()
        if checkpoint not in self._exports:
            self._exports[checkpoint] = asyncio.ensure_future(self._export(checkpoint))
        self._fetching[checkpoint] = self._fetching.get(checkpoint, 0) + 1
        try:
            await asyncio.shield(self._exports[checkpoint])
        except BaseException:
            await self.export_drop(checkpoint)
            raise

    async def _export(self, checkpoint: str) -> TarReader:
        from forkpoint.runtime.checkpoints.portable.objects import TarReader

        path = self._export_path(checkpoint)
        try:
            await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
            await self.runtime.export_checkpoint(checkpoint, path)
            return await asyncio.to_thread(TarReader, path)
        except BaseException:
            await asyncio.to_thread(path.unlink, missing_ok=True)
            raise

    async def export_has(self, checkpoint: str, key: str) -> bool:
        return (await self._export_of(checkpoint)).has(key)

    async def export_read(self, checkpoint: str, key: str, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of object ``key`` of the export, from ``offset``.
        :raises NotFound: no such object (or no export: :meth:`export` first)."""
        reader = await self._export_of(checkpoint)
        async with self._reading:
            return await asyncio.to_thread(reader.read_at, key, offset, size)

    async def export_drop(self, checkpoint: str) -> None:
        """A node has what it fetched (or gave up): with the last of them, the archive
        is deleted."""
        left = self._fetching.get(checkpoint, 0) - 1
        if left > 0:
            self._fetching[checkpoint] = left
            return
        self._fetching.pop(checkpoint, None)
        made = self._exports.pop(checkpoint, None)
        if made is None:
            return
        with contextlib.suppress(Exception):
            reader = await made
            async with self._reading:  # not under a read
                reader.close()
        await asyncio.to_thread(self._export_path(checkpoint).unlink, missing_ok=True)

    def _export_path(self, checkpoint: str) -> Path:
        return self._exports_dir / f"{checkpoint}.tar"

    async def _export_of(self, checkpoint: str) -> TarReader:
        made = self._exports.get(checkpoint)
        if made is None:
            raise NotFound(f"node {self.name} exports no {checkpoint} now")
        return await asyncio.shield(made)

    # -- tunnels: a client's local listener reaches a guest port through these -----------

    async def tunnel_open(self, session: str, guest_port: int) -> int:
        """A byte stream to ``guest_port`` in the guest (over its agent: no forward, no
        port on any host address); its id. :raises NotFound: nothing listens there."""
        self._ready()
        stack = contextlib.AsyncExitStack()
        reader, writer = await stack.enter_async_context(
            self.runtime.tcp_tunnel(session, guest_port)
        )
        tunnel = next(self._ids)
        self._tunnels[tunnel] = (stack, reader, writer)
        return tunnel

    async def tunnel_send(self, tunnel: int, data: bytes) -> None:
        """Bytes to the guest; ``b""``: the client's side closed (EOF)."""
        _, _, writer = self._tunnel(tunnel)
        if data:
            writer.write(data)
            await writer.drain()
        else:
            writer.write_eof()

    async def tunnel_receive(self, tunnel: int) -> bytes:
        """The guest's next bytes; ``b""`` at its EOF."""
        _, reader, _ = self._tunnel(tunnel)
        return await reader.read(1 << 16)

    async def tunnel_close(self, tunnel: int) -> None:
        entry = self._tunnels.pop(tunnel, None)
        if entry is not None:
            with contextlib.suppress(ForkpointError, OSError):
                await entry[0].aclose()

    def _tunnel(self, tunnel: int) -> tuple[Any, TunnelReader, TunnelWriter]:
        try:
            return self._tunnels[tunnel]
        except KeyError:
            raise NotFound(f"no tunnel {tunnel} on node {self.name}") from None


def _live_nodes() -> set[str]:
    """The ids of the nodes Ray knows alive now."""
    import ray

    return {str(n["NodeID"]) for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]
