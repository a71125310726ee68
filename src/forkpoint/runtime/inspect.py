"""``diff`` and the rollback preview: two states scanned and compared (see ``diffs.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from forkpoint.errors import Conflict, NotFound
from forkpoint.models import StateDiff
from forkpoint.protocol import ScanResult

from .diffs import ScanCache, compare, exclusions, parse_scan, patch_candidates, unified_patch
from .lineage import rollback_target

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["diff_states", "rollback_preview"]

_ROOTS = ["/"]


@dataclass(frozen=True)
class _Ref:
    id: str
    checkpoint: bool


def _resolve(runtime: Runtime, a: str, b: str | None) -> tuple[_Ref, _Ref]:
    """``a`` checkpoint: against its session now (or ``b``). ``a`` session: its rollback
    target (latest own checkpoint, else the one it started from) against it now."""
    store = runtime.store

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


def scratch_forks(runtime: Runtime, a: str, b: str | None) -> int:
    """How many short-lived forks ``diff(a, b)`` may boot: one per checkpoint side.

    :raises NotFound: :raises Conflict: as :func:`diff_states`.
    """
    return sum(side.checkpoint for side in _resolve(runtime, a, b))


class _Side:
    """One state to scan and read files from: a running session, or a fork of a
    checkpoint made on first need and removed at the end."""

    def __init__(self, runtime: Runtime, ref: _Ref, exclude: tuple[str, ...]) -> None:
        self.runtime, self.ref, self.exclude = runtime, ref, exclude
        self._fork: str | None = None
        self._forking = asyncio.Lock()

    async def session(self) -> str:
        if not self.ref.checkpoint:
            return self.ref.id
        async with self._forking:
            if self._fork is None:
                self._fork = (await self.runtime.scratch_fork(self.ref.id)).id
            return self._fork

    async def scan(self) -> ScanResult:
        cache = ScanCache(self.runtime.home.root / "scans")
        if self.ref.checkpoint:
            cached = await asyncio.to_thread(cache.get, self.ref.id, _ROOTS, self.exclude)
            if cached is not None:
                return cached
        else:
            await asyncio.to_thread(self.runtime.require_running, self.ref.id, locked=False)
        async with self.runtime.agent(await self.session()) as agent:
            result = await agent.scan(_ROOTS, list(self.exclude))
        if self.ref.checkpoint:
            await asyncio.to_thread(cache.put, self.ref.id, _ROOTS, self.exclude, result)
        return result

    async def read(self, path: str) -> bytes | None:
        try:
            return await self.runtime.read_file(await self.session(), path)
        except (NotFound, Conflict):
            return None
        except Exception:  # unreadable (permissions, a file turned directory): no patch
            return None

    async def close(self) -> None:
        if self._fork is not None:
            fork, self._fork = self._fork, None
            try:
                with contextlib.suppress(NotFound):
                    await self.runtime.remove(fork)
            finally:
                self.runtime.scratch_sessions.discard(fork)


@contextlib.asynccontextmanager
async def _sides(
    runtime: Runtime, a: _Ref, b: _Ref, exclude: tuple[str, ...]
) -> AsyncIterator[tuple[_Side, _Side]]:
    sides = (_Side(runtime, a, exclude), _Side(runtime, b, exclude))
    try:
        yield sides
    finally:
        await asyncio.gather(*(s.close() for s in sides))


async def diff_states(
    runtime: Runtime,
    a: str,
    b: str | None = None,
    *,
    include_tmp: bool = False,
    exclude: tuple[str, ...] = (),
    patch: bool = False,
) -> StateDiff:
    """What changed from ``a`` to ``b`` (see :func:`_resolve` for the defaults).

    :raises NotFound: no such checkpoint or session; :raises Conflict: a session to scan
        is not running.
    """
    started = time.perf_counter()
    excluded = exclusions(include_tmp, exclude)
    first, second = await asyncio.to_thread(_resolve, runtime, a, b)
    async with _sides(runtime, first, second, excluded) as (old, new):
        scans = await asyncio.gather(old.scan(), new.scan())
        old_scan, new_scan = (parse_scan(s, excluded) for s in scans)
        result = compare(
            old_scan, new_scan, source=first.id, target=second.id, excluded=excluded,
            duration_ms=0.0,
        )  # fmt: skip
        if patch:
            result = await _with_patches(result, old, new)
    return replace(result, duration_ms=round((time.perf_counter() - started) * 1000, 1))


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


async def rollback_preview(
    runtime: Runtime,
    session: str,
    checkpoint: str | None = None,
    *,
    include_tmp: bool = False,
    patch: bool = False,
) -> StateDiff:
    """What ``rollback(session, checkpoint)`` would undo: the diff from the checkpoint it
    would restore to the session now. Changes nothing.

    :raises Conflict: the checkpoint is not in the session's lineage.
    """
    record = await asyncio.to_thread(runtime.store.get_session, session)
    target = await asyncio.to_thread(rollback_target, runtime.store, record, checkpoint)
    return await diff_states(runtime, target.id, record.id, include_tmp=include_tmp, patch=patch)
