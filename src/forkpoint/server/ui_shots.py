"""The page's screenshots of sessions' web ports, side by side.

A shot is taken on demand (chromium, headless, as ``forkpoint screenshot``) and kept in
this server's memory by (session, port) — the newest only, the least recently taken
dropped beyond :data:`KEPT`. A grid answers from what is kept: the sessions of a
checkpoint (the one that took it, then its forks) or any list of sessions, each with the
share of pixels its shot differs in from the parent's, and an overlay of where (the
demo's diff image). Comparisons are cached by the two shots' numbers.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forkpoint.browser import diff_pngs, screenshot_async
from forkpoint.errors import InvalidInput, NotFound
from forkpoint.models import Checkpoint, Session
from forkpoint.runtime import Runtime
from forkpoint.runtime.guest.loopback import guest_port_on_loopback

__all__ = ["KEPT", "Shelf", "Shot", "grid_sessions"]

KEPT = 64  # shots; a 1024×640 PNG is ≈ 50–300 KiB
WIDTH, HEIGHT = 1024, 640
_SHOT_TIMEOUT_S = 30
_SHOTS_AT_ONCE = 2  # chromium instances: each takes a core for a second or two


@dataclass(frozen=True)
class Shot:
    number: int  # increases with every shot this server takes
    png: bytes
    taken_at: float  # time.time()


@dataclass(frozen=True)
class _Comparison:
    fraction: float
    overlay: bytes


class Shelf:
    """The shots this server took, and their comparisons."""

    def __init__(self) -> None:
        self._shots: collections.OrderedDict[tuple[str, int], Shot] = collections.OrderedDict()
        self._compared: collections.OrderedDict[tuple[int, int], _Comparison] = (
            collections.OrderedDict()
        )
        self._numbers = itertools.count(1)
        self._taking = asyncio.Semaphore(_SHOTS_AT_ONCE)

    def get(self, session: str, port: int) -> Shot | None:
        return self._shots.get((session, port))

    async def take(self, runtime: Runtime, session: str, port: int, path: str = "/") -> Shot:
        """Screenshot ``path`` on the session's forwarded guest ``port`` now (a cluster's
        session: on its guest port, tunnelled here through its node while the shot is
        taken). :raises NotFound: no such session, or it forwards no such port."""
        if not path.startswith("/"):
            raise InvalidInput(f"a page path starts with /: {path!r}")
        info = await asyncio.to_thread(runtime.get, session)
        if info.node is not None:  # its forwards are on its node's loopback, not here
            async with guest_port_on_loopback(runtime, info.id, port) as local:
                png = await self._shoot(f"http://127.0.0.1:{local}{path}")
        else:
            forward = info.port(port)
            if forward is None:
                raise NotFound(f"session {info.id} forwards no guest port {port}")
            png = await self._shoot(forward.url.rstrip("/") + path)
        shot = Shot(next(self._numbers), png, time.time())
        self._shots[(info.id, port)] = shot
        self._shots.move_to_end((info.id, port))
        while len(self._shots) > KEPT:
            self._shots.popitem(last=False)
        return shot

    async def _shoot(self, url: str) -> bytes:
        async with self._taking:
            with tempfile.TemporaryDirectory() as scratch:
                out = Path(scratch) / "shot.png"
                await screenshot_async(
                    url, out, width=WIDTH, height=HEIGHT, timeout_s=_SHOT_TIMEOUT_S
                )
                return await asyncio.to_thread(out.read_bytes)

    def compare(self, shot: Shot, parent: Shot) -> _Comparison:
        """The share of pixels ``shot`` differs in from ``parent``, and the overlay (the
        parent faded, differing pixels red, regions boxed). Blocking: call in a thread."""
        key = (shot.number, parent.number)
        if key not in self._compared:
            result, overlay = diff_pngs(parent.png, shot.png)
            self._compared[key] = _Comparison(result.fraction, overlay)
            while len(self._compared) > KEPT:
                self._compared.popitem(last=False)
        return self._compared[key]

    def grid(self, sessions: list[Session], parent: str | None, port: int) -> list[dict[str, Any]]:
        """A cell per session: what it is, its shot (number, when), and the share of
        pixels it differs in from the parent's shot. Blocking (the comparisons)."""
        parent_shot = self.get(parent, port) if parent else None
        cells = []
        for session in sessions:
            shot = self.get(session.id, port)
            fraction = None
            if shot and parent_shot and session.id != parent:
                fraction = self.compare(shot, parent_shot).fraction
            cells.append(
                {
                    "session": session.id, "name": session.name, "state": session.state,
                    "forwards": session.port(port) is not None,
                    "shot": shot.number if shot else None,
                    "taken_at": shot.taken_at if shot else None,
                    "differs": fraction,
                }
            )  # fmt: skip
        return cells


def origin(session: Session, checkpoints: dict[str, Checkpoint]) -> str | None:
    """The checkpoint a session came from: the first of its lineage it did not take itself
    (after a rollback it runs from one of its own). The page hangs the session under it;
    the grid of that checkpoint shows it."""
    current, seen = session.parent_checkpoint, set()
    while (
        current in checkpoints
        and checkpoints[current].session_id == session.id
        and current not in seen
    ):
        seen.add(current)
        current = checkpoints[current].parent_checkpoint
    return current


def grid_sessions(
    checkpoint: Checkpoint, sessions: list[Session], checkpoints: list[Checkpoint]
) -> tuple[str | None, list[Session]]:
    """The parent (the session that took ``checkpoint``, if it is still there) and the
    sessions to show: the parent, then every session started from ``checkpoint`` — by a
    fork, or rolled back since to a checkpoint of its own taken after that fork."""
    owner = {c.id: c for c in checkpoints}
    by_id = {s.id: s for s in sessions}
    parent = checkpoint.session_id if checkpoint.session_id in by_id else None
    forks = [s for s in sessions if s.id != parent and origin(s, owner) == checkpoint.id]
    return parent, ([by_id[parent]] if parent else []) + forks
