"""E2B's template API (``Template.build``, ``build_in_background``, ``get_build_status``,
``exists``, tags) on :class:`~.template_builds.TemplateBuilds`.

The file upload URL the SDK is given points back at the gateway with a token made from the
API key and the files' hash: the SDK's upload sends no API key (it expects a presigned
storage URL), and the token lets only that upload in.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from forkpoint.errors import InvalidInput, NotFound
from forkpoint.images import get_image

from .template_builds import LogLine, TemplateBuilds, check_tags
from .template_dockerfile import TemplateSpec

__all__ = ["template_router", "upload_router"]


class BuildRequest(BaseModel):
    """``TemplateBuildRequestV3``."""

    model_config = ConfigDict(extra="ignore")

    name: str | None = Field(default=None, max_length=200)
    alias: str | None = Field(default=None, max_length=200)
    tags: list[str] = Field(default_factory=list, max_length=100)
    cpuCount: int | None = Field(default=None, ge=1, le=64)
    memoryMB: int | None = Field(default=None, ge=128, le=1024 * 1024)


class TagsRequest(BaseModel):
    """``AssignTemplateTagsRequest``."""

    target: str = Field(max_length=300)
    tags: list[str] = Field(min_length=1, max_length=100)


class RemoveTagsRequest(BaseModel):
    """``DeleteTemplateTagsRequest``."""

    name: str = Field(max_length=300)
    tags: list[str] = Field(min_length=1, max_length=100)


def _upload_token(api_key: str, files_hash: str) -> str:
    return hmac.new(api_key.encode(), f"upload:{files_hash}".encode(), hashlib.sha256).hexdigest()


def _entry(line: LogLine) -> dict[str, object]:
    entry: dict[str, object] = {"timestamp": line.timestamp, "level": line.level,
                                "message": line.message}  # fmt: skip
    return entry | ({"step": line.step} if line.step else {})


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def template_router(
    builds: TemplateBuilds, api_key: Callable[[], str], envd_version: str, allowed: bool
) -> APIRouter:
    """The routes that need the API key; ``allowed``: whether new builds are."""
    router = APIRouter()

    @router.post("/v3/templates", status_code=202, response_model=None)
    async def request_build(body: BuildRequest) -> dict[str, object] | JSONResponse:
        if not allowed:
            message = (
                "template builds are off: their steps run as root on the gateway's host; "
                "start it with `forkpoint serve --e2b --template-builds` to allow them"
            )
            return JSONResponse({"code": 403, "message": message}, status_code=403)
        name = body.name or body.alias
        if not name:
            raise InvalidInput("a template build needs a name")
        build = await asyncio.to_thread(
            builds.request, name, body.tags, body.cpuCount, body.memoryMB
        )
        return {
            "templateID": build.template_id, "buildID": build.build_id, "public": False,
            "names": [build.name], "aliases": [build.name], "tags": build.tags,
        }  # fmt: skip

    @router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
    async def file_upload_link(
        template_id: str, files_hash: str, request: Request
    ) -> dict[str, object]:
        present = await asyncio.to_thread(builds.has_files, template_id, files_hash)
        token = _upload_token(api_key(), files_hash)
        url = f"{str(request.base_url).rstrip('/')}/template-files/{files_hash}?token={token}"
        return {"present": present, "url": url}

    @router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
    async def start_build(template_id: str, build_id: str, body: TemplateSpec) -> Response:
        await builds.start(template_id, build_id, body)
        return Response(status_code=202)

    @router.get("/templates/{template_id}/builds/{build_id}/status")
    async def build_status(
        template_id: str, build_id: str, logsOffset: Annotated[int, Query(ge=0)] = 0
    ) -> dict[str, object]:
        build, lines = await asyncio.to_thread(builds.status, template_id, build_id, logsOffset)
        answer: dict[str, object] = {
            "templateID": build.template_id, "buildID": build.build_id,
            "status": build.status, "logs": [], "logEntries": [_entry(x) for x in lines],
        }  # fmt: skip
        if build.status == "error":
            answer["reason"] = {"message": build.reason or "the build failed"} | (
                {"step": build.step} if build.step else {}
            )
        return answer

    @router.get("/templates")
    async def list_templates() -> list[dict[str, object]]:
        """The templates built from code, each with its newest build."""
        latest = await asyncio.to_thread(builds.store.latest_builds)
        return [
            {
                "templateID": b.template_id,
                "buildID": b.build_id,
                "buildStatus": b.status,
                "names": [b.name],
                "aliases": [b.name],
                "public": False,
                "cpuCount": b.cpus,
                "memoryMB": b.memory_mib,
                "diskSizeMB": 0,
                "createdAt": _iso(b.created_at),
                "updatedAt": _iso(b.created_at),
                "createdBy": None,
                "lastSpawnedAt": None,
                "spawnCount": 0,
                "buildCount": 1,
                "envdVersion": envd_version,
            }  # fmt: skip
            for b in latest
        ]

    @router.get("/templates/aliases/{alias}")
    async def alias(alias: str) -> dict[str, object]:
        """A built template, or one of forkpoint's images (``base``)."""
        template_id = await asyncio.to_thread(builds.store.template_id, alias)
        if template_id is None:
            try:
                await asyncio.to_thread(get_image, alias)
            except (NotFound, InvalidInput):
                raise NotFound(f"template {alias} not found") from None
            template_id = alias
        return {"templateID": template_id, "public": False}

    @router.post("/templates/tags", status_code=201)
    async def assign_tags(body: TagsRequest) -> dict[str, object]:
        tags = check_tags(body.tags)
        build = await asyncio.to_thread(builds.store.assign_tags, body.target, tags)
        return {"tags": tags, "buildID": build.build_id}

    @router.delete("/templates/tags", status_code=204)
    async def remove_tags(body: RemoveTagsRequest) -> Response:
        await asyncio.to_thread(builds.store.remove_tags, body.name, body.tags)
        return Response(status_code=204)

    @router.get("/templates/{template_id}/tags")
    async def list_tags(template_id: str) -> list[dict[str, object]]:
        tags = await asyncio.to_thread(builds.store.tags, template_id)
        return [
            {"tag": t.tag, "buildID": t.build_id, "createdAt": _iso(t.created_at)} for t in tags
        ]

    return router


def upload_router(builds: TemplateBuilds, api_key: Callable[[], str]) -> APIRouter:
    """The upload the file link points at (its token, not the API key, lets it in)."""
    router = APIRouter()

    @router.put("/template-files/{files_hash}")
    async def upload(files_hash: str, token: str, request: Request) -> Response:
        if not hmac.compare_digest(token, _upload_token(api_key(), files_hash)):
            return JSONResponse({"code": 403, "message": "bad upload token"}, status_code=403)
        await builds.save_files(files_hash, request.stream())
        return Response(status_code=200)

    return router
