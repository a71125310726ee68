"""E2B sandbox lifecycle on forkpoint sessions: create, connect (resume), pause, fork,
snapshots, timeouts, kill — and forkpoint's rollback extension.

A sandbox *is* a session (same id); its E2B-only state lives in the store's
``e2b_sandboxes`` table. Mapping: create = ``create(image)`` or ``fork(checkpoint)``;
pause = ``checkpoint`` + ``stop``; resume = ``rollback`` to the pause checkpoint (same id,
same host ports, processes at the same PIDs); fork = ``checkpoint`` + ``fork``; snapshot =
a named checkpoint; kill = ``remove``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass

from forkpoint.config import ApiLimits
from forkpoint.errors import Conflict, ForkpointError, InvalidInput, NotFound
from forkpoint.models import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    Checkpoint,
    Network,
    Session,
    SessionState,
)
from forkpoint.runtime import Runtime
from forkpoint.store.e2b import E2bSandboxRecord, E2bStore

__all__ = ["DEFAULT_TEMPLATE", "GatewayConfig", "Sandbox", "Sandboxes"]

DEFAULT_TEMPLATE = "base"
_BASE_TEMPLATES = frozenset({DEFAULT_TEMPLATE, "default"})


@dataclass(frozen=True)
class GatewayConfig:
    """``domain`` is what ``get_host`` appends (``localhost:<proxy port>``);
    ``default_timeout_s`` E2B's 300 s unless configured."""

    domain: str = "localhost:3001"
    default_timeout_s: int = 300
    envd_version: str = "0.5.7"
    memory_mib: int = DEFAULT_MEMORY_MIB
    cpus: int = DEFAULT_CPUS
    #: What the gateway admits (the runtime's policy); None: ``ApiLimits.from_env()``.
    limits: ApiLimits | None = None


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


class Sandboxes:
    """The gateway's sandbox operations (one instance per server)."""

    def __init__(self, runtime: Runtime, config: GatewayConfig) -> None:
        self.runtime = runtime
        self.config = config
        self.records = E2bStore(runtime.store)
        # One lifecycle operation per sandbox at a time (pause vs. reaper vs. connect).
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    # -- queries -------------------------------------------------------------------------

    def get(self, sandbox_id: str) -> Sandbox:
        """:raises NotFound: no such E2B sandbox (killed, or never made by the gateway)."""
        record = self.records.get(sandbox_id)
        try:
            session = self.runtime.get(sandbox_id)
        except NotFound:
            self.records.delete(sandbox_id)
            raise NotFound(f"sandbox {sandbox_id} not found") from None
        return Sandbox(session, record)

    def all(self) -> list[Sandbox]:
        out = []
        for record in self.records.list():
            with contextlib.suppress(NotFound):
                out.append(Sandbox(self.runtime.get(record.session_id), record))
        return out

    def running(self, sandbox_id: str) -> Sandbox:
        """:raises NotFound: unknown, paused or stopped (envd says "was not found")."""
        sandbox = self.get(sandbox_id)
        if sandbox.paused:
            raise NotFound(f"The sandbox {sandbox_id} was not found")
        return sandbox

    # -- create --------------------------------------------------------------------------

    async def create(
        self,
        template: str | None,
        *,
        timeout_s: int | None = None,
        metadata: dict[str, str] | None = None,
        env_vars: dict[str, str] | None = None,
        auto_pause: bool = False,
        internet: bool | None = None,
    ) -> Sandbox:
        """A new sandbox from a template: ``base`` (the default image), an image name, or a
        checkpoint (snapshot) id or name.

        :raises NotFound: no image, checkpoint or snapshot of that name.
        """
        name = template or DEFAULT_TEMPLATE
        checkpoint = await asyncio.to_thread(self._checkpoint, name)
        admission = self.runtime.admission
        if checkpoint is not None:
            ticket, _ = await admission.fork(checkpoint.id, 1)
            with ticket:
                session = _only(await self.runtime.fork(checkpoint.id, 1))
        else:
            image = "default" if name in _BASE_TEMPLATES else name
            try:
                with await admission.create():
                    session = await self.runtime.create(
                        image=image, memory_mib=self.config.memory_mib, cpus=self.config.cpus,
                        network=Network.NONE if internet is False else Network.USER,
                    )  # fmt: skip
            except NotFound:
                raise NotFound(
                    f"template {name!r} not found: not an image, checkpoint or snapshot "
                    "(`forkpoint image ls`, `forkpoint checkpoints`)"
                ) from None
        return await asyncio.to_thread(
            self._adopt, session, name, timeout_s, metadata, env_vars, auto_pause
        )

    def _checkpoint(self, name: str) -> Checkpoint | None:
        if name in _BASE_TEMPLATES:
            return None
        try:
            return self.runtime.get_checkpoint(name)
        except NotFound:
            return None
        except InvalidInput:
            return None

    def _adopt(
        self,
        session: Session,
        template: str,
        timeout_s: int | None,
        metadata: dict[str, str] | None,
        env_vars: dict[str, str] | None,
        auto_pause: bool,
    ) -> Sandbox:
        now = time.time()
        record = self.records.insert(
            E2bSandboxRecord(
                session_id=session.id, access_token=secrets.token_urlsafe(24),
                template=template, started_at=now, end_at=now + self._timeout(timeout_s),
                metadata=dict(metadata or {}), env_vars=dict(env_vars or {}),
                auto_pause=auto_pause,
            )
        )  # fmt: skip
        return Sandbox(session, record)

    def _timeout(self, timeout_s: int | None) -> int:
        return self.config.default_timeout_s if timeout_s is None else timeout_s

    # -- lifecycle -----------------------------------------------------------------------

    async def connect(self, sandbox_id: str, timeout_s: int | None) -> tuple[Sandbox, bool]:
        """Resume a paused sandbox (same id and ports, processes at the same PIDs) or just
        extend a running one's end time; returns it and whether it was resumed."""
        async with self.lock(sandbox_id):
            sandbox = await asyncio.to_thread(self.get, sandbox_id)
            end = time.time() + self._timeout(timeout_s)
            if not sandbox.paused:
                record = sandbox.record
                if end > record.end_at:
                    record = await asyncio.to_thread(self.records.update, record, end_at=end)
                return Sandbox(sandbox.session, record), False
            ticket, _ = await self.runtime.admission.rollback(sandbox_id)
            with ticket:
                session = await self.runtime.rollback(sandbox_id, sandbox.record.paused_at)
            record = await asyncio.to_thread(
                self.records.update, sandbox.record, end_at=end, paused_at=None
            )
            return Sandbox(session, record), True

    async def pause(self, sandbox_id: str) -> None:
        """Checkpoint and stop the VM. :raises Conflict: already paused."""
        async with self.lock(sandbox_id):
            sandbox = await asyncio.to_thread(self.get, sandbox_id)
            if sandbox.paused:
                raise Conflict(f"sandbox {sandbox_id} is already paused")
            ticket, _ = await self.runtime.admission.checkpoint(sandbox_id)
            with ticket:
                checkpoint = await self.runtime.checkpoint(sandbox_id)
            await asyncio.to_thread(
                self.records.add_internal_checkpoint, checkpoint.id, sandbox_id, "pause"
            )
            await self.runtime.stop(sandbox_id)
            await asyncio.to_thread(self.records.update, sandbox.record, paused_at=checkpoint.id)

    async def kill(self, sandbox_id: str) -> None:
        """:raises NotFound:"""
        async with self.lock(sandbox_id):
            await asyncio.to_thread(self.get, sandbox_id)
            await self.runtime.remove(sandbox_id)
            await asyncio.to_thread(self.records.delete, sandbox_id)
        self._locks.pop(sandbox_id, None)
        await self.collect_internal_checkpoints()

    async def collect_internal_checkpoints(self) -> None:
        """Delete the gateway's pause/fork checkpoints nothing depends on any more."""
        for checkpoint_id in await asyncio.to_thread(self._unused_internal_checkpoints):
            try:
                await self.runtime.remove_checkpoint(checkpoint_id)
            except Conflict:
                continue  # a fork or a resumed session still maps it
            await asyncio.to_thread(self.records.forget_internal_checkpoint, checkpoint_id)

    def _unused_internal_checkpoints(self) -> list[str]:
        """The gateway's checkpoints whose sandbox is gone (forgotten at once if the
        checkpoint is gone too)."""
        live = {r.session_id for r in self.records.list()}
        unused = []
        for checkpoint_id in self.records.internal_checkpoints():
            try:
                owner = self.runtime.get_checkpoint(checkpoint_id).session_id
            except NotFound:
                self.records.forget_internal_checkpoint(checkpoint_id)
                continue
            if owner not in live:
                unused.append(checkpoint_id)
        return unused

    def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        sandbox = self.get(sandbox_id)
        self.records.update(sandbox.record, end_at=time.time() + timeout_s)

    async def fork(
        self, sandbox_id: str, count: int, timeout_s: int | None
    ) -> list[Sandbox | ForkpointError]:
        """``count`` new sandboxes from a checkpoint taken now; processes keep their PIDs."""
        async with self.lock(sandbox_id):
            parent = await asyncio.to_thread(self.running_or_conflict, sandbox_id)
            ticket, _ = await self.runtime.admission.checkpoint(sandbox_id)
            with ticket:
                checkpoint = await self.runtime.checkpoint(sandbox_id)
        await asyncio.to_thread(
            self.records.add_internal_checkpoint, checkpoint.id, sandbox_id, "fork"
        )
        ticket, _ = await self.runtime.admission.fork(checkpoint.id, count)
        with ticket:
            results = await self.runtime.fork(checkpoint.id, count)
        rec = parent.record

        def adopt_all() -> list[Sandbox | ForkpointError]:
            return [
                r
                if isinstance(r, ForkpointError)
                else self._adopt(
                    r, rec.template, timeout_s, rec.metadata, rec.env_vars, rec.auto_pause
                )
                for r in results
            ]

        return await asyncio.to_thread(adopt_all)

    def running_or_conflict(self, sandbox_id: str) -> Sandbox:
        sandbox = self.get(sandbox_id)
        if sandbox.paused:
            raise Conflict(f"sandbox {sandbox_id} is paused; connect to it first")
        return sandbox

    async def snapshot(self, sandbox_id: str, name: str | None) -> Checkpoint:
        async with self.lock(sandbox_id):
            await asyncio.to_thread(self.running_or_conflict, sandbox_id)
            ticket, _ = await self.runtime.admission.checkpoint(sandbox_id)
            with ticket:
                return await self.runtime.checkpoint(sandbox_id, name)

    def snapshots(self, sandbox_id: str | None) -> list[Checkpoint]:
        """The user's snapshots (checkpoints), without the gateway's own."""
        if sandbox_id is not None:
            self.get(sandbox_id)
        hidden = self.records.internal_checkpoints()
        return [c for c in self.runtime.list_checkpoints(sandbox_id) if c.id not in hidden]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """:raises NotFound: :raises InUse: sessions or checkpoints depend on it."""
        checkpoint = await asyncio.to_thread(self.runtime.get_checkpoint, snapshot_id)
        if checkpoint.id in await asyncio.to_thread(self.records.internal_checkpoints):
            raise NotFound(f"snapshot {snapshot_id} not found")
        await self.runtime.remove_checkpoint(checkpoint.id)

    async def rollback(self, sandbox_id: str, snapshot_id: str) -> Sandbox:
        """forkpoint's extension: reset the sandbox in place (same id, same host)."""
        async with self.lock(sandbox_id):
            sandbox = await asyncio.to_thread(self.get, sandbox_id)
            ticket, _ = await self.runtime.admission.rollback(sandbox_id)
            with ticket:
                session = await self.runtime.rollback(sandbox_id, snapshot_id)
            record = sandbox.record
            if record.paused_at is not None:
                record = await asyncio.to_thread(
                    self.records.update, record, paused_at=None,
                    end_at=time.time() + self.config.default_timeout_s,
                )  # fmt: skip
            return Sandbox(session, record)

    # -- timeouts ------------------------------------------------------------------------

    async def expire(self, now: float | None = None) -> list[str]:
        """Kill (or pause, with auto-pause) running sandboxes past their end time."""
        now = time.time() if now is None else now
        done = []
        for sandbox in await asyncio.to_thread(self.all):
            if sandbox.paused or sandbox.record.end_at > now:
                continue
            try:
                if sandbox.record.auto_pause:
                    await self.pause(sandbox.id)
                else:
                    await self.kill(sandbox.id)
            except ForkpointError:
                continue  # gone meanwhile, or failing: the next round retries
            done.append(sandbox.id)
        return done


def _only(results: list[Session | ForkpointError]) -> Session:
    result = results[0]
    if isinstance(result, ForkpointError):
        raise result
    return result
