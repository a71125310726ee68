"""E2B sandbox lifecycle on forkpoint sessions: a mapping of E2B's API onto runtime
operations, with no lock, state or reaper of its own.

A sandbox *is* a session (same id); the store's ``e2b_sandboxes`` row adds only what E2B
has and forkpoint does not (access token, template name, metadata, default environment).
Mapping: create = ``create(image)`` or ``fork(checkpoint)``; timeout = the session's
lifetime, ``autoPause`` its ``on_expiry`` (the runtime's reaper ends it); pause = ``pause``;
resume = ``resume`` (same id, same host ports, processes at the same PIDs); fork =
``checkpoint`` (a hidden ``fork`` one) + ``fork``; snapshot = a named checkpoint; kill =
``remove``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from forkpoint.config import ApiLimits
from forkpoint.errors import Conflict, ForkpointError, InvalidInput, NotFound
from forkpoint.images.recipe import E2B_BASE_IMAGE
from forkpoint.models import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    Checkpoint,
    CheckpointKind,
    Expiry,
    Network,
    Session,
    SessionState,
)
from forkpoint.runtime import Runtime
from forkpoint.store.e2b import E2bSandboxRecord

from .network import Egress
from .tables import GatewayTables
from .template_builds import TemplateBuilds

__all__ = [
    "DEFAULT_TEMPLATE",
    "GatewayConfig",
    "Sandbox",
    "SandboxSpec",
    "Sandboxes",
    "TrafficDenied",
]

DEFAULT_TEMPLATE = E2B_BASE_IMAGE  # the image with what E2B code assumes (python, node, ...)
_BASE_TEMPLATES = frozenset({DEFAULT_TEMPLATE, "default"})


@dataclass(frozen=True)
class GatewayConfig:
    """``domain`` is what ``get_host`` appends (``localhost:<proxy port>``);
    ``default_timeout_s`` E2B's 300 s unless configured."""

    domain: str = "localhost:3001"
    default_timeout_s: int = 300
    envd_version: str = "0.6.4"
    memory_mib: int = DEFAULT_MEMORY_MIB
    cpus: int = DEFAULT_CPUS
    #: What the gateway admits (the runtime's policy); None: ``ApiLimits.from_env()``.
    limits: ApiLimits | None = None
    #: Whether template builds are served: their steps run as root on the host.
    template_builds: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    """What E2B's create asks for. The last five stay on the sandbox's record, and its
    forks inherit them (with tokens of their own), as they do its lifetime's end."""

    template: str | None = None
    timeout_s: int | None = None
    auto_pause: bool = False
    #: Whether its auto-pause keeps its memory (E2B's ``keep_memory``), else only its disk.
    pause_memory: bool = True
    egress: Egress = Egress()
    metadata: Mapping[str, str] = field(default_factory=dict)
    env_vars: Mapping[str, str] = field(default_factory=dict)
    public_traffic: bool = True
    auto_resume: bool = False
    host_mask: str | None = None
    #: ``{guest path: volume name}`` (E2B's ``volumeMounts``).
    volumes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sandbox:
    """One E2B sandbox: the session and its gateway record."""

    session: Session
    record: E2bSandboxRecord

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def paused(self) -> bool:
        return self.session.state != SessionState.RUNNING

    @property
    def end_at(self) -> float:
        """When its lifetime ends (Unix seconds); a paused sandbox's never does: now."""
        expires_at = self.session.expires_at
        if expires_at is None:
            return time.time()
        return datetime.fromisoformat(expires_at.replace("Z", "+00:00")).timestamp()

    @property
    def auto_pause(self) -> bool:
        return self.session.on_expiry == Expiry.PAUSE

    @property
    def ended(self) -> bool:
        """Its lifetime is over and it is to be removed: gone for E2B from that moment,
        though the reaper (a round a second, slower under load) may not have removed its
        session yet."""
        return (
            self.session.expires_at is not None
            and self.session.on_expiry == Expiry.REMOVE
            and self.end_at <= time.time()
        )


class TrafficDenied(Exception):
    """A request to a sandbox's port without the traffic token it asks for (403)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Sandboxes:
    """The gateway's sandbox operations (one instance per server)."""

    def __init__(
        self, runtime: Runtime, config: GatewayConfig, tables: GatewayTables | None = None
    ) -> None:
        self.runtime = runtime
        self.config = config
        tables = tables or GatewayTables.beside(runtime.store)
        self.records = tables.sandboxes
        self.templates = TemplateBuilds(runtime, tables.templates, config.memory_mib, config.cpus)

    # -- queries -------------------------------------------------------------------------

    def get(self, sandbox_id: str) -> Sandbox:
        """:raises NotFound: no such E2B sandbox (killed, or never made by the gateway)."""
        record = self.records.get(sandbox_id)
        try:
            session = self.runtime.get(sandbox_id)
        except NotFound:
            self.records.delete(sandbox_id)
            raise NotFound(f"sandbox {sandbox_id} not found") from None
        sandbox = Sandbox(session, record)
        if sandbox.ended:  # its removal is on its way
            raise NotFound(f"sandbox {sandbox_id} not found")
        return sandbox

    def all(self) -> list[Sandbox]:
        out = []
        for record in self.records.list():
            with contextlib.suppress(NotFound):
                sandbox = Sandbox(self.runtime.get(record.session_id), record)
                if not sandbox.ended:
                    out.append(sandbox)
        return out

    async def reach(self, sandbox_id: str, traffic_token: str | None) -> Sandbox:
        """The running sandbox a request to one of its ports is for: one that asks for
        its traffic token must be sent it; a paused one with auto-resume is resumed
        (the request is then answered, no retry).

        :raises NotFound: unknown or paused ("was not found", as E2B's proxy says).
        :raises TrafficDenied: the traffic token is missing or wrong.
        """
        sandbox = await asyncio.to_thread(self.get, sandbox_id)
        expected = sandbox.record.traffic_token
        if expected is not None and not hmac.compare_digest(
            (traffic_token or "").encode(), expected.encode()
        ):
            raise TrafficDenied(
                f"sandbox {sandbox_id} takes requests with its traffic access token only "
                "(header e2b-traffic-access-token)"
            )
        if sandbox.paused:
            # E2B: a sandbox paused without its memory wakes on connect only
            if not sandbox.record.auto_resume or sandbox.session.paused_on_disk:
                raise NotFound(f"The sandbox {sandbox_id} was not found")
            sandbox, _ = await self.connect(sandbox_id, None)
        return sandbox

    def running_or_conflict(self, sandbox_id: str) -> Sandbox:
        sandbox = self.get(sandbox_id)
        if sandbox.paused:
            raise Conflict(f"sandbox {sandbox_id} is paused; connect to it first")
        return sandbox

    # -- create --------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """A new sandbox from a template: an image name (``base``: E2B's base image), or a
        checkpoint (snapshot) id or name.

        :raises NotFound: no image, checkpoint or snapshot of that name.
        """
        name = spec.template or DEFAULT_TEMPLATE
        built = await asyncio.to_thread(self.templates.store.resolve, name)
        if built is None and ":" in name:
            raise NotFound(f"template {name!r} not found (`Template.get_tags` lists its tags)")
        image = built.image_hash if built is not None and built.image_hash else name
        memory_mib = built.memory_mib if built else self.config.memory_mib
        cpus = built.cpus if built else self.config.cpus
        checkpoint = None if built else await asyncio.to_thread(self._checkpoint, name)
        admission = self.runtime.admission
        on_expiry = Expiry.PAUSE if spec.auto_pause else Expiry.REMOVE
        egress, network = spec.egress, Network.USER
        if spec.egress.no_internet and not await asyncio.to_thread(
            lambda: self.runtime.filters_egress  # on a cluster: every node asked
        ):
            network = Network.NONE  # unjailed guests are not filtered: no NIC at all
            egress = Egress()
        if checkpoint is not None and spec.volumes:
            raise InvalidInput("volume mounts need a template: a snapshot keeps its own")
        for volume in spec.volumes.values():  # said as a volume, not as a missing template
            await asyncio.to_thread(self.runtime.volume_record, volume)
        if checkpoint is not None:
            ticket, _ = await admission.fork(checkpoint.id, 1)
            with ticket:
                session = _only(await self.runtime.fork(checkpoint.id, 1))
            session = await self.runtime.set_timeout(
                session.id, self._timeout(spec.timeout_s), on_expiry, spec.pause_memory
            )
            # A fork keeps its source's rules; a sandbox has those it is created with.
            if session.network == Network.USER and session.egress != egress.policy.shown():
                session = await self.runtime.set_egress(
                    session.id, egress.allow, egress.deny, egress.headers
                )
        else:
            try:
                with await admission.create():
                    session = await self.runtime.create(
                        image=image, memory_mib=memory_mib, cpus=cpus,
                        network=network, allow_net=egress.allow, deny_net=egress.deny,
                        inject_headers=egress.headers,
                        timeout_s=self._timeout(spec.timeout_s), on_expiry=on_expiry,
                        volumes=spec.volumes,
                    )  # fmt: skip
                if not spec.pause_memory:
                    session = await self.runtime.set_timeout(
                        session.id, self._timeout(spec.timeout_s), on_expiry, keep_memory=False
                    )
            except NotFound:
                if name == E2B_BASE_IMAGE:
                    raise NotFound(
                        "template 'base' needs E2B's base image: `forkpoint image build base`"
                    ) from None
                raise NotFound(
                    f"template {name!r} not found: not an image, checkpoint or snapshot "
                    "(`forkpoint image ls`, `forkpoint checkpoints`)"
                ) from None
        like = E2bSandboxRecord(
            session_id=session.id, access_token="", template=name, started_at=0,
            metadata=dict(spec.metadata), env_vars=dict(spec.env_vars),
            traffic_token=None if spec.public_traffic else "", auto_resume=spec.auto_resume,
            host_mask=spec.host_mask,
        )  # fmt: skip
        return await asyncio.to_thread(self._adopt, session, like)

    def _checkpoint(self, name: str) -> Checkpoint | None:
        if name in _BASE_TEMPLATES:
            return None
        try:
            return self.runtime.get_checkpoint(name)
        except (NotFound, InvalidInput):
            return None

    def _adopt(self, session: Session, like: E2bSandboxRecord) -> Sandbox:
        """Record ``session`` as a sandbox with ``like``'s options and tokens of its own
        (a traffic token if ``like`` has one)."""
        record = self.records.insert(
            dataclasses.replace(
                like, session_id=session.id, access_token=secrets.token_urlsafe(24),
                started_at=time.time(),
                traffic_token=None if like.traffic_token is None else secrets.token_urlsafe(24),
            )
        )  # fmt: skip
        return Sandbox(session, record)

    async def update_network(self, sandbox_id: str, egress: Egress) -> None:
        """Replace a sandbox's egress rules; a running one is held to them at once.

        :raises Conflict: it has no network at all (unjailed, created without internet).
        """
        await asyncio.to_thread(self.get, sandbox_id)
        headers = egress.headers
        if headers is None:  # E2B: rules left out of an update stay as they are
            headers = await self.runtime.injected_headers(sandbox_id)
        await self.runtime.set_egress(sandbox_id, egress.allow, egress.deny, headers)

    def _timeout(self, timeout_s: int | None) -> int:
        return self.config.default_timeout_s if timeout_s is None else timeout_s

    # -- lifecycle -----------------------------------------------------------------------

    async def connect(self, sandbox_id: str, timeout_s: int | None) -> tuple[Sandbox, bool]:
        """Resume a paused sandbox (same id and ports, processes at the same PIDs) or just
        extend a running one's end time; returns it and whether it was resumed."""
        sandbox = await asyncio.to_thread(self.get, sandbox_id)
        timeout = self._timeout(timeout_s)
        resumed = False
        if sandbox.paused:
            try:
                ticket, _ = await self.runtime.admission.rollback(sandbox_id)
                with ticket:
                    await self.runtime.resume(sandbox_id)
                resumed = True
            except Conflict:  # resumed meanwhile by another connect: extend it as below
                sandbox = await asyncio.to_thread(self.get, sandbox_id)
                if sandbox.paused:
                    raise
        if resumed or sandbox.end_at < time.time() + timeout:
            await self.runtime.set_timeout(sandbox_id, timeout)
        return await asyncio.to_thread(self.get, sandbox_id), resumed

    async def pause(self, sandbox_id: str, keep_memory: bool = True) -> None:
        """Checkpoint and stop the VM (``keep_memory=False``: keep its disk only; the next
        connect boots from it). :raises Conflict: already paused."""
        sandbox = await asyncio.to_thread(self.get, sandbox_id)
        if sandbox.paused:
            raise Conflict(f"sandbox {sandbox_id} is already paused")
        ticket, _ = await self.runtime.admission.checkpoint(sandbox_id)
        with ticket:
            await self.runtime.pause(sandbox_id, keep_memory)

    async def kill(self, sandbox_id: str) -> None:
        """:raises NotFound:"""
        await asyncio.to_thread(self.get, sandbox_id)
        await self.runtime.remove(sandbox_id)  # its row goes with it

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        """A running sandbox's new end time; a paused one has none (E2B: it is kept)."""
        sandbox = await asyncio.to_thread(self.get, sandbox_id)
        if not sandbox.paused:
            await self.runtime.set_timeout(sandbox_id, timeout_s)

    async def fork(
        self, sandbox_id: str, count: int, timeout_s: int | None
    ) -> list[Sandbox | ForkpointError]:
        """``count`` new sandboxes from a checkpoint taken now; processes keep their PIDs."""
        parent = await asyncio.to_thread(self.running_or_conflict, sandbox_id)
        ticket, _ = await self.runtime.admission.checkpoint(sandbox_id)
        with ticket:
            checkpoint = await self.runtime.checkpoint(sandbox_id, kind=CheckpointKind.FORK)
        ticket, _ = await self.runtime.admission.fork(checkpoint.id, count)
        with ticket:
            results = await self.runtime.fork(checkpoint.id, count)
        out: list[Sandbox | ForkpointError] = []
        for result in results:
            if isinstance(result, ForkpointError):
                out.append(result)
                continue
            session = await self.runtime.set_timeout(
                result.id, self._timeout(timeout_s), parent.session.on_expiry,
                parent.session.keep_memory,
            )  # fmt: skip
            out.append(await asyncio.to_thread(self._adopt, session, parent.record))
        return out

    async def snapshot(self, sandbox_id: str, name: str | None) -> Checkpoint:
        await asyncio.to_thread(self.running_or_conflict, sandbox_id)
        ticket, _ = await self.runtime.admission.checkpoint(sandbox_id)
        with ticket:
            return await self.runtime.checkpoint(sandbox_id, name)

    def snapshots(self, sandbox_id: str | None) -> list[Checkpoint]:
        """The user's snapshots (checkpoints), without forkpoint's own."""
        if sandbox_id is not None:
            self.get(sandbox_id)
        return self.runtime.list_checkpoints(sandbox_id, kinds=(CheckpointKind.USER,))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """:raises NotFound: :raises InUse: sessions or checkpoints depend on it."""
        checkpoint = await asyncio.to_thread(self.runtime.get_checkpoint, snapshot_id)
        if checkpoint.kind != CheckpointKind.USER:
            raise NotFound(f"snapshot {snapshot_id} not found")
        await self.runtime.remove_checkpoint(checkpoint.id)

    async def rollback(self, sandbox_id: str, snapshot_id: str) -> Sandbox:
        """forkpoint's extension: reset the sandbox in place (same id, same host); a
        paused one runs again, with the default timeout."""
        sandbox = await asyncio.to_thread(self.get, sandbox_id)
        ticket, _ = await self.runtime.admission.rollback(sandbox_id)
        with ticket:
            await self.runtime.rollback(sandbox_id, snapshot_id)
        if sandbox.paused:
            await self.runtime.set_timeout(sandbox_id, self.config.default_timeout_s)
        return await asyncio.to_thread(self.get, sandbox_id)


def _only(results: list[Session | ForkpointError]) -> Session:
    result = results[0]
    if isinstance(result, ForkpointError):
        raise result
    return result
