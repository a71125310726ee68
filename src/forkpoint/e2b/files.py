"""envd's HTTP ``/files``: download (GET) and upload (POST, multipart with one or more
``file`` parts, or a raw octet-stream body, optionally gzip-encoded).

Bodies spill to a host temp file beyond a few MiB and are streamed to the guest.
"""

from __future__ import annotations

import posixpath
import tempfile
import zlib
from collections.abc import AsyncIterator
from typing import IO, Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from forkpoint.errors import ForkpointError, InvalidInput, NotFound

from .context import EnvdCall

__all__ = ["download", "envd_http_error", "upload"]

_SPOOL_BYTES = 8 << 20
_CHUNK = 256 * 1024
_METADATA_HEADER = "x-metadata-"


def envd_http_error(status: int, message: str) -> JSONResponse:
    """envd's HTTP error shape (the SDK maps 400, 401, 404, 502 … by status)."""
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _error(error: ForkpointError) -> JSONResponse:
    if isinstance(error, NotFound):
        return envd_http_error(404, error.message)
    if isinstance(error, InvalidInput):
        return envd_http_error(400, error.message)
    return envd_http_error(500, error.message)


def guest_path(path: str | None, user: str) -> str:
    """An absolute guest path; relative ones are under the user's home, as in envd."""
    if not path:
        raise InvalidInput("path is required")
    home = "/root" if user == "root" else f"/home/{user}"
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(home, path))


async def download(call: EnvdCall, path: str | None) -> Response:
    try:
        target = guest_path(path, call.user)
        spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)
        await call.runtime.read_file_to(call.sandbox_id, target, spool)
    except ForkpointError as error:
        return _error(error)
    spool.seek(0)

    async def body() -> AsyncIterator[bytes]:
        try:
            while chunk := spool.read(_CHUNK):
                yield chunk
        finally:
            spool.close()

    return StreamingResponse(body(), media_type="application/octet-stream")


async def upload(call: EnvdCall, request: Request, path: str | None) -> Response:
    content_type = request.headers.get("content-type", "")
    metadata = _metadata_of(request)
    try:
        if content_type.startswith("multipart/form-data"):
            written = await _multipart(call, request, path, metadata)
        else:
            written = [await _raw(call, request, guest_path(path, call.user), metadata)]
    except ForkpointError as error:
        return _error(error)
    return JSONResponse(written)


def _metadata_of(request: Request) -> dict[str, str] | None:
    """The ``X-Metadata-<key>`` headers of an upload (envd ≥ 0.6.2), keys lowercased."""
    found = {
        name[len(_METADATA_HEADER) :].lower(): value
        for name, value in request.headers.items()
        if name.lower().startswith(_METADATA_HEADER)
    }
    return found or None


async def _write(
    call: EnvdCall, target: str, data: IO[bytes], metadata: dict[str, str] | None
) -> dict[str, Any]:
    await call.runtime.write_file(call.sandbox_id, target, data, user=call.user, metadata=metadata)
    written: dict[str, Any] = {"path": target, "name": posixpath.basename(target), "type": "file"}
    if metadata:
        written["metadata"] = metadata
    return written


async def _multipart(
    call: EnvdCall, request: Request, path: str | None, metadata: dict[str, str] | None
) -> list[dict[str, Any]]:
    form = await request.form(max_files=10_000, max_fields=10_000, max_part_size=1 << 30)
    try:
        parts = [p for p in form.getlist("file") if isinstance(p, UploadFile)]
        if not parts:
            raise InvalidInput("no 'file' part in the multipart body")
        if path is not None and len(parts) > 1:
            raise InvalidInput("a path query names one file; several parts need no path")
        return [
            await _write(call, guest_path(path or part.filename, call.user), part.file, metadata)
            for part in parts
        ]
    finally:
        await form.close()


async def _raw(
    call: EnvdCall, request: Request, target: str, metadata: dict[str, str] | None
) -> dict[str, Any]:
    gzipped = request.headers.get("content-encoding", "").lower() == "gzip"
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
        async for chunk in request.stream():
            spool.write(inflate.decompress(chunk) if inflate else chunk)
        if inflate:
            spool.write(inflate.flush())
        spool.seek(0)
        return await _write(call, target, spool, metadata)
