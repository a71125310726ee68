"""The SDK's one way to reach forkpoint: HTTP, through an httpx transport.

:class:`ApiClient` has one typed method per REST route and returns :mod:`forkpoint.models`
values. Where the requests go is only the transport's business (httpx's design):

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
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from forkpoint.config import home
from forkpoint.errors import ForkpointError, InternalError, InvalidInput, code_for_status
from forkpoint.models import (
    BackgroundProcess,
    Checkpoint,
    CheckpointTransfer,
    CommandResult,
    ErrorResponse,
    FileEntry,
    HistoryStep,
    Port,
    Process,
    Session,
    StateDiff,
)

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = ["ApiClient", "error_from_response"]

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
        from forkpoint.runtime import Runtime
        from forkpoint.server import create_app

        if runtime is None:
            runtime = self._runtime = Runtime.open()
        return httpx.ASGITransport(app=create_app(runtime))

    # -- lifetime ----------------------------------------------------------------------

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
        params: Mapping[str, str | int] | None = None,
    ) -> httpx.Response:  # fmt: skip
        try:
            response = await self._http.request(
                method, "/v1" + path, json=json, content=content, params=params
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

    # -- sessions ----------------------------------------------------------------------

    async def create(self, **request: Any) -> Session:
        """``request``: the fields of :class:`~forkpoint.models.CreateSessionRequest`."""
        session: Session = await self._long(Session, "POST", "/sessions", json=request)
        return session

    async def get(self, session: str) -> Session:
        return await self._parse(Session, "GET", f"/sessions/{_seg(session)}")

    async def list_sessions(self) -> list[Session]:
        return await self._parse(list[Session], "GET", "/sessions")

    async def remove(self, session: str) -> None:
        await self._request("DELETE", f"/sessions/{_seg(session)}")

    async def set_timeout(self, session: str, timeout_s: float | None) -> Session:
        path = f"/sessions/{_seg(session)}/timeout"
        return await self._parse(Session, "POST", path, json={"timeout_s": timeout_s})

    async def rollback(self, session: str, checkpoint: str | None) -> Session:
        path = f"/sessions/{_seg(session)}/rollback"
        rolled: Session = await self._long(Session, "POST", path, json={"checkpoint": checkpoint})
        return rolled

    async def rollback_preview(
        self, session: str, checkpoint: str | None, patch: bool
    ) -> StateDiff:
        path = f"/sessions/{_seg(session)}/rollback/preview"
        body = {"checkpoint": checkpoint, "patch": patch}
        return await self._parse(StateDiff, "POST", path, json=body)

    async def diff(self, **request: Any) -> StateDiff:
        """``request``: the fields of :class:`~forkpoint.requests.DiffRequest`."""
        return await self._parse(StateDiff, "POST", "/diff", json=request)

    async def history(self, session: str) -> list[HistoryStep]:
        return await self._parse(list[HistoryStep], "GET", f"/sessions/{_seg(session)}/history")

    async def undo(self, session: str, steps: int) -> Session:
        path = f"/sessions/{_seg(session)}/undo"
        undone: Session = await self._long(Session, "POST", path, json={"steps": steps})
        return undone

    # -- commands ----------------------------------------------------------------------

    async def exec(self, session: str, **request: Any) -> CommandResult:
        """``request``: the fields of :class:`~forkpoint.models.ExecRequest`."""
        path = f"/sessions/{_seg(session)}/exec"
        return await self._parse(CommandResult, "POST", path, json=request)

    async def spawn(self, session: str, **request: Any) -> BackgroundProcess:
        path = f"/sessions/{_seg(session)}/exec"
        body = {**request, "background": True}
        return await self._parse(BackgroundProcess, "POST", path, json=body)

    async def ps(self, session: str) -> list[Process]:
        return await self._parse(list[Process], "GET", f"/sessions/{_seg(session)}/processes")

    async def kill_process(self, session: str, pid: int, signal: int | str) -> None:
        path = f"/sessions/{_seg(session)}/processes/{int(pid)}"
        await self._request("DELETE", path, params={"signal": str(signal)})

    # -- files -------------------------------------------------------------------------

    async def read_file(self, session: str, path: str) -> bytes:
        url = f"/sessions/{_seg(session)}/files"
        return (await self._request("GET", url, params={"path": path})).content

    async def write_file(self, session: str, path: str, data: bytes, mode: int) -> None:
        url = f"/sessions/{_seg(session)}/files"
        await self._request("PUT", url, content=data, params={"path": path, "mode": mode})

    async def list_files(self, session: str, path: str) -> list[FileEntry]:
        url = f"/sessions/{_seg(session)}/files/list"
        return await self._parse(list[FileEntry], "GET", url, params={"path": path})

    async def remove_file(self, session: str, path: str) -> None:
        await self._request("DELETE", f"/sessions/{_seg(session)}/files", params={"path": path})

    # -- ports and checkpoints ---------------------------------------------------------

    async def forward_port(self, session: str, guest_port: int) -> Port:
        url = f"/sessions/{_seg(session)}/ports"
        return await self._parse(Port, "POST", url, json={"guest_port": guest_port})

    async def checkpoint(self, session: str, name: str | None) -> Checkpoint:
        url = f"/sessions/{_seg(session)}/checkpoints"
        made: Checkpoint = await self._long(Checkpoint, "POST", url, json={"name": name})
        return made

    async def get_checkpoint(self, checkpoint: str) -> Checkpoint:
        return await self._parse(Checkpoint, "GET", f"/checkpoints/{_seg(checkpoint)}")

    async def list_checkpoints(self, session: str | None) -> list[Checkpoint]:
        params = {"session": session} if session else None
        return await self._parse(list[Checkpoint], "GET", "/checkpoints", params=params)

    async def remove_checkpoint(self, checkpoint: str) -> None:
        await self._request("DELETE", f"/checkpoints/{_seg(checkpoint)}")

    async def fork(self, checkpoint: str, count: int) -> list[Session | ForkpointError]:
        url = f"/checkpoints/{_seg(checkpoint)}/fork"
        slots: list[Session | ErrorResponse] = await self._long(
            list[Session | ErrorResponse], "POST", url, json={"count": count}
        )
        return [
            ForkpointError.from_dict(asdict(s.error)) if isinstance(s, ErrorResponse) else s
            for s in slots
        ]

    async def push_checkpoint(self, checkpoint: str, to: str) -> CheckpointTransfer:
        url = f"/checkpoints/{_seg(checkpoint)}/push"
        body = {"to": to}
        return await self._parse(CheckpointTransfer, "POST", url, json=body)

    async def pull_checkpoint(self, ref: str, source: str) -> CheckpointTransfer:
        body = {"ref": ref, "from": source}
        return await self._parse(CheckpointTransfer, "POST", "/checkpoints/pull", json=body)


def command_body(
    command: str | Sequence[str], cwd: str | None, env: Mapping[str, str] | None
) -> dict[str, Any]:
    """The common part of an exec request."""
    return {
        "command": command if isinstance(command, str) else list(command),
        "cwd": cwd,
        "env": dict(env or {}),
    }


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
