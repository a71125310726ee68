"""An httpx transport to an ASGI app in this process that streams the answer.

``httpx.ASGITransport`` collects the whole body before answering, so a stream that lasts
(a terminal's output) would never arrive in the embedded SDK. This one answers as soon
as the app has started its response and hands on each body chunk as the app sends it; a
client that closes the response early tells the app (``http.disconnect``) and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx

__all__ = ["StreamingASGITransport"]

_Message = MutableMapping[str, Any]
_END = object()


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: asyncio.Queue[object], app: asyncio.Task[None]) -> None:
        self._chunks = chunks
        self._app = app

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not _END:
            if isinstance(chunk, BaseException):
                raise chunk
            assert isinstance(chunk, bytes)
            yield chunk

    async def aclose(self) -> None:
        self._app.cancel()
        with contextlib.suppress(BaseException):
            await self._app


class StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: Any) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme, "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port), "client": ("127.0.0.1", 123),
            "root_path": "",
        }  # fmt: skip
        body = request.stream.__aiter__()
        sent_all = False
        started: asyncio.Future[_Message] = asyncio.get_running_loop().create_future()
        chunks: asyncio.Queue[object] = asyncio.Queue()
        done = asyncio.Event()

        async def receive() -> _Message:
            nonlocal sent_all
            if sent_all:
                await done.wait()  # until the client hangs up (the task is cancelled)
                return {"type": "http.disconnect"}
            try:
                return {"type": "http.request", "body": await anext(body), "more_body": True}
            except StopAsyncIteration:
                sent_all = True
                return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: _Message) -> None:
            if message["type"] == "http.response.start":
                started.set_result(message)
            elif message["type"] == "http.response.body":
                if message.get("body") and request.method != "HEAD":
                    chunks.put_nowait(bytes(message["body"]))
                if not message.get("more_body", False):
                    chunks.put_nowait(_END)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as error:  # the caller gets it: at the start, or in the body
                if not started.done():
                    started.set_exception(error)
                chunks.put_nowait(error)
            finally:
                if not started.done():
                    started.set_exception(RuntimeError("the app answered nothing"))
                chunks.put_nowait(_END)
                done.set()

        app = asyncio.create_task(run())
        try:
            start = await asyncio.shield(started)
        except BaseException:
            app.cancel()
            raise
        return httpx.Response(
            start["status"], headers=start.get("headers", []), stream=_Body(chunks, app)
        )
