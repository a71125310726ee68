"""Sessions' metrics: every running session sampled every :data:`INTERVAL_S` seconds by
the reaper of a long-lived door (``housekeeping/reaper.py``), kept an hour in the store.

CPU is read on the host — the VM's QEMU, all its threads (``/proc/<pid>/stat``) — so
measuring it costs the guest nothing. Memory and disk come from the guest's agent
(``stats``), and only from a guest that used CPU since the last sample: an idle guest is
not woken to be measured (a hundred idle forks stay idle) and keeps its last figures.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from forkpoint.errors import ForkpointError
from forkpoint.models import Metric, SessionState
from forkpoint.protocol import GuestStats
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.guest.link import GuestLink
from forkpoint.store import SessionRecord, utc_now
from forkpoint.store.metrics import MetricsStore
from forkpoint.vm.process import stat_fields

__all__ = ["INTERVAL_S", "Metrics"]

#: How often a running session is sampled (s); E2B buckets its metrics by 5 s too.
INTERVAL_S = 5.0
#: Below this share of its vCPUs since the last sample, a guest counts as idle.
_IDLE_PCT = 1.0
#: A guest that does not answer ``stats`` this fast keeps its last figures.
_STATS_TIMEOUT_S = 2.0
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_MIB = 1024 * 1024


@dataclass(frozen=True)
class _CpuReading:
    pid: int
    at: float  # seconds since the host booted
    used_s: float  # CPU time QEMU used since it started
    started: float  # when QEMU started, in seconds since the host booted


class Metrics:
    """Samples running sessions and answers for their history."""

    def __init__(self, context: RuntimeContext, link: GuestLink) -> None:
        self.context = context
        self.link = link
        self.rows = MetricsStore(context.store)
        self._cpu: dict[str, _CpuReading] = {}
        self._guest: dict[str, GuestStats] = {}

    async def sample(self) -> int:
        """Take one sample of every running session; returns how many were recorded."""
        records = await asyncio.to_thread(self.context.store.list_sessions)
        running = [r for r in records if r.state == SessionState.RUNNING and r.qemu_pid]
        samples = await asyncio.gather(*(self._sample(r) for r in running))
        taken = [(r.id, m) for r, m in zip(running, samples, strict=True) if m is not None]
        await asyncio.to_thread(self.rows.add, taken)
        alive = {r.id for r in running}
        for gone in (self._cpu.keys() | self._guest.keys()) - alive:
            self._cpu.pop(gone, None)
            self._guest.pop(gone, None)
        return len(taken)

    async def metrics(
        self, session: str, start: datetime | None = None, end: datetime | None = None
    ) -> list[Metric]:
        """The samples of ``session`` (id or name) taken from ``start`` to ``end`` (None:
        unbounded; ``start`` after ``end``: none), oldest first; kept an hour, gone with
        the session.

        :raises NotFound: unknown session.
        """
        record = await asyncio.to_thread(self.context.store.get_session, session)
        return await asyncio.to_thread(self.rows.between, record.id, _stamp(start), _stamp(end))

    async def _sample(self, record: SessionRecord) -> Metric | None:
        assert record.qemu_pid is not None
        now = _cpu_reading(record.qemu_pid)
        if now is None:
            return None  # its QEMU is gone: the session is ending
        before = self._cpu.get(record.id)
        if before is None or before.pid != now.pid:  # first look at this VM: since its start
            before = _CpuReading(now.pid, now.started, 0.0, now.started)
        self._cpu[record.id] = now
        elapsed = max(now.at - before.at, 1e-3)
        pct = min(100.0, max(0.0, 100 * (now.used_s - before.used_s) / elapsed / record.cpus))
        guest = self._guest.get(record.id)
        if guest is None or pct >= _IDLE_PCT:
            guest = await self._guest_stats(record.id) or guest
        if guest is not None:
            self._guest[record.id] = guest
        else:  # never answered (an agent without stats): its RAM size, nothing used
            ram = record.memory_mib * _MIB
            guest = GuestStats(ram, ram, 0, 0, 0)
        return Metric(
            at=utc_now(), cpu_count=record.cpus, cpu_used_pct=round(pct, 2),
            mem_used=guest.mem_total - guest.mem_available, mem_total=guest.mem_total,
            mem_cache=guest.mem_cached, disk_used=guest.disk_used, disk_total=guest.disk_total,
        )  # fmt: skip

    async def _guest_stats(self, session_id: str) -> GuestStats | None:
        async def ask() -> GuestStats:
            async with self.link.agent(session_id) as agent:
                return await agent.stats()

        try:
            return await asyncio.wait_for(ask(), _STATS_TIMEOUT_S)
        except (ForkpointError, TimeoutError):  # busy elsewhere, or an agent without stats
            return None


def _stamp(moment: datetime | None) -> str | None:
    """``moment`` in the store's timestamp format (a naive one is taken as UTC)."""
    if moment is None:
        return None
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cpu_reading(pid: int) -> _CpuReading | None:
    """Process ``pid``'s CPU time and start (``/proc/<pid>/stat``), None if it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    used = (int(fields[11]) + int(fields[12])) * _TICK_S  # utime + stime
    started = int(fields[19]) * _TICK_S  # starttime
    return _CpuReading(pid, time.clock_gettime(time.CLOCK_BOOTTIME), used, started)
