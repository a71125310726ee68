"""E2B's volumes on forkpoint's: the control plane's ``/volumes`` (``X-API-KEY``) and the
volume content API ``/volumecontent/{volumeID}/file|dir|path`` (``Authorization: Bearer
<the volume's token>``), both served by the gateway. The SDK reaches the content API at
``https://api.<domain>``: the sandbox-port listener passes ``api.localhost`` on to the
API. A volume's id is forkpoint's (``v-…``); its files are forkpoint's volume's."""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import BaseModel, Field

from forkpoint.errors import InvalidInput, NotFound
from forkpoint.models import MAX_VOLUME_FILE_BYTES, Volume, VolumeEntry
from forkpoint.requests import MAX_OWNER_ID
from forkpoint.runtime import Runtime

__all__ = ["volume_content_router", "volume_router"]

_Owner = Annotated[int | None, Query(ge=0, le=MAX_OWNER_ID)]
_Mode = Annotated[int | None, Query(ge=0, le=0o7777)]


class _NewVolume(BaseModel):
    name: str


class _Metadata(BaseModel):
    uid: Annotated[int, Field(ge=0, le=MAX_OWNER_ID)] | None = None
    gid: Annotated[int, Field(ge=0, le=MAX_OWNER_ID)] | None = None
    mode: Annotated[int, Field(ge=0, le=0o7777)] | None = None


def _with_token(volume: Volume) -> dict[str, str]:
    return {"volumeID": volume.id, "name": volume.name, "token": volume.token}


def _stat(entry: VolumeEntry) -> dict[str, Any]:
    return asdict(entry)  # E2B's VolumeEntryStat has exactly these fields


def volume_router(runtime: Runtime) -> APIRouter:
    """``/volumes``: create, list, get, delete (the caller checks the API key)."""
    router = APIRouter()

    @router.post("/volumes", status_code=201)
    async def create(body: _NewVolume) -> dict[str, str]:
        return _with_token(await runtime.create_volume(body.name))

    @router.get("/volumes")
    async def list_all() -> list[dict[str, str]]:
        volumes = await asyncio.to_thread(runtime.volume_records)
        return [{"volumeID": v.id, "name": v.name} for v in volumes]

    @router.get("/volumes/{volume_id}")
    async def get(volume_id: str) -> dict[str, str]:
        return _with_token(await asyncio.to_thread(runtime.volume_record, volume_id))

    @router.delete("/volumes/{volume_id}", status_code=204)
    async def delete(volume_id: str) -> Response:
        await runtime.remove_volume(volume_id)
        return Response(status_code=204)

    return router


def volume_content_router(runtime: Runtime) -> APIRouter:
    """``/volumecontent/{volumeID}/…``: a volume's files, for the bearer of its token."""

    async def volume_of(volume_id: str, request: Request) -> str:
        sent = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        try:
            volume = await asyncio.to_thread(runtime.volume_record, volume_id)
        except NotFound:
            volume = None
        # The same answer for an unknown volume and a wrong token: ids are not probed.
        if volume is None or not hmac.compare_digest(sent.encode(), volume.token.encode()):
            raise HTTPException(401, "invalid or missing volume token (Authorization: Bearer)")
        return volume.id

    router = APIRouter(prefix="/volumecontent/{volume_id}")
    # A default, not an Annotated alias: this module's annotations are strings, and a
    # name local to this function would not resolve.
    authorized = Depends(volume_of)

    @router.get("/file")
    async def read(*, volume: str = authorized, path: str) -> Response:
        data = await runtime.volume_read(volume, path)
        return Response(data, media_type="application/octet-stream")

    @router.put("/file", status_code=201)
    async def write(
        *, volume: str = authorized, request: Request, path: str, uid: _Owner = None,
        gid: _Owner = None, mode: _Mode = None, force: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_VOLUME_FILE_BYTES:
                raise InvalidInput(f"a volume file is at most {MAX_VOLUME_FILE_BYTES} bytes")
        entry = await runtime.volume_write(
            volume, path, bytes(data), force=force, mode=mode, uid=uid, gid=gid
        )
        return _stat(entry)

    @router.get("/dir")
    async def list_dir(
        *, volume: str = authorized, path: str, depth: Annotated[int, Query(ge=1, le=16)] = 1
    ) -> list[dict[str, Any]]:
        return [_stat(e) for e in await runtime.volume_list(volume, path, depth)]

    @router.post("/dir", status_code=201)
    async def make_dir(
        *, volume: str = authorized, path: str, uid: _Owner = None, gid: _Owner = None,
        mode: _Mode = None, force: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        entry = await runtime.volume_make_dir(
            volume, path, force=force, mode=mode, uid=uid, gid=gid
        )
        return _stat(entry)

    @router.get("/path")
    async def stat(*, volume: str = authorized, path: str) -> dict[str, Any]:
        return _stat(await runtime.volume_stat(volume, path))

    @router.patch("/path")
    async def update(*, volume: str = authorized, path: str, body: _Metadata) -> dict[str, Any]:
        entry = await runtime.volume_set_metadata(
            volume, path, mode=body.mode, uid=body.uid, gid=body.gid
        )
        return _stat(entry)

    @router.delete("/path", status_code=204)
    async def remove(*, volume: str = authorized, path: str) -> Response:
        await runtime.volume_remove(volume, path)
        return Response(status_code=204)

    return router
