"""The code interpreter of the ``code-interpreter-v1`` image: E2B's code-interpreter HTTP
API on port 49999 over Jupyter kernels (``jupyter_client`` + ``ipykernel``).

The image starts this when its template boots (``images/recipe.py``); it listens only once
the default Python kernel is up with numpy, pandas and matplotlib imported, so the template
checkpoint holds a warm kernel and every sandbox — and every fork of one — has the kernel
alive at the same PID with its variables.

Routes (what the ``e2b-code-interpreter`` SDK calls): ``POST /execute`` (NDJSON lines:
``stdout``, ``stderr``, ``result``, ``error``, ``number_of_executions``), ``GET/POST
/contexts``, ``DELETE /contexts/{id}``, ``POST /contexts/{id}/restart``, ``GET /health``.
Each connection carries one request and is closed after it. Run as root it drops to the
guest's ``user`` account, as E2B runs the kernel. Standard library + jupyter_client only:
it runs under the guest's Python, not the agent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import queue
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

PORT = 49999
USER = "user"
_MAX_BODY = 16 * 1024 * 1024
_MAX_HEAD = 64 * 1024
_READY_TIMEOUT_S = 300.0
# What the template's warm-up imports: what E2B's code-interpreter users reach for first.
_WARM_UP = "import numpy, pandas, matplotlib\nimport matplotlib.pyplot\n"
# Jupyter MIME types → the keys of E2B's result lines.
_FORMATS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}  # fmt: skip
_REASONS = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
    411: "Length Required", 413: "Payload Too Large", 500: "Internal Server Error",
}  # fmt: skip


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _timestamp(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value or "")


def to_output(msg: dict[str, Any]) -> dict[str, Any] | None:
    """One kernel IOPub message as an E2B output line (None: nothing to send)."""
    kind, content = msg["msg_type"], msg["content"]
    if kind == "stream":
        stamp = _timestamp(msg["header"].get("date"))
        return {"type": content["name"], "text": content["text"], "timestamp": stamp}
    if kind in ("execute_result", "display_data"):
        line: dict[str, Any] = {"type": "result", "is_main_result": kind == "execute_result"}
        extra: dict[str, Any] = {}
        for mime, value in content.get("data", {}).items():
            key = _FORMATS.get(mime)
            if key is None:
                extra[mime] = value
            else:
                line[key] = value
        text = line.get("text")
        if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] == "'":
            line["text"] = text[1:-1]  # a str's repr shows as the str, as E2B shows it
        if extra:
            line["extra"] = extra
        return line
    if kind == "error":
        return {
            "type": "error", "name": content["ename"], "value": content["evalue"],
            "traceback": "\n".join(content.get("traceback", [])),
        }  # fmt: skip
    if kind == "execute_input":
        return {"type": "number_of_executions", "execution_count": content["execution_count"]}
    return None


class Context:
    """One Jupyter kernel and the client that talks to it; one execution at a time."""

    def __init__(self, context_id: str, language: str, cwd: str, sockets: str) -> None:
        from jupyter_client.manager import AsyncKernelManager

        self.id, self.language, self.cwd = context_id, language, cwd
        # IPC, not TCP: no kernel port listens, so the only listener is this server's. The
        # socket paths are absolute: the kernel runs in ``cwd``, this server elsewhere.
        self.manager = AsyncKernelManager(
            kernel_name="python3", transport="ipc", ip=os.path.join(sockets, context_id)
        )
        self.client: Any = None
        self.lock = asyncio.Lock()

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def start(self) -> None:
        if not os.path.isdir(self.cwd):
            raise HttpError(400, f"cwd {self.cwd} is not a directory")
        await self.manager.start_kernel(cwd=self.cwd, env=dict(os.environ))
        self.client = self.manager.client()
        self.client.start_channels()
        await self.client.wait_for_ready(timeout=_READY_TIMEOUT_S)

    async def restart(self) -> None:
        async with self.lock:
            await self.manager.restart_kernel(now=True)
            await self.client.wait_for_ready(timeout=_READY_TIMEOUT_S)

    async def stop(self) -> None:
        async with self.lock:
            self.client.stop_channels()
            await self.manager.shutdown_kernel(now=True)

    async def run_quietly(self, code: str) -> None:
        """Run ``code`` without output or history (set up, warm up, clean up)."""
        msg_id = self.client.execute(code, silent=True, store_history=False)
        while True:
            reply = await self.client.get_shell_msg(timeout=_READY_TIMEOUT_S)
            if reply["parent_header"].get("msg_id") == msg_id:
                return

    async def execute(
        self, code: str, env: dict[str, str], gone: asyncio.Future[Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The output lines of ``code``; the kernel is interrupted if the caller goes
        (``gone`` done) and restarted if it dies."""
        async with self.lock:
            if env:
                await self.run_quietly(_set_env(env))
            try:
                msg_id = self.client.execute(code, store_history=True, allow_stdin=False)
                async for line in self._outputs(msg_id, gone):
                    yield line
            finally:
                if env:
                    await self.run_quietly(_restore_env())

    async def _outputs(
        self, msg_id: str, gone: asyncio.Future[Any]
    ) -> AsyncIterator[dict[str, Any]]:
        interrupted = False
        while True:
            if gone.done() and not interrupted:
                interrupted = True
                await self.manager.interrupt_kernel()
            try:
                msg = await self.client.get_iopub_msg(timeout=1.0)
            except queue.Empty:
                if not await self.manager.is_alive():
                    died = "the kernel died while running this code; restarted it"
                    yield {"type": "error", "name": "DeadKernelError", "value": died,
                           "traceback": ""}  # fmt: skip
                    await self.manager.restart_kernel(now=True)
                    await self.client.wait_for_ready(timeout=_READY_TIMEOUT_S)
                    return
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return
            line = to_output(msg)
            if line is not None and not interrupted:
                yield line


def _set_env(env: dict[str, str]) -> str:
    return (
        "import os as __fp_os\n"
        f"__fp_env = {json.dumps(env)}\n"
        "__fp_saved = {k: __fp_os.environ.get(k) for k in __fp_env}\n"
        "__fp_os.environ.update(__fp_env)\n"
    )


def _restore_env() -> str:
    return (
        "for __fp_k, __fp_v in __fp_saved.items():\n"
        "    if __fp_v is None: __fp_os.environ.pop(__fp_k, None)\n"
        "    else: __fp_os.environ[__fp_k] = __fp_v\n"
        "del __fp_env, __fp_saved, __fp_os\n"
    )


class Interpreter:
    """The contexts of this sandbox and the HTTP routes over them."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.sockets = tempfile.mkdtemp(prefix="forkpoint-kernels-")
        self.contexts: dict[str, Context] = {}
        self.default: Context | None = None

    def _new(self, language: str, cwd: str) -> Context:
        return Context(str(uuid.uuid4()), language, cwd, self.sockets)

    async def start_default(self) -> None:
        context = self._new("python", self.home)
        await context.start()
        await context.run_quietly(_WARM_UP)
        self.default = self.contexts[context.id] = context

    def context_for(self, context_id: str | None, language: str | None) -> Context:
        if context_id:
            if context_id not in self.contexts:
                raise HttpError(404, f"Context {context_id} not found")
            return self.contexts[context_id]
        _check_language(language)
        assert self.default is not None
        return self.default

    async def create_context(self, body: dict[str, Any]) -> dict[str, str]:
        language = _check_language(body.get("language"))
        context = self._new(language, str(body.get("cwd") or self.home))
        await context.start()
        self.contexts[context.id] = context
        return context.to_json()

    async def remove_context(self, context_id: str) -> None:
        context = self.context_for(context_id, None)
        if context is self.default:
            raise HttpError(400, "the default context cannot be removed; restart it instead")
        del self.contexts[context_id]
        await context.stop()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            method, path, body = await _read_request(reader)
            await self.route(method, path, body, reader, writer)
        except HttpError as error:
            await _respond(writer, error.status, error.message.encode(), "text/plain")
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as error:  # a bug must answer, not hang the SDK
            await _respond(writer, 500, f"{type(error).__name__}: {error}".encode(), "text/plain")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def route(
        self,
        method: str,
        path: str,
        body: dict[str, Any],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        parts = [p for p in path.split("?", 1)[0].split("/") if p]
        if parts == ["health"] and method == "GET":
            await _respond_json(writer, "OK")
        elif parts == ["execute"] and method == "POST":
            await self.execute(body, reader, writer)
        elif parts == ["contexts"] and method == "GET":
            await _respond_json(writer, [c.to_json() for c in self.contexts.values()])
        elif parts == ["contexts"] and method == "POST":
            await _respond_json(writer, await self.create_context(body))
        elif len(parts) == 2 and parts[0] == "contexts" and method == "DELETE":
            await self.remove_context(parts[1])
            await _respond(writer, 200, b"", "text/plain")
        elif len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            if method != "POST":
                raise HttpError(405, "use POST")
            await self.context_for(parts[1], None).restart()
            await _respond(writer, 200, b"", "text/plain")
        else:
            raise HttpError(404, f"no route {method} {path}")

    async def execute(
        self, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        code = body.get("code")
        if not isinstance(code, str):
            raise HttpError(400, "code must be a string")
        env = body.get("env_vars") or {}
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise HttpError(400, "env_vars must map names to strings")
        context = self.context_for(body.get("context_id"), body.get("language"))
        writer.write(_head(200, "application/x-ndjson"))
        gone = asyncio.ensure_future(reader.read(1))  # the client closing its side
        try:
            async for line in context.execute(code, env, gone):
                if gone.done():
                    continue
                writer.write(json.dumps(line).encode() + b"\n")
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
        finally:
            gone.cancel()


def _check_language(language: Any) -> str:
    name = str(language or "python").strip().lower()
    if name != "python":
        raise HttpError(404, f"no kernel for language {name!r}: this template runs Python")
    return name


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, Any]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError(400, "request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, path, _version = lines[0].split(" ", 2)
    except ValueError:
        raise HttpError(400, "malformed request line") from None
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if headers.get("transfer-encoding"):
        raise HttpError(411, "send the body with a Content-Length")
    length = int(headers.get("content-length") or 0)
    if length > _MAX_BODY:
        raise HttpError(413, f"body over {_MAX_BODY} bytes")
    raw = await reader.readexactly(length) if length else b""
    if not raw.strip():
        return method, path, {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise HttpError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return method, path, body


def _head(status: int, content_type: str, length: int | None = None) -> bytes:
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return (head + "Connection: close\r\n\r\n").encode()


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes, kind: str) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(_head(status, kind, len(body)) + body)
        await writer.drain()


async def _respond_json(writer: asyncio.StreamWriter, value: Any) -> None:
    await _respond(writer, 200, json.dumps(value).encode(), "application/json")


def _become_user() -> str:
    """Drop root for ``user`` (as E2B runs its kernel); the home to work in."""
    if os.getuid() != 0:
        return os.path.expanduser("~")
    try:
        account = pwd.getpwnam(USER)
    except KeyError:
        return "/root"
    os.initgroups(USER, account.pw_gid)
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    os.environ.update(HOME=account.pw_dir, USER=USER, LOGNAME=USER)
    return account.pw_dir


async def serve(port: int = PORT, host: str = "0.0.0.0") -> None:
    home = _become_user()
    os.chdir(home)
    interpreter = Interpreter(home)
    await interpreter.start_default()
    server = await asyncio.start_server(interpreter.handle, host, port, limit=_MAX_HEAD)
    print(f"code interpreter listening on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else PORT))
