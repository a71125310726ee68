"""The SDK's one way to reach forkpoint: HTTP, through an httpx transport.

:class:`ApiClient` has one typed method per REST route and returns :mod:`forkpoint.models`
values; for the operations of :mod:`forkpoint.api.table` it says only which one
(:meth:`ApiClient.call`): method, path, body and whether it may answer 202 come from the
declaration. Where the requests go is only the transport's business (httpx's design):

* ``unix:/path/forkpoint.sock`` or ``http://127.0.0.1:PORT`` — a ``forkpoint serve``;
* nothing — *embedded*: the same REST app, in this process, on
  ``httpx.ASGITransport(create_app(Runtime.open()))``. The runtime and the server are
  imported only then, so ``import forkpoint.sdk`` stays light.

Errors come back as the :mod:`forkpoint.errors` class the server raised, with the same
structured fields (``ForkpointError.from_dict``).

Create, fork, checkpoint and rollback answer within the server's bound (5 s by default)
or with 202 and an operation; :meth:`ApiClient._long` then polls the operation until it
ends, so callers see one call that returns the result or raises its error either way.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json as json_module
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from forkpoint.api import operation
from forkpoint.config import home
from forkpoint.errors import ForkpointError, InternalError, InvalidInput, code_for_status
from forkpoint.models import (
    BackgroundProcess,
    Checkpoint,
    CheckpointTransfer,
    CommandResult,
    ErrorResponse,
    Event,
    FileCheck,
    FileEntry,
    GuestRestore,
    HistoryStep,
    HostStatus,
    ImageInfo,
    Metric,
    Port,
    Process,
    ProcessEvent,
    Session,
    StateDiff,
)

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = ["METADATA_HEADER", "ApiClient", "error_from_response"]

#: A file's metadata travels as ``X-Metadata-<key>: <value>`` headers of its upload (as
#: E2B's envd takes it).
METADATA_HEADER = "X-Metadata-"

T = TypeVar("T")

# Reads wait as long as a guest command may run; connecting must be quick.
_TIMEOUT = httpx.Timeout(30.0, read=None)
_POLL_FIRST_S, _POLL_MAX_S = 0.1, 2.0  # polling an operation: doubling intervals, capped


def error_from_response(status: int, payload: object) -> ForkpointError:
    """The error an ``{"error": {"code", "message", …}}`` body names (a generic one by
    HTTP status when the body is not that shape)."""
    body = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(body, dict) and "code" in body:
        return ForkpointError.from_dict(body)
    return ForkpointError.from_dict({"code": code_for_status(status), "message": f"HTTP {status}"})


class ApiClient:
    """One connection to forkpoint, shared by every sandbox and checkpoint made from it
    and closed when the last one lets go (reference counted)."""

    def __init__(
        self, base_url: str | None = None, token: str | None = None, runtime: Runtime | None = None
    ) -> None:
        self._users = 0
        self._runtime: Runtime | None = None  # opened here, closed with the client
        headers = {}
        if base_url is None:
            transport: httpx.AsyncBaseTransport = self._embedded(runtime)
            self.description = "embedded"
            url = "http://forkpoint"
        elif base_url.startswith("unix:"):
            transport = httpx.AsyncHTTPTransport(uds=base_url.removeprefix("unix:"))
            self.description, url = base_url, "http://forkpoint"
        elif base_url.startswith(("http://", "https://")):
            transport = httpx.AsyncHTTPTransport()
            self.description, url = base_url, base_url
            token = token or _local_token()
        else:
            raise InvalidInput(f"base_url must be unix:/path or http://host:port: {base_url}")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            transport=transport, base_url=url, headers=headers, timeout=_TIMEOUT
        )

    def _embedded(self, runtime: Runtime | None) -> httpx.AsyncBaseTransport:
        from forkpoint.cluster.doors import open_runtime
        from forkpoint.server import create_app

        from ._asgi import StreamingASGITransport  # a terminal's output streams in-process too

        if runtime is None:
            runtime = self._runtime = open_runtime()  # FORKPOINT_CLUSTER: the cluster's
        return StreamingASGITransport(create_app(runtime))

    # -- lifetime ----------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def held(
        cls, base_url: str | None, token: str | None, runtime: Runtime | None
    ) -> AsyncIterator[ApiClient]:
        """A new client, held while the block runs: what the block makes from it (a
        sandbox, a checkpoint) holds it on; if nothing does, it closes on leaving."""
        client = cls(base_url, token, runtime)
        client.retain()
        try:
            yield client
        finally:
            await client.release()

    def retain(self) -> None:
        self._users += 1

    async def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            await self._http.aclose()
            if self._runtime is not None:
                self._runtime.close()
                self._runtime = None

    # -- plumbing ----------------------------------------------------------------------

    async def _request(
        self, method: str, path: str, *, json: object = None, content: bytes | None = None,
        params: Mapping[str, str | int] | None = None, headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:  # fmt: skip
        try:
            response = await self._http.request(
                method, "/v1" + path, json=json, content=content, params=params, headers=headers
            )
        except httpx.TransportError as error:
            raise InternalError(
                f"cannot reach the forkpoint server at {self.description}: {error}"
            ) from error
        if response.status_code >= 400:
            try:
                payload: object = response.json()
            except ValueError:
                payload = None
            raise error_from_response(response.status_code, payload)
        return response

    async def _parse(self, kind: type[T], method: str, path: str, **kwargs: Any) -> T:
        response = await self._request(method, path, **kwargs)
        return TypeAdapter(kind).validate_json(response.content)

    async def _long(self, kind: Any, method: str, path: str, **kwargs: Any) -> Any:
        """A create, fork, checkpoint, rollback or undo: its answer, or — when the server answered
        202 with an operation — the operation's result once it ended (its error raised)."""
        response = await self._request(method, path, **kwargs)
        adapter = TypeAdapter(kind)
        if response.status_code != 202:
            return adapter.validate_json(response.content)
        operation = response.json()
        interval = _POLL_FIRST_S
        while operation.get("state") == "running":
            await asyncio.sleep(interval)
            interval = min(interval * 2, _POLL_MAX_S)
            operation = (
                await self._request("GET", f"/operations/{_seg(operation['operation_id'])}")
            ).json()
        if operation.get("state") != "succeeded":
            raise error_from_response(500, {"error": operation.get("error")})
        return adapter.validate_python(operation.get("result"))

    # -- the declared operations (api/table.py) ---------------------------------------

    async def call(self, name: str, *ids: str, body: dict[str, Any] | None = None) -> Any:
        """Operation ``name`` of the table, on ``ids`` (its path's, in order): its answer
        as its response type (a heavy one's 202 polled to its end); None when it answers
        nothing."""
        op = operation(name)
        path = op.path
        for param, value in zip(op.ids, ids, strict=True):
            path = re.sub(r"\{" + param + r"(:[a-z_]+)?\}", _seg(value), path)
        json = (body or {}) if op.request is not None else None
        if op.method == "GET":  # a GET's request is its query string
            query = {k: v for k, v in (json or {}).items() if v is not None}
            return await self._parse(op.response, op.method, path, params=query)
        if op.cost is not None and op.cost.kind is not None:
            return await self._long(op.response, op.method, path, json=json)
        if op.response is None:
            await self._request(op.method, path, json=json)
            return None
        return await self._parse(op.response, op.method, path, json=json)

    # -- images ------------------------------------------------------------------------

    async def host_status(self) -> HostStatus:
        status: HostStatus = await self.call("host_status")
        return status

    async def images(self) -> list[ImageInfo]:
        listed: list[ImageInfo] = await self.call("list_images")
        return listed

    async def build_image(self, **request: Any) -> ImageInfo:
        """``request``: the fields of :class:`~forkpoint.requests.ImageBuildRequest`."""
        built: ImageInfo = await self.call("build_image", body=request)
        return built

    async def remove_image(self, name: str) -> list[str]:
        removed: list[str] = await self.call("remove_image", name)
        return removed

    # -- sessions ----------------------------------------------------------------------

    async def create(self, **request: Any) -> Session:
        """``request``: the fields of :class:`~forkpoint.requests.CreateSessionRequest`."""
        session: Session = await self.call("create_session", body=request)
        return session

    async def get(self, session: str) -> Session:
        found: Session = await self.call("get_session", session)
        return found

    async def list_sessions(self) -> list[Session]:
        listed: list[Session] = await self.call("list_sessions")
        return listed

    async def remove(self, session: str) -> None:
        await self.call("remove_session", session)

    async def set_timeout(
        self,
        session: str,
        timeout_s: float | None,
        on_expiry: str | None = None,
        keep_memory: bool | None = None,
    ) -> Session:
        body = {"timeout_s": timeout_s, "on_expiry": on_expiry, "keep_memory": keep_memory}
        updated: Session = await self.call("set_timeout", session, body=body)
        return updated

    async def set_egress(
        self,
        session: str,
        allow_net: Sequence[str],
        deny_net: Sequence[str],
        inject_headers: Mapping[str, Mapping[str, str]] | None = None,
    ) -> Session:
        body = {
            "allow_net": list(allow_net),
            "deny_net": list(deny_net),
            "inject_headers": {host: dict(h) for host, h in (inject_headers or {}).items()},
        }
        updated: Session = await self.call("set_egress", session, body=body)
        return updated

    async def pause(self, session: str, keep_memory: bool = True) -> Session:
        paused: Session = await self.call("pause", session, body={"keep_memory": keep_memory})
        return paused

    async def resume(self, session: str) -> Session:
        resumed: Session = await self.call("resume", session)
        return resumed

    async def rollback(self, session: str, checkpoint: str | None) -> Session:
        rolled: Session = await self.call("rollback", session, body={"checkpoint": checkpoint})
        return rolled

    async def rollback_preview(
        self, session: str, checkpoint: str | None, patch: bool
    ) -> StateDiff:
        body = {"checkpoint": checkpoint, "patch": patch}
        preview: StateDiff = await self.call("rollback_preview", session, body=body)
        return preview

    async def diff(self, **request: Any) -> StateDiff:
        """``request``: the fields of :class:`~forkpoint.requests.DiffRequest`."""
        found: StateDiff = await self.call("diff", body=request)
        return found

    async def history(self, session: str) -> list[HistoryStep]:
        steps: list[HistoryStep] = await self.call("history", session)
        return steps

    async def metrics(
        self, session: str, start: datetime | None, end: datetime | None
    ) -> list[Metric]:
        query = {k: v.isoformat() for k, v in (("start", start), ("end", end)) if v is not None}
        samples: list[Metric] = await self.call("metrics", session, body=query)
        return samples

    async def events(self, after: int, session: str | None, wait: float, limit: int) -> list[Event]:
        query = {"after": after, "session": session, "wait": wait, "limit": limit}
        found: list[Event] = await self.call("events", body=query)
        return found

    async def undo(self, session: str, steps: int) -> Session:
        undone: Session = await self.call("undo", session, body={"steps": steps})
        return undone

    async def recover(self) -> list[Session | ForkpointError]:
        """Every crashed session rolled back to its latest checkpoint; one slot each."""
        return _slots(await self.call("recover_sessions"))

    # -- commands (by hand: a union of two bodies and two answers) ----------------------

    async def exec(self, session: str, **request: Any) -> CommandResult:
        """``request``: the fields of :class:`~forkpoint.models.ExecRequest`."""
        path = f"/sessions/{_seg(session)}/exec"
        return await self._parse(CommandResult, "POST", path, json=request)

    async def spawn(self, session: str, **request: Any) -> BackgroundProcess:
        path = f"/sessions/{_seg(session)}/exec"
        body = {**request, "background": True}
        return await self._parse(BackgroundProcess, "POST", path, json=body)

    async def ps(self, session: str) -> list[Process]:
        processes: list[Process] = await self.call("processes", session)
        return processes

    async def restore_status(self, session: str) -> GuestRestore:
        status: GuestRestore = await self.call("restore_status", session)
        return status

    async def kill_process(self, session: str, pid: int, signal: int | str) -> None:
        path = f"/sessions/{_seg(session)}/processes/{int(pid)}"
        await self._request("DELETE", path, params={"signal": str(signal)})

    # -- files (by hand: raw bytes both ways) -----------------------------------------

    async def read_file(self, session: str, path: str) -> bytes:
        url = f"/sessions/{_seg(session)}/files"
        return (await self._request("GET", url, params={"path": path})).content

    async def write_file(
        self, session: str, path: str, data: bytes, mode: int,
        metadata: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        url = f"/sessions/{_seg(session)}/files"
        headers = {f"{METADATA_HEADER}{key}": value for key, value in (metadata or {}).items()}
        await self._request(
            "PUT", url, content=data, params={"path": path, "mode": mode}, headers=headers
        )

    async def list_files(self, session: str, path: str) -> list[FileEntry]:
        url = f"/sessions/{_seg(session)}/files/list"
        return await self._parse(list[FileEntry], "GET", url, params={"path": path})

    async def remove_file(self, session: str, path: str) -> None:
        await self._request("DELETE", f"/sessions/{_seg(session)}/files", params={"path": path})

    # -- terminals -----------------------------------------------------------------------

    async def open_terminal(self, session: str, **request: Any) -> AsyncIterator[ProcessEvent]:
        """``request``: the fields of :class:`~forkpoint.requests.TerminalRequest`. The
        events (start first); errors raise from the first ``__anext__``."""
        url = f"/sessions/{_seg(session)}/terminals"
        return self._events("POST", url, json=request)

    async def connect_terminal(self, session: str, pid: int) -> AsyncIterator[ProcessEvent]:
        return self._events("GET", f"/sessions/{_seg(session)}/terminals/{pid}")

    async def type_into_terminal(self, session: str, pid: int, data: bytes) -> None:
        body = {"data": base64.b64encode(data).decode("ascii")}
        await self.call("type_into_terminal", session, str(pid), body=body)

    async def resize_terminal(self, session: str, pid: int, cols: int, rows: int) -> None:
        body = {"cols": cols, "rows": rows}
        await self.call("resize_terminal", session, str(pid), body=body)

    async def close_terminal(self, session: str, pid: int) -> None:
        await self.call("close_terminal", session, str(pid))

    async def _events(
        self, method: str, path: str, *, json: object = None
    ) -> AsyncIterator[ProcessEvent]:
        """A streamed NDJSON answer of process events (hanging up detaches)."""
        try:
            async with self._http.stream(method, "/v1" + path, json=json) as response:
                if response.status_code >= 400:
                    await response.aread()
                    try:
                        payload: object = response.json()
                    except ValueError:
                        payload = None
                    raise error_from_response(response.status_code, payload)
                async for line in response.aiter_lines():
                    if line.strip():
                        yield _process_event(line)
        except httpx.TransportError as error:
            raise InternalError(
                f"cannot reach the forkpoint server at {self.description}: {error}"
            ) from error

    # -- ports and checkpoints ---------------------------------------------------------

    async def forward_port(self, session: str, guest_port: int) -> Port:
        port: Port = await self.call("forward_port", session, body={"guest_port": guest_port})
        return port

    async def checkpoint(self, session: str, name: str | None) -> Checkpoint:
        made: Checkpoint = await self.call("checkpoint", session, body={"name": name})
        return made

    async def get_checkpoint(self, checkpoint: str) -> Checkpoint:
        found: Checkpoint = await self.call("get_checkpoint", checkpoint)
        return found

    async def list_checkpoints(self, session: str | None) -> list[Checkpoint]:
        params = {"session": session} if session else None
        return await self._parse(list[Checkpoint], "GET", "/checkpoints", params=params)

    async def remove_checkpoint(self, checkpoint: str) -> None:
        await self.call("remove_checkpoint", checkpoint)

    async def fork(
        self, checkpoint: str, count: int, spread: bool = False
    ) -> list[Session | ForkpointError]:
        body: dict[str, Any] = {"count": count}
        if spread:  # only when asked: a server from before it refuses the field
            body["spread"] = True
        return _slots(await self.call("fork", checkpoint, body=body))

    async def verify_checkpoint(self, checkpoint: str) -> list[FileCheck]:
        verdicts: list[FileCheck] = await self.call("verify_checkpoint", checkpoint)
        return verdicts

    async def push_checkpoint(self, checkpoint: str, to: str) -> CheckpointTransfer:
        pushed: CheckpointTransfer = await self.call("push_checkpoint", checkpoint, body={"to": to})
        return pushed

    async def pull_checkpoint(self, ref: str, source: str) -> CheckpointTransfer:
        body = {"ref": ref, "from": source}
        pulled: CheckpointTransfer = await self.call("pull_checkpoint", body=body)
        return pulled


def _slots(slots: list[Session | ErrorResponse]) -> list[Session | ForkpointError]:
    """A fork's or recover's slots, each failure as the error it names."""
    return [
        ForkpointError.from_dict(asdict(s.error)) if isinstance(s, ErrorResponse) else s
        for s in slots
    ]


def command_body(
    command: str | Sequence[str], cwd: str | None, env: Mapping[str, str] | None
) -> dict[str, Any]:
    """The common part of an exec request."""
    return {
        "command": command if isinstance(command, str) else list(command),
        "cwd": cwd,
        "env": dict(env or {}),
    }


def _process_event(line: str) -> ProcessEvent:
    """One line of a terminal's NDJSON stream (see ``server/app.py``)."""
    fields = json_module.loads(line)
    data = base64.b64decode(fields.get("data", ""))
    return ProcessEvent(
        fields["kind"], fields["pid"], data, exit_code=fields.get("exit_code"),
        signal=fields.get("signal"), error=fields.get("error"),
    )  # fmt: skip


def _seg(value: str) -> str:
    """A path segment, escaped (ids and names are plain, but never trust that)."""
    return quote(value, safe="")


def _local_token() -> str | None:
    """``$FORKPOINT_TOKEN``, else the token file a local ``forkpoint serve --port`` wrote."""
    token = os.environ.get("FORKPOINT_TOKEN")
    token_file = home().token
    if token is None and token_file.is_file():
        token = token_file.read_text().strip()
    return token
