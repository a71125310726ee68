"""``diff`` and the rollback preview: two states scanned and compared (see ``diffs.py``);
a checkpoint is looked at through a short-lived fork of it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from forkpoint.errors import Conflict, NotFound
from forkpoint.models import StateDiff
from forkpoint.protocol import ScanResult
from forkpoint.runtime.checkpoints.lineage import rollback_target
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.guest.link import GuestLink
from forkpoint.runtime.inspection.diffs import (
    ScanCache,
    compare,
    exclusions,
    parse_scan,
    patch_candidates,
    unified_patch,
)
from forkpoint.runtime.restore.service import Restore
from forkpoint.runtime.sessions.service import Sessions
from forkpoint.store import Store

__all__ = ["Inspection"]

_ROOTS = ["/"]


@dataclass(frozen=True)
class _Ref:
    id: str
    checkpoint: bool


def _resolve(store: Store, a: str, b: str | None) -> tuple[_Ref, _Ref]:
    """``a`` checkpoint: against its session now (or ``b``). ``a`` session: its rollback
    target (latest own checkpoint, else the one it started from) against it now."""

    def ref(name: str) -> _Ref:
        try:
            return _Ref(store.get_checkpoint(name).id, True)
        except NotFound:
            pass
        try:
            return _Ref(store.get_session(name).id, False)
        except NotFound:
            raise NotFound(f"no checkpoint or session {name!r}") from None

    first = ref(a)
    if b is not None:
        return first, ref(b)
    if first.checkpoint:
        owner = store.get_checkpoint(first.id).session_id
        try:
            return first, _Ref(store.get_session(owner).id, False)
        except NotFound:
            raise Conflict(
                f"the session of checkpoint {first.id} is gone: name what to compare it with"
            ) from None
    target = rollback_target(store, store.get_session(first.id), None)
    return _Ref(target.id, True), first


class _Side:
    """One state to scan and read files from: a running session, or a fork of a
    checkpoint made on first need and removed at the end."""

    def __init__(self, inspection: Inspection, ref: _Ref, exclude: tuple[str, ...]) -> None:
        self.inspection, self.ref, self.exclude = inspection, ref, exclude
        self._fork: str | None = None
        self._forking = asyncio.Lock()

    async def session(self) -> str:
        if not self.ref.checkpoint:
            return self.ref.id
        async with self._forking:
            if self._fork is None:
                self._fork = (await self.inspection.restore.scratch_fork(self.ref.id)).id
            return self._fork

    async def scan(self) -> ScanResult:
        cache = ScanCache(self.inspection.context.home.root / "scans")
        if self.ref.checkpoint:
            cached = await asyncio.to_thread(cache.get, self.ref.id, _ROOTS, self.exclude)
            if cached is not None:
                return cached
        else:
            queries = self.inspection.context.queries
            await asyncio.to_thread(queries.require_running, self.ref.id, locked=False)
        async with self.inspection.link.agent(await self.session()) as agent:
            result = await agent.scan(_ROOTS, list(self.exclude))
        if self.ref.checkpoint:
            await asyncio.to_thread(cache.put, self.ref.id, _ROOTS, self.exclude, result)
        return result

    async def read(self, path: str) -> bytes | None:
        try:
            async with self.inspection.link.agent(await self.session()) as agent:
                return await agent.read_file(path)
        except (NotFound, Conflict):
            return None
        except Exception:  # unreadable (permissions, a file turned directory): no patch
            return None

    async def close(self) -> None:
        if self._fork is not None:
            fork, self._fork = self._fork, None
            try:
                with contextlib.suppress(NotFound):
                    await self.inspection.sessions.remove(fork)
            finally:
                self.inspection.context.scratch_sessions.discard(fork)


@contextlib.asynccontextmanager
async def _sides(
    inspection: Inspection, a: _Ref, b: _Ref, exclude: tuple[str, ...]
) -> AsyncIterator[tuple[_Side, _Side]]:
    sides = (_Side(inspection, a, exclude), _Side(inspection, b, exclude))
    try:
        yield sides
    finally:
        await asyncio.gather(*(s.close() for s in sides))


async def _with_patches(result: StateDiff, old: _Side, new: _Side) -> StateDiff:
    wanted = {c.path for c in patch_candidates(result)}

    async def one(change_path: str, change: str) -> str | None:
        before = None if change == "added" else await old.read(change_path)
        after = None if change == "removed" else await new.read(change_path)
        return unified_patch(change_path, before, after)

    patched = []
    for change in result.files:
        if change.path in wanted:
            change = replace(change, patch=await one(change.path, change.change))
        patched.append(change)
    return replace(result, files=tuple(patched))


class Inspection:
    def __init__(
        self, context: RuntimeContext, restore: Restore, sessions: Sessions, link: GuestLink
    ) -> None:
        self.context = context
        self.restore = restore
        self.sessions = sessions
        self.link = link

    async def diff(
        self,
        a: str,
        b: str | None = None,
        *,
        include_tmp: bool = False,
        exclude: Sequence[str] = (),
        patch: bool = False,
    ) -> StateDiff:
        """Files added/removed/modified, processes started/gone and listening ports
        opened/closed from ``a`` to ``b`` (checkpoints or sessions). ``a`` a checkpoint and
        no ``b``: against its session now; ``a`` a session: from the checkpoint ``rollback``
        would restore. ``patch``: unified diffs of small text files. A checkpoint is looked
        at through a short-lived fork (its scan is kept: checkpoints never change).

        :raises NotFound: :raises Conflict: a session to compare is not running.
        """
        started = time.perf_counter()
        excluded = exclusions(include_tmp, tuple(exclude))
        first, second = await asyncio.to_thread(_resolve, self.context.store, a, b)
        async with _sides(self, first, second, excluded) as (old, new):
            scans = await asyncio.gather(old.scan(), new.scan())
            old_scan, new_scan = (parse_scan(s, excluded) for s in scans)
            result = compare(
                old_scan, new_scan, source=first.id, target=second.id, excluded=excluded,
                duration_ms=0.0,
            )  # fmt: skip
            if patch:
                result = await _with_patches(result, old, new)
        return replace(result, duration_ms=round((time.perf_counter() - started) * 1000, 1))

    def diff_forks(self, a: str, b: str | None = None) -> int:
        """How many short-lived forks :meth:`diff` of ``a`` and ``b`` may start: one per
        checkpoint side (0–2). :raises NotFound: :raises Conflict: as :meth:`diff`."""
        return sum(side.checkpoint for side in _resolve(self.context.store, a, b))

    async def rollback_preview(
        self, session: str, checkpoint: str | None = None, *, patch: bool = False
    ) -> StateDiff:
        """What ``rollback(session, checkpoint)`` would undo: the diff from the checkpoint
        it would restore to the session now. Changes nothing.

        :raises Conflict: the checkpoint is not in the session's lineage.
        """
        store = self.context.store
        record = await asyncio.to_thread(store.get_session, session)
        target = await asyncio.to_thread(rollback_target, store, record, checkpoint)
        return await self.diff(target.id, record.id, patch=patch)
