"""The E2B control plane (``e2b`` 2.63's REST API) on :class:`Sandboxes`.

Status codes are exactly those the SDK's generated parsers expect (201 for create and
fork, 200/201 for connect, 204 for kill, pause and timeouts). Errors are E2B's
``{"code": <int>, "message": "..."}``.
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime
from typing import Annotated, Literal
from urllib.parse import parse_qsl, unquote

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse

from forkpoint.errors import Conflict, ForkpointError
from forkpoint.models import Metric

from .network import ALL_TRAFFIC, egress_of, host_mask
from .sandboxes import Sandbox, Sandboxes, SandboxSpec
from .wire import (
    ApiError,
    ConnectBody,
    ForkBody,
    ForkResult,
    Lifecycle,
    ListedSandbox,
    NetworkBody,
    NetworkOut,
    NetworkUpdateBody,
    NewSandbox,
    PauseBody,
    RollbackBody,
    SandboxDetail,
    SandboxOut,
    SnapshotBody,
    SnapshotInfo,
    TimeoutBody,
)

__all__ = ["CLIENT_ID", "api_error", "control_router"]

CLIENT_ID = "forkpoint"
_DISK_MB = 4096


def _utc(moment: datetime) -> datetime:
    """A naive time is UTC (as E2B's API reads it)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def _out(sandboxes: Sandboxes, sandbox: Sandbox) -> SandboxOut:
    return SandboxOut(
        templateID=sandbox.record.template, sandboxID=sandbox.id, clientID=CLIENT_ID,
        envdVersion=sandboxes.config.envd_version, alias=sandbox.record.template,
        envdAccessToken=sandbox.record.access_token, domain=sandboxes.config.domain,
        trafficAccessToken=sandbox.record.traffic_token,
    )  # fmt: skip


def _listed(sandboxes: Sandboxes, sandbox: Sandbox) -> ListedSandbox:
    r = sandbox.record
    return ListedSandbox(
        templateID=r.template, sandboxID=sandbox.id, clientID=CLIENT_ID,
        startedAt=_iso(r.started_at), endAt=_iso(sandbox.end_at), cpuCount=sandbox.session.cpus,
        memoryMB=sandbox.session.memory_mib, diskSizeMB=_DISK_MB,
        state="paused" if sandbox.paused else "running",
        envdVersion=sandboxes.config.envd_version, alias=r.template, metadata=r.metadata,
    )  # fmt: skip


def _snapshot(checkpoint_id: str, name: str | None) -> SnapshotInfo:
    return SnapshotInfo(snapshotID=name or checkpoint_id, names=[name] if name else [])


def control_router(sandboxes: Sandboxes) -> APIRouter:
    router = APIRouter()

    @router.post("/v2/sandboxes", status_code=201, response_model=SandboxOut)
    async def create(body: NewSandbox) -> SandboxOut:
        network = body.network or NetworkBody()
        spec = SandboxSpec(
            template=body.templateID, timeout_s=body.timeout, auto_pause=body.autoPause,
            pause_memory=body.autoPauseMemory is not False,
            egress=egress_of(
                network.allowOut, network.denyOut, body.allow_internet_access, network.rules
            ),
            metadata=body.metadata or {}, env_vars=body.envVars or {},
            public_traffic=network.allowPublicTraffic is not False,
            auto_resume=body.autoResume is not None and body.autoResume.enabled,
            host_mask=host_mask(network.maskRequestHost),
            volumes={m.path: m.name for m in body.volumeMounts or ()},
        )  # fmt: skip
        return _out(sandboxes, await sandboxes.create(spec))

    @router.put("/sandboxes/{sandbox_id}/network", status_code=204)
    async def update_network(sandbox_id: str, body: NetworkUpdateBody) -> Response:
        """E2B: the rules are replaced; a field left out is cleared, but header transforms
        (``rules``) are replaced only when given."""
        egress = egress_of(body.allowOut, body.denyOut, body.allow_internet_access, body.rules)
        await sandboxes.update_network(sandbox_id, egress)
        return Response(status_code=204)

    @router.get("/v2/sandboxes", response_model=list[ListedSandbox])
    async def list_sandboxes(
        response: Response,
        state: str | None = None,
        metadata: str | None = None,
        template: str | None = None,
        startedAfter: datetime | None = None,
        order: Literal["asc", "desc"] = "desc",
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        nextToken: str | None = None,
    ) -> list[ListedSandbox]:
        """Newest first unless ``order=asc`` (by start time); pages of ``limit``, the next
        one named by the ``x-next-token`` header."""
        wanted = set(state.split(",")) if state else {"running", "paused"}
        filters = {unquote(k): unquote(v) for k, v in parse_qsl(metadata or "")}
        after = None if startedAfter is None else _utc(startedAfter).timestamp()
        chosen = [
            s for s in await asyncio.to_thread(sandboxes.all)
            if ("paused" if s.paused else "running") in wanted
            and all(s.record.metadata.get(k) == v for k, v in filters.items())
            and (template is None or s.record.template == template)
            # started_at is kept to the millisecond in answers: compare at that precision
            and (after is None or round(s.record.started_at, 3) >= after)
        ]  # fmt: skip
        chosen.sort(key=lambda s: s.record.started_at, reverse=order == "desc")
        start = int(nextToken) if nextToken and nextToken.isdigit() else 0
        page = chosen[start : start + limit]
        if start + limit < len(chosen):
            response.headers["x-next-token"] = str(start + limit)
        return [_listed(sandboxes, s) for s in page]

    @router.get(
        "/sandboxes/{sandbox_id}", response_model=SandboxDetail, response_model_exclude_none=True
    )
    async def info(sandbox_id: str) -> SandboxDetail:
        sandbox = await asyncio.to_thread(sandboxes.get, sandbox_id)
        r, deny = sandbox.record, sandbox.session.egress.get("deny", [])
        return SandboxDetail(
            **_listed(sandboxes, sandbox).model_dump(),
            envdAccessToken=r.access_token, domain=sandboxes.config.domain,
            allowInternetAccess=sandbox.session.network == "user" and ALL_TRAFFIC not in deny,
            lifecycle=Lifecycle(
                autoResume=r.auto_resume, onTimeout="pause" if sandbox.auto_pause else "kill"
            ),
            # how it is paused, or would be at its timeout
            pauseMode="filesystem" if sandbox.session.paused_on_disk
            or not sandbox.session.keep_memory else "full",
            network=NetworkOut(
                allowOut=sandbox.session.egress.get("allow", []), denyOut=deny,
                allowPublicTraffic=r.traffic_token is None, maskRequestHost=r.host_mask,
            ),
        )  # fmt: skip

    @router.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def kill(sandbox_id: str) -> Response:
        await sandboxes.kill(sandbox_id)
        return Response(status_code=204)

    @router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
    async def set_timeout(sandbox_id: str, body: TimeoutBody) -> Response:
        await sandboxes.set_timeout(sandbox_id, body.timeout)
        return Response(status_code=204)

    @router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
    async def pause(sandbox_id: str, body: PauseBody | None = None) -> Response:
        """``{"memory": false}``: filesystem only (the next connect boots from the disk)."""
        await sandboxes.pause(sandbox_id, keep_memory=body is None or body.memory is not False)
        return Response(status_code=204)

    @router.post("/v2/sandboxes/{sandbox_id}/connect", response_model=SandboxOut)
    async def connect(sandbox_id: str, body: ConnectBody | None = None) -> JSONResponse:
        sandbox, resumed = await sandboxes.connect(sandbox_id, body.timeout if body else None)
        return JSONResponse(
            _out(sandboxes, sandbox).model_dump(), status_code=201 if resumed else 200
        )

    @router.post(
        "/sandboxes/{sandbox_id}/fork",
        status_code=201,
        response_model=list[ForkResult],
        response_model_exclude_none=True,
    )
    async def fork(sandbox_id: str, body: ForkBody | None = None) -> list[ForkResult]:
        body = body or ForkBody()
        results = await sandboxes.fork(sandbox_id, body.count, body.timeout)
        return [
            ForkResult(error=ApiError(code=r.http_status, message=r.message))
            if isinstance(r, ForkpointError)
            else ForkResult(sandbox=_out(sandboxes, r))
            for r in results
        ]

    @router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201, response_model=SnapshotInfo)
    async def create_snapshot(sandbox_id: str, body: SnapshotBody | None = None) -> SnapshotInfo:
        body = body or SnapshotBody()
        if body.memory is False:
            raise Conflict("filesystem-only snapshots are not supported by forkpoint")
        checkpoint = await sandboxes.snapshot(sandbox_id, body.name)
        return _snapshot(checkpoint.id, checkpoint.name)

    @router.get("/snapshots", response_model=list[SnapshotInfo])
    async def list_snapshots(
        response: Response,
        sandboxID: str | None = None,
        name: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        nextToken: str | None = None,
    ) -> list[SnapshotInfo]:
        found = [
            _snapshot(c.id, c.name)
            for c in await asyncio.to_thread(sandboxes.snapshots, sandboxID)
            if name is None or c.name == name
        ]
        start = int(nextToken) if nextToken and nextToken.isdigit() else 0
        if start + limit < len(found):
            response.headers["x-next-token"] = str(start + limit)
        return found[start : start + limit]

    @router.delete("/templates/{snapshot_id}", status_code=204)
    async def delete_snapshot(snapshot_id: str) -> Response:
        """A template built from code, else a snapshot (E2B lists both as templates)."""
        if await asyncio.to_thread(sandboxes.templates.store.template_id, snapshot_id):
            await sandboxes.templates.delete(snapshot_id)
        else:
            await sandboxes.delete_snapshot(snapshot_id)
        return Response(status_code=204)

    @router.get("/sandboxes/{sandbox_id}/metrics")
    async def metrics(
        sandbox_id: str,
        start: Annotated[int | None, Query(ge=0, le=_LAST_UNIX_SECOND)] = None,
        end: Annotated[int | None, Query(ge=0, le=_LAST_UNIX_SECOND)] = None,
    ) -> list[dict[str, object]]:
        """The session's samples (``Runtime.metrics``); ``start``/``end`` in Unix seconds,
        ``end`` taken as its whole second."""
        sandbox = await asyncio.to_thread(sandboxes.get, sandbox_id)
        samples = await sandboxes.runtime.metrics(
            sandbox.id,
            None if start is None else datetime.fromtimestamp(start, UTC),
            None if end is None else datetime.fromtimestamp(end + 0.999, UTC),
        )
        return [_metric(m) for m in samples]

    @router.post("/sandboxes/{sandbox_id}/rollback", response_model=SandboxOut)
    async def rollback(sandbox_id: str, body: RollbackBody) -> SandboxOut:
        """forkpoint's extension: roll the sandbox back to a snapshot in place."""
        return _out(sandboxes, await sandboxes.rollback(sandbox_id, body.snapshotID))

    return router


_LAST_UNIX_SECOND = 253_402_300_798  # 9999-12-31: later cannot be a datetime


def _error(status: int, message: str, error_code: str | None = None) -> JSONResponse:
    body = ApiError(code=status, message=message, error_code=error_code)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status,
                        headers={"Should-Retry": "false"})  # fmt: skip


def api_error(error: ForkpointError) -> JSONResponse:
    response = _error(error.http_status, error.message)
    if error.http_status == 429:  # the runtime's admission: when to try again
        response.headers["retry-after"] = str(math.ceil(error.retry_after_s or 1))
    return response


def _metric(sample: Metric) -> dict[str, object]:
    """A sample as E2B's ``SandboxMetric``."""
    moment = datetime.fromisoformat(sample.at.replace("Z", "+00:00"))
    return {
        "timestamp": sample.at, "timestampUnix": int(moment.timestamp()),
        "cpuCount": sample.cpu_count, "cpuUsedPct": sample.cpu_used_pct,
        "memUsed": sample.mem_used, "memTotal": sample.mem_total, "memCache": sample.mem_cache,
        "diskUsed": sample.disk_used, "diskTotal": sample.disk_total,
    }  # fmt: skip
