"""The cluster as the doors see it: the local runtime's operations, on many hosts.

:class:`ClusterRuntime` offers the operations of :class:`~forkpoint.runtime.Runtime`
that a cluster supports, under the same names and arguments, so a door given one works
unchanged: ``create`` and ``fork`` ask Ray for room (:mod:`.placement`) and have the
node Ray chose do the work; the others go to the node holding the session. An operation
not offered yet fails with one clear line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, cast

from forkpoint.cluster.connection import (
    NODE_LABEL,
    QEMU_LABEL,
    NodeLost,
    connect,
    daemon_errors,
    daemon_name,
    store_url,
)
from forkpoint.cluster.operations import ON_SESSION_NODE
from forkpoint.cluster.placement import Strategy, bundle_node, group_exists, release, reserve
from forkpoint.cluster.records import CheckpointEntry, Records, SessionEntry
from forkpoint.cluster.tunnel import NodeStreamReader, NodeStreamWriter, node_streams
from forkpoint.config import ApiLimits, Home, home
from forkpoint.errors import Conflict, ForkpointError, InvalidInput, NotFound
from forkpoint.models import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    CheckpointKind,
    HostStatus,
    Network,
    Session,
    SessionState,
)
from forkpoint.runtime.admission import UNLIMITED, Admission
from forkpoint.runtime.queries import LISTED_KINDS

if TYPE_CHECKING:
    from forkpoint.agent_client import OutputCallback
    from forkpoint.models import (
        BackgroundProcess,
        Checkpoint,
        CommandResult,
        FileEvent,
        Metric,
        ProcessEvent,
    )

__all__ = ["ClusterRuntime", "NodeView", "NodeLost"]

_NODES_FRESH_S = 1.0
_ANSWER_WITHIN_S = 30.0  # a daemon that hangs: a listing shows its sessions lost


@dataclass(frozen=True)
class NodeView:
    id: str  # Ray's node id
    name: str  # its forkpoint name (label), else its address
    address: str
    alive: bool
    resources: dict[str, float]
    labels: dict[str, str]


class ClusterRuntime:
    """forkpoint on the Ray cluster at ``address`` (``FORKPOINT_CLUSTER``)."""

    def __init__(self, address: str) -> None:
        from forkpoint.runtime.checkpoints.portable.objects import S3Store

        connect(address)
        self.address = address
        self.records = Records(S3Store(store_url()))
        #: Push every checkpoint to the store as it is taken (a lost session's latest).
        self.push = os.environ.get("FORKPOINT_CLUSTER_PUSH", "1") != "0"
        self._nodes: tuple[float, dict[str, NodeView]] | None = None
        self._daemons: dict[str, Any] = {}  # actor handles, by node
        #: What a long-lived door admits; counts the cluster's sessions (:meth:`serve_long_lived`).
        self.admission = Admission(UNLIMITED, self)

    @functools.cached_property
    def home(self) -> Home:
        """This client's own home: a long-lived door's socket and API token live there."""
        return home().ensure()

    # -- nodes -----------------------------------------------------------------------------

    def nodes(self) -> dict[str, NodeView]:
        """Ray's nodes, asked at most once a second (a listing names each session's)."""
        import ray

        now = time.monotonic()
        if self._nodes is not None and now - self._nodes[0] < _NODES_FRESH_S:
            return self._nodes[1]
        views = {
            str(n["NodeID"]): NodeView(
                id=str(n["NodeID"]),
                name=str(n.get("Labels", {}).get(NODE_LABEL) or n["NodeManagerAddress"]),
                address=str(n["NodeManagerAddress"]),
                alive=bool(n["Alive"]),
                resources={k: float(v) for k, v in n.get("Resources", {}).items()},
                labels={str(k): str(v) for k, v in n.get("Labels", {}).items()},
            )
            for n in ray.nodes()  # type: ignore[no-untyped-call]
        }
        self._nodes = (now, views)
        return views

    def forkpoint_nodes(self) -> list[str]:
        """The live nodes a forkpoint daemon runs on."""
        import ray

        named = set(ray.util.list_named_actors())
        return [n for n, v in self.nodes().items() if v.alive and daemon_name(n) in named]

    def daemon(self, node: str) -> Any:
        """``node``'s daemon (its handle asked of Ray's head once, then kept).

        :raises NodeLost: no daemon runs there."""
        import ray

        if node in self._daemons:
            return self._daemons[node]
        try:
            handle = self._daemons[node] = ray.get_actor(daemon_name(node))
            return handle
        except ValueError:
            raise NodeLost(
                f"node {self._name(node)} runs no forkpoint daemon "
                "(gone, or never joined: `forkpoint cluster join` there)"
            ) from None

    def _node_name(self, node: str) -> str:
        """The node's forkpoint name (its label; Ray asked afresh for one just joined),
        kept in its sessions' records: the node rejoining under a new id finds them."""
        view = self.nodes().get(node)
        if view is None:
            self._nodes = None
            view = self.nodes().get(node)
        return view.labels.get(NODE_LABEL, "") if view else ""

    def _name(self, node: str) -> str:
        view = self.nodes().get(node)
        return view.name if view else node[:12]

    async def call(self, node: str, method: str, *args: Any) -> Any:
        """``method`` of ``node``'s daemon; its ForkpointError raised here as itself."""
        with self._answer_of(node, method):
            return await getattr(self.daemon(node), method).remote(*args)

    def call_now(self, node: str, method: str, *args: Any) -> Any:
        """:meth:`call`, blocking (the reads)."""
        import ray

        with self._answer_of(node, method):
            return ray.get(getattr(self.daemon(node), method).remote(*args))

    @contextlib.contextmanager
    def _answer_of(self, node: str, method: str) -> Iterator[None]:
        """:func:`~.connection.daemon_errors`, forgetting the handle of a daemon gone."""
        try:
            with daemon_errors(lambda: self._name(node), method):
                yield
        except NodeLost:
            self._daemons.pop(node, None)  # a daemon joined anew is asked for again
            raise

    def _on(self, session: Session, node: str) -> Session:
        return dataclasses.replace(session, node=self._name(node))

    # -- sessions --------------------------------------------------------------------------

    async def create(
        self,
        *,
        memory_mib: int = DEFAULT_MEMORY_MIB,
        cpus: int = DEFAULT_CPUS,
        name: str | None = None,
        **options: Any,
    ) -> Session:
        """A session from an image, on the node Ray places it on."""
        if name is not None and await asyncio.to_thread(self._named, name):
            raise Conflict(f"a session named {name!r} exists in the cluster")
        placement = await asyncio.to_thread(reserve, 1, memory_mib, cpus, Strategy.PACK)
        node = placement.nodes[0]
        try:
            made = await self.call(
                node, "create", dict(options, memory_mib=memory_mib, cpus=cpus, name=name)
            )
            session = await self._record(made, node, placement.group, 0, None)
            if isinstance(session, ForkpointError):
                raise session
        except BaseException:
            await asyncio.to_thread(release, placement.group)
            raise
        return session

    async def fork(
        self, checkpoint: str, count: int = 1, *, spread: bool = False
    ) -> list[Session | ForkpointError]:
        """``count`` forks of ``checkpoint``, placed by Ray in one request (packed on as
        few nodes as hold them, or ``spread``); a node that lacks the checkpoint fetches
        what it lacks of its lineage: from the store, or (not pushed) from its node."""
        from forkpoint.requests import ForkRequest, parse

        parse(ForkRequest, count=count)
        source = await asyncio.to_thread(self.records.checkpoint, checkpoint)
        same_build = {QEMU_LABEL: source.qemu} if source.qemu else None
        placement = await asyncio.to_thread(
            reserve, count, source.memory_mib, source.cpus, Strategy.of(spread), same_build
        )
        bundles: dict[str, list[int]] = {}
        for index, node in enumerate(placement.nodes):
            bundles.setdefault(node, []).append(index)
        holder = None if source.pushed else source.node

        async def on(node: str, slots: list[int]) -> list[tuple[int, Session | ForkpointError]]:
            try:
                made = await self.call(node, "fork", source.id, len(slots), holder)
            except ForkpointError as error:
                made = [error] * len(slots)
            out: list[tuple[int, Session | ForkpointError]] = []
            for slot, result in zip(slots, made, strict=True):
                if isinstance(result, Session):
                    result = await self._record(result, node, placement.group, slot, source.id)
                out.append((slot, result))
            return out

        placed = await asyncio.gather(*(on(n, slots) for n, slots in bundles.items()))
        results = dict(pair for pairs in placed for pair in pairs)
        if not any(isinstance(r, Session) for r in results.values()):
            await asyncio.to_thread(release, placement.group)
        return [results[i] for i in range(count)]

    async def _record(
        self, session: Session, node: str, group: str, bundle: int, revive_from: str | None
    ) -> Session | ForkpointError:
        """Record a session just made on ``node``; if the store refuses, the session goes
        (a session the cluster has no record of would be nobody's)."""
        name = await asyncio.to_thread(self._node_name, node)
        entry = _entry(session, node, name, group, bundle, revive_from)
        try:
            await asyncio.to_thread(self.records.put_session, entry)
        except ForkpointError as error:
            with contextlib.suppress(ForkpointError):
                await self.call(node, "remove", session.id)
            return error
        return self._on(session, node)

    async def checkpoint(
        self, session: str, name: str | None = None, *, kind: CheckpointKind = CheckpointKind.USER
    ) -> Checkpoint:
        """Checkpoint a session on its node, and push it to the store as it is taken
        (unless ``FORKPOINT_CLUSTER_PUSH=0``): its latest, to revive it from."""
        entry = await asyncio.to_thread(self.live_entry, session)
        made: Checkpoint = await self.call(
            entry.node, "checkpoint", entry.id, name, self.push, kind
        )
        qemu = (await asyncio.to_thread(self.nodes))[entry.node].labels.get(QEMU_LABEL)
        record = CheckpointEntry(
            made.id, made.name, entry.node, entry.memory_mib, entry.cpus, self.push, qemu
        )
        await asyncio.to_thread(self.records.put_checkpoint, record)
        if self.push:
            revived = dataclasses.replace(entry, revive_from=made.id)
            await asyncio.to_thread(self.records.put_session, revived)
        return made

    async def remove(self, session: str) -> str:
        """Remove a session (a lost one: its record and reservation)."""
        entry = await asyncio.to_thread(self.records.session, session)
        if await asyncio.to_thread(self._alive, entry.node):
            try:
                await self.call(entry.node, "remove", entry.id)
            except NotFound:
                pass  # gone from its node already
        await asyncio.to_thread(self.records.drop_session, entry.id)
        # Dropped first, then looked for: of two removals racing, one sees the group empty.
        if not any(e.group == entry.group for e in await asyncio.to_thread(self.records.sessions)):
            await asyncio.to_thread(release, entry.group)
        return entry.id

    async def exec(
        self,
        session: str,
        command: str | Sequence[str],
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        **options: Any,
    ) -> CommandResult:
        """Run a command on the session's node; its output is passed on once it ended."""
        entry = await asyncio.to_thread(self.live_entry, session)
        result: CommandResult = await self.call(entry.node, "exec", entry.id, command, options)
        if on_stdout is not None and result.stdout:
            await on_stdout(result.stdout_bytes)
        if on_stderr is not None and result.stderr:
            await on_stderr(result.stderr_bytes)
        return result

    async def spawn(
        self, session: str, command: str | Sequence[str], **options: Any
    ) -> BackgroundProcess:
        """Start a command in the background on the session's node."""
        entry = await asyncio.to_thread(self.live_entry, session)
        started: BackgroundProcess = await self.call(
            entry.node, "spawn", entry.id, command, options
        )
        return started

    async def recover(self, *, on_node: str | None = None) -> list[Session | ForkpointError]:
        """Revive every lost session where Ray moved its reservation when its node died,
        from its latest checkpoint in the store: same id, name and processes. ``on_node``:
        only those Ray moved to that node (its auto-recover policy)."""
        out: list[Session | ForkpointError] = []
        for entry in await asyncio.to_thread(self.records.sessions):
            if await asyncio.to_thread(self._alive, entry.node):
                continue
            if on_node is not None and entry.revive_from is None:
                continue  # a policy says nothing of what it cannot revive (recover does)
            node = await asyncio.to_thread(bundle_node, entry.group, entry.bundle)
            if on_node is not None and node != on_node:
                continue
            try:
                if node is None and on_node is None and entry.revive_from is not None:
                    entry, node = await self._placed_anew(entry)
                out.append(await self._revive(entry, node))
            except ForkpointError as error:
                out.append(error)
        return out

    async def _placed_anew(self, entry: SessionEntry) -> tuple[SessionEntry, str | None]:
        """A reservation for a lost session whose group Ray no longer has (a head
        restarted without GCS fault tolerance forgot it); one still waiting for room
        stays as it is."""
        if await asyncio.to_thread(group_exists, entry.group):
            return entry, None
        placed = await asyncio.to_thread(reserve, 1, entry.memory_mib, entry.cpus, Strategy.PACK)
        anew = dataclasses.replace(entry, group=placed.group, bundle=0)
        await asyncio.to_thread(self.records.put_session, anew)
        return anew, placed.nodes[0]

    async def _revive(self, entry: SessionEntry, node: str | None) -> Session:
        if entry.revive_from is None:
            raise Conflict(f"{entry.id} has no checkpoint in the store to be revived from")
        if node is None or not await asyncio.to_thread(self._alive, node):
            raise Conflict(
                f"Ray has not placed {entry.id}'s reservation on a live node yet "
                "(no node has room for it): retry when one has"
            )
        session: Session = await self.call(node, "adopt", entry.revive_from, entry.id, entry.name)
        try:  # removed meanwhile (its reservation released): the revived one goes too
            await asyncio.to_thread(self.records.session, entry.id)
        except NotFound:
            await self.call(node, "remove", entry.id)
            raise NotFound(f"{entry.id} was removed while it was being revived") from None
        name = await asyncio.to_thread(self._node_name, node)
        await asyncio.to_thread(self.records.put_session, entry.moved(node, name))
        return self._on(session, node)

    async def remove_checkpoint(self, checkpoint: str) -> None:
        """Remove a checkpoint from every live node that holds a copy, then its record
        (its objects stay in the store: they are shared by content with others).

        :raises InUse: sessions on a node depend on it (copies on other nodes may be gone)."""
        entry = await asyncio.to_thread(self.records.checkpoint, checkpoint)
        nodes = await asyncio.to_thread(self.forkpoint_nodes)
        await asyncio.gather(*(self.call(n, "remove_checkpoint", entry.id) for n in nodes))
        await asyncio.to_thread(self.records.drop_checkpoint, entry.id)

    # -- reads -----------------------------------------------------------------------------

    def list_sessions(self) -> list[Session]:
        """Every session of the cluster; a lost node's are ``lost``."""
        entries = self.records.sessions()
        # The live nodes holding any; a daemon restarting answers nothing yet.
        nodes = {e.node for e in entries} & set(self.forkpoint_nodes())
        answered = self._ask_each(nodes, "sessions")
        live = {s.id: self._on(s, n) for n, held in answered.items() for s in held}
        gone = [e for e in entries if e.node in answered and e.id not in live]
        self._forget(gone, entries)
        return [live.get(e.id) or self._lost(e) for e in entries if e not in gone]

    def _ask_each(self, nodes: Iterable[str], method: str, *args: Any) -> dict[str, Any]:
        """``method`` of every node's daemon, side by side: the answers of those that
        answered (a node gone meanwhile answers nothing: its sessions show lost)."""
        import ray

        asked = []
        for node in nodes:
            with contextlib.suppress(NodeLost):
                asked.append((node, getattr(self.daemon(node), method).remote(*args)))
        answered = {}
        for node, answer in asked:
            with contextlib.suppress(ray.exceptions.RayError):  # a timeout among them
                answered[node] = ray.get(answer, timeout=_ANSWER_WITHIN_S)
        return answered

    def get(self, session: str) -> Session:
        """:raises NotFound:"""
        entry = self.records.session(session)
        if self._alive(entry.node):
            try:
                return self._on(self.call_now(entry.node, "get", entry.id), entry.node)
            except NotFound:
                self._forget([entry], self.records.sessions())  # its lifetime ended there
                raise NotFound(f"no session {session!r} in the cluster") from None
            except NodeLost:
                pass  # went away meanwhile: lost
        return self._lost(entry)

    def _forget(self, gone: list[SessionEntry], entries: list[SessionEntry]) -> None:
        """Drop the records of sessions their live node no longer has (its lifetime ended
        there), and the reservations no other session holds."""
        for entry in gone:
            self.records.drop_session(entry.id)
        kept = {e.group for e in entries if e not in gone}
        for group in {e.group for e in gone} - kept:
            release(group)

    def get_checkpoint(self, checkpoint: str) -> Checkpoint:
        """The checkpoint as the node it was taken on has it. :raises NotFound:"""
        entry = self.records.checkpoint(checkpoint)
        for node in dict.fromkeys([entry.node, *self.forkpoint_nodes()]):
            if self._alive(node):
                try:
                    found = self.call_now(node, "checkpoint_here", entry.id)
                except ForkpointError:  # NodeLost among them
                    continue
                if found is not None:
                    return cast("Checkpoint", found)
        raise NotFound(f"checkpoint {entry.id} is on no live node")

    def list_checkpoints(
        self, session: str | None = None, *, kinds: Sequence[CheckpointKind] = LISTED_KINDS
    ) -> list[Checkpoint]:
        """The cluster's checkpoints (of one session; of ``kinds``), oldest first, as the
        live nodes holding them describe them (one whose every copy was on lost nodes is
        not listed, though a fork still pulls it from the store)."""
        entries = self.records.checkpoints()
        described: dict[str, Checkpoint] = {}
        asked = self._ask_each(self.forkpoint_nodes(), "checkpoints", tuple(kinds))
        for held in asked.values():
            for found in held:
                described.setdefault(found.id, found)
        of = self.records.session(session).id if session is not None else None
        listed = [described[e.id] for e in entries if e.id in described]
        return sorted(
            (c for c in listed if of is None or c.session_id == of), key=lambda c: c.created_at
        )

    @property
    def filters_egress(self) -> bool:
        """Whether every node holds its guests to their egress rules (runs them jailed)."""
        answers = self._ask_each(self.forkpoint_nodes(), "filters_egress")
        return bool(answers) and all(answers.values())

    @contextlib.asynccontextmanager
    async def tcp_tunnel(
        self, session: str, guest_port: int
    ) -> AsyncIterator[tuple[NodeStreamReader, NodeStreamWriter]]:
        """A byte stream to ``guest_port`` in the guest, through its node's daemon and
        agent: no port is opened on any address. :raises NotFound: nothing listens there
        (on enter). :raises NodeLost:"""
        entry = await asyncio.to_thread(self.live_entry, session)
        async with node_streams(
            functools.partial(self.call, entry.node), entry.id, guest_port
        ) as pair:
            yield pair

    #: The scratch forks a diff makes: none here (diff is not offered on a cluster).
    scratch_sessions: frozenset[str] = frozenset()

    def latest_metrics(self) -> dict[str, Metric]:
        """Each session's last metrics sample, by id (each node's daemon samples its own)."""
        return {k: v for held in self._read_each("latest_metrics") for k, v in held.items()}

    def step_labels(self) -> dict[str, str]:
        """Checkpoint id → history step label, from every node (history stays on its node)."""
        return {k: v for held in self._read_each("step_labels") for k, v in held.items()}

    def host_status(self) -> HostStatus:
        """The live nodes' room, added up (the load: the busiest node's)."""
        nodes: list[HostStatus] = self._read_each("host_status")
        added = {
            f.name: sum(getattr(n, f.name) for n in nodes) for f in dataclasses.fields(HostStatus)
        }
        added["load_1m"] = max((n.load_1m for n in nodes), default=0.0)
        return HostStatus(**added)

    def _read_each(self, method: str) -> list[Any]:
        return list(self._ask_each(self.forkpoint_nodes(), "read", method).values())

    def live_entry(self, session: str) -> SessionEntry:
        entry = self.records.session(session)
        if not self._alive(entry.node):
            raise NodeLost(
                f"{entry.id} was on node {self._name(entry.node)}, which is gone: "
                "`forkpoint recover` revives it"
            )
        return entry

    def _alive(self, node: str) -> bool:
        view = self.nodes().get(node)
        return view is not None and view.alive

    def _named(self, name: str) -> bool:
        return any(e.name == name for e in self.records.sessions())

    def _lost(self, entry: SessionEntry) -> Session:
        return Session(
            id=entry.id, name=entry.name, image=entry.image, state=SessionState.LOST,
            created_at=entry.created_at, parent_checkpoint=entry.revive_from,
            memory_mib=entry.memory_mib, cpus=entry.cpus, network=Network.USER,
            node=self._name(entry.node),
        )  # fmt: skip

    # -- operations on one session, run on its node --------------------------------------

    async def _on_session_node(self, method: str, session: str, *args: Any, **kwargs: Any) -> Any:
        entry = await asyncio.to_thread(self.live_entry, session)
        answer = await self.call(entry.node, "on_session", method, entry.id, args, kwargs)
        return self._on(answer, entry.node) if isinstance(answer, Session) else answer

    async def write_file(
        self, session: str, path: str, data: bytes | IO[bytes], *args: Any, **kwargs: Any
    ) -> None:
        """Write a guest file on the session's node (a file's bytes cross Ray whole)."""
        payload = data if isinstance(data, bytes) else await asyncio.to_thread(data.read)
        await self._on_session_node("write_file", session, path, payload, *args, **kwargs)

    async def read_file_to(self, session: str, path: str, out: IO[bytes]) -> int:
        """Read a guest file from the session's node into ``out``; its size."""
        data: bytes = await self._on_session_node("read_file", session, path)
        await asyncio.to_thread(out.write, data)
        return len(data)

    def start_process(
        self, session: str, cmd: str, args: Sequence[str] = (), **options: Any
    ) -> AsyncIterator[ProcessEvent]:
        """A guest process on the session's node: its events as they come."""
        return self._events("start_process", session, (cmd, tuple(args)), options)

    def attach_process(self, session: str, pid: int) -> AsyncIterator[ProcessEvent]:
        return self._events("attach_process", session, (pid,), {})

    @contextlib.asynccontextmanager
    async def watch_dir(
        self, session: str, path: str, **options: Any
    ) -> AsyncIterator[AsyncIterator[FileEvent]]:
        """Watch a guest directory on the session's node while the block runs: iterate
        for each change as it comes. :raises NotFound: no such directory (on enter)."""
        changes = self._events("watch_dir", session, (path,), options)
        try:
            await anext(changes)  # None: it is watched
            yield cast("AsyncIterator[FileEvent]", changes)
        finally:
            await changes.aclose()

    async def _events(
        self, method: str, session: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncGenerator[Any]:
        import ray

        entry = await asyncio.to_thread(self.live_entry, session)
        daemon = self.daemon(entry.node)
        events = daemon.events.options(num_returns="streaming").remote(
            method, entry.id, args, kwargs
        )
        try:
            with self._answer_of(entry.node, method):
                async for event in events:
                    yield await event
        finally:  # a client that hung up detaches: the process runs on in the guest
            with contextlib.suppress(Exception):
                ray.cancel(events)

    async def rollback(self, session: str, checkpoint: str | None = None) -> Session:
        """Roll a session back on its node; a node loss then revives the state rolled
        back to (when that checkpoint is in the store), not the one rolled back from."""
        if checkpoint is not None:  # taken elsewhere: the node fetches it first
            entry = await asyncio.to_thread(self.live_entry, session)
            with contextlib.suppress(NotFound):
                source = await asyncio.to_thread(self.records.checkpoint, checkpoint)
                if source.pushed:
                    await self.call(entry.node, "pull", source.id)
                elif source.node != entry.node:
                    await self.call(entry.node, "pull", source.id, source.node)
        rolled: Session = await self._on_session_node("rollback", session, checkpoint)
        entry = await asyncio.to_thread(self.records.session, rolled.id)
        target = rolled.parent_checkpoint
        if target is not None and target != entry.revive_from:
            with contextlib.suppress(NotFound):
                if (await asyncio.to_thread(self.records.checkpoint, target)).pushed:
                    revived = dataclasses.replace(entry, revive_from=target)
                    await asyncio.to_thread(self.records.put_session, revived)
        return rolled

    # -- a long-lived door's runtime -------------------------------------------------------

    def serve_long_lived(self, limits: ApiLimits) -> Admission:
        """As :meth:`Runtime.serve_long_lived`: admit heavy operations within ``limits``,
        counting the sessions of the whole cluster (warm VMs and standbys are each
        node's own)."""
        if self.admission.limits == UNLIMITED:
            self.admission = Admission(limits, self)
        return self.admission

    async def expire(self) -> list[str]:
        """Nothing here: lifetimes end on each node, whose daemon runs the reaper."""
        return []

    async def sample_metrics(self) -> int:
        """Nothing here: each node samples its own sessions."""
        return 0

    def close(self) -> None:
        """Nothing to close: Ray's connection ends with the process."""

    # -- the rest of the local runtime ---------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """An operation on one session (:data:`~.operations.ON_SESSION_NODE`) runs on its
        node as it is; any other the cluster does not offer fails with one line."""
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ON_SESSION_NODE:
            return functools.partial(self._on_session_node, name)
        raise InvalidInput(
            f"{name.replace('_', ' ')} is not available on a cluster yet "
            "(unset FORKPOINT_CLUSTER to work on this host alone)"
        )


def _entry(
    session: Session, node: str, node_name: str, group: str, bundle: int, revive_from: str | None
) -> SessionEntry:
    return SessionEntry(
        id=session.id, name=session.name, node=node, group=group, bundle=bundle,
        image=session.image, created_at=session.created_at, memory_mib=session.memory_mib,
        cpus=session.cpus, revive_from=revive_from, node_name=node_name,
    )  # fmt: skip
