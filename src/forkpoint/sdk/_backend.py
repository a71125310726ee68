"""The two ways the SDK reaches forkpoint: in-process (:class:`EmbeddedBackend`, calls a
:class:`~forkpoint.runtime.Runtime`) or over REST (:class:`RemoteBackend`, httpx).

Both return plain JSON-shaped dicts (the REST contract), so the SDK objects above them do
not care which one they hold. Both raise :mod:`forkpoint.errors` classes; over REST the
``{"error": {"code"}}`` body is mapped back to the class with that code.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from forkpoint import errors
from forkpoint.config import home
from forkpoint.errors import ForkpointError, InternalError
from forkpoint.runtime import Runtime

__all__ = ["Backend", "EmbeddedBackend", "RemoteBackend", "connect", "error_from_payload"]

JSON = dict[str, Any]


class Backend(Protocol):
    """What the SDK needs; shared by every object made from one connection."""

    description: str

    def retain(self) -> None: ...
    async def release(self) -> None: ...

    async def create(
        self, *, image: str, memory_mib: int, cpus: int, name: str | None,
        ports: Sequence[int], network: str,
    ) -> JSON: ...  # fmt: skip
    async def get(self, session: str) -> JSON: ...
    async def list_sessions(self) -> list[JSON]: ...
    async def remove(self, session: str) -> None: ...
    async def exec(
        self, session: str, command: str | Sequence[str], *, cwd: str | None,
        env: Mapping[str, str] | None, stdin: bytes | None, timeout: float | None,
    ) -> JSON: ...  # fmt: skip
    async def spawn(
        self, session: str, command: str | Sequence[str], *, cwd: str | None,
        env: Mapping[str, str] | None,
    ) -> JSON: ...  # fmt: skip
    async def ps(self, session: str) -> list[JSON]: ...
    async def kill_process(self, session: str, pid: int, signal: int | str) -> None: ...
    async def read_file(self, session: str, path: str) -> bytes: ...
    async def write_file(self, session: str, path: str, data: bytes, mode: int) -> None: ...
    async def list_files(self, session: str, path: str) -> list[JSON]: ...
    async def remove_file(self, session: str, path: str) -> None: ...
    async def forward_port(self, session: str, guest_port: int) -> JSON: ...
    async def checkpoint(self, session: str, name: str | None) -> JSON: ...
    async def get_checkpoint(self, checkpoint: str) -> JSON: ...
    async def list_checkpoints(self, session: str | None) -> list[JSON]: ...
    async def remove_checkpoint(self, checkpoint: str) -> None: ...
    async def fork(self, checkpoint: str, count: int) -> list[JSON | ForkpointError]: ...
    async def rollback(self, session: str, checkpoint: str | None) -> JSON: ...


class _Shared:
    """Reference counted: closed when the last sandbox/checkpoint using it lets go."""

    def __init__(self) -> None:
        self._users = 0

    def retain(self) -> None:
        self._users += 1

    async def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            await self._close()

    async def _close(self) -> None:
        raise NotImplementedError


class EmbeddedBackend(_Shared):
    """Calls an in-process runtime (opened here unless one is given)."""

    def __init__(self, runtime: Runtime | None = None) -> None:
        super().__init__()
        self._owns_runtime = runtime is None
        self.runtime = runtime or Runtime.open()
        self.description = f"embedded ({self.runtime.home.root})"

    async def _close(self) -> None:
        if self._owns_runtime:
            self.runtime.close()

    async def create(
        self, *, image: str, memory_mib: int, cpus: int, name: str | None,
        ports: Sequence[int], network: str,
    ) -> JSON:  # fmt: skip
        session = await self.runtime.create(
            image=image, memory_mib=memory_mib, cpus=cpus, name=name, ports=ports,
            network=network,
        )  # fmt: skip
        return session.to_dict()

    async def get(self, session: str) -> JSON:
        return self.runtime.get(session).to_dict()

    async def list_sessions(self) -> list[JSON]:
        return [s.to_dict() for s in self.runtime.list_sessions()]

    async def remove(self, session: str) -> None:
        await self.runtime.remove(session)

    async def exec(
        self, session: str, command: str | Sequence[str], *, cwd: str | None,
        env: Mapping[str, str] | None, stdin: bytes | None, timeout: float | None,
    ) -> JSON:  # fmt: skip
        r = await self.runtime.exec(
            session, command, cwd=cwd, env=env, stdin=stdin, timeout=timeout
        )
        return {
            "exit_code": r.exit_code, "signal": r.signal, "stdout": r.stdout,
            "stderr": r.stderr, "truncated": r.truncated, "duration_ms": r.duration_ms,
            "pid": r.pid,
        }  # fmt: skip

    async def spawn(
        self, session: str, command: str | Sequence[str], *, cwd: str | None,
        env: Mapping[str, str] | None,
    ) -> JSON:  # fmt: skip
        r = await self.runtime.spawn(session, command, cwd=cwd, env=env)
        return {"pid": r.pid, "log_path": r.log_path}

    async def ps(self, session: str) -> list[JSON]:
        return [
            {"pid": p.pid, "ppid": p.ppid, "cmd": p.cmd} for p in await self.runtime.ps(session)
        ]

    async def kill_process(self, session: str, pid: int, signal: int | str) -> None:
        await self.runtime.kill_process(session, pid, signal)

    async def read_file(self, session: str, path: str) -> bytes:
        return await self.runtime.read_file(session, path)

    async def write_file(self, session: str, path: str, data: bytes, mode: int) -> None:
        await self.runtime.write_file(session, path, data, mode=mode)

    async def list_files(self, session: str, path: str) -> list[JSON]:
        return [
            {"name": e.name, "type": e.type, "size": e.size, "mode": e.mode, "mtime_ns": e.mtime_ns}
            for e in await self.runtime.list_files(session, path)
        ]

    async def remove_file(self, session: str, path: str) -> None:
        await self.runtime.remove_file(session, path)

    async def forward_port(self, session: str, guest_port: int) -> JSON:
        return (await self.runtime.forward_port(session, guest_port)).to_dict()

    async def checkpoint(self, session: str, name: str | None) -> JSON:
        return (await self.runtime.checkpoint(session, name)).to_dict()

    async def get_checkpoint(self, checkpoint: str) -> JSON:
        return self.runtime.get_checkpoint(checkpoint).to_dict()

    async def list_checkpoints(self, session: str | None) -> list[JSON]:
        return [c.to_dict() for c in self.runtime.list_checkpoints(session)]

    async def remove_checkpoint(self, checkpoint: str) -> None:
        await self.runtime.remove_checkpoint(checkpoint)

    async def fork(self, checkpoint: str, count: int) -> list[JSON | ForkpointError]:
        results = await self.runtime.fork(checkpoint, count)
        return [r if isinstance(r, ForkpointError) else r.to_dict() for r in results]

    async def rollback(self, session: str, checkpoint: str | None) -> JSON:
        return (await self.runtime.rollback(session, checkpoint)).to_dict()


def _error_classes() -> dict[str, type[ForkpointError]]:
    table: dict[str, type[ForkpointError]] = {}
    for name in errors.__all__:
        cls = getattr(errors, name)
        # Several classes share a code (internal): keep the most general one.
        table.setdefault(cls.code, cls)
    table["internal"] = InternalError
    return table


_BY_CODE = _error_classes()
_BY_STATUS: dict[int, type[ForkpointError]] = {
    404: errors.NotFound,
    408: errors.CommandTimeout,
    409: errors.Conflict,
}


def error_from_payload(status: int, payload: object) -> ForkpointError:
    """The :mod:`forkpoint.errors` instance an ``{"error": {"code", "message"}}`` names."""
    body = payload.get("error") if isinstance(payload, dict) else None
    code = str(body.get("code", "")) if isinstance(body, dict) else ""
    message = str(body.get("message", "")) if isinstance(body, dict) else ""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        cls = errors.InvalidInput if 400 <= status < 500 else InternalError
    error = cls.__new__(cls)
    # Some classes take structured constructor args; the message says it all already.
    ForkpointError.__init__(error, message or f"HTTP {status}")
    return error


class RemoteBackend(_Shared):
    """Talks to ``forkpoint serve`` at ``unix:/path`` or ``http://127.0.0.1:PORT``."""

    def __init__(self, base_url: str, token: str | None = None) -> None:
        super().__init__()
        self.description = base_url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Reads wait as long as a guest command may run; connecting must be quick.
        timeout = httpx.Timeout(30.0, read=None)
        if base_url.startswith("unix:"):
            transport = httpx.AsyncHTTPTransport(uds=base_url.removeprefix("unix:"))
            self._http = httpx.AsyncClient(
                transport=transport, base_url="http://forkpoint", headers=headers, timeout=timeout
            )
        elif base_url.startswith(("http://", "https://")):
            self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)
        else:
            raise errors.InvalidInput(
                f"base_url must be unix:/path or http://host:port: {base_url}"
            )

    async def _close(self) -> None:
        await self._http.aclose()

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
            ) from None
        if response.status_code >= 400:
            try:
                payload: object = response.json()
            except ValueError:
                payload = None
            raise error_from_payload(response.status_code, payload)
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self._request(method, path, **kwargs)).json()

    async def create(
        self, *, image: str, memory_mib: int, cpus: int, name: str | None,
        ports: Sequence[int], network: str,
    ) -> JSON:  # fmt: skip
        body = {
            "image": image, "memory_mib": memory_mib, "cpus": cpus, "name": name,
            "ports": list(ports), "network": network,
        }  # fmt: skip
        result: JSON = await self._json("POST", "/sessions", json=body)
        return result

    async def get(self, session: str) -> JSON:
        result: JSON = await self._json("GET", f"/sessions/{_seg(session)}")
        return result

    async def list_sessions(self) -> list[JSON]:
        result: list[JSON] = await self._json("GET", "/sessions")
        return result

    async def remove(self, session: str) -> None:
        await self._request("DELETE", f"/sessions/{_seg(session)}")

    async def exec(
        self, session: str, command: str | Sequence[str], *, cwd: str | None,
        env: Mapping[str, str] | None, stdin: bytes | None, timeout: float | None,
    ) -> JSON:  # fmt: skip
        body = {
            "command": command if isinstance(command, str) else list(command), "cwd": cwd,
            "env": dict(env or {}), "timeout": timeout, "output_encoding": "base64",
            "stdin": None if stdin is None else base64.b64encode(stdin).decode(),
            "stdin_encoding": "base64",
        }  # fmt: skip
        result: JSON = await self._json("POST", f"/sessions/{_seg(session)}/exec", json=body)
        result["stdout"] = base64.b64decode(result["stdout"])
        result["stderr"] = base64.b64decode(result["stderr"])
        return result

    async def spawn(
        self, session: str, command: str | Sequence[str], *, cwd: str | None,
        env: Mapping[str, str] | None,
    ) -> JSON:  # fmt: skip
        body = {
            "command": command if isinstance(command, str) else list(command), "cwd": cwd,
            "env": dict(env or {}), "background": True,
        }  # fmt: skip
        result: JSON = await self._json("POST", f"/sessions/{_seg(session)}/exec", json=body)
        return result

    async def ps(self, session: str) -> list[JSON]:
        result: list[JSON] = await self._json("GET", f"/sessions/{_seg(session)}/processes")
        return result

    async def kill_process(self, session: str, pid: int, signal: int | str) -> None:
        path = f"/sessions/{_seg(session)}/processes/{int(pid)}"
        await self._request("DELETE", path, params={"signal": str(signal)})

    async def read_file(self, session: str, path: str) -> bytes:
        url = f"/sessions/{_seg(session)}/files"
        return (await self._request("GET", url, params={"path": path})).content

    async def write_file(self, session: str, path: str, data: bytes, mode: int) -> None:
        url = f"/sessions/{_seg(session)}/files"
        await self._request("PUT", url, content=data, params={"path": path, "mode": mode})

    async def list_files(self, session: str, path: str) -> list[JSON]:
        url = f"/sessions/{_seg(session)}/files/list"
        result: list[JSON] = await self._json("GET", url, params={"path": path})
        return result

    async def remove_file(self, session: str, path: str) -> None:
        await self._request("DELETE", f"/sessions/{_seg(session)}/files", params={"path": path})

    async def forward_port(self, session: str, guest_port: int) -> JSON:
        url = f"/sessions/{_seg(session)}/ports"
        result: JSON = await self._json("POST", url, json={"guest_port": guest_port})
        return result

    async def checkpoint(self, session: str, name: str | None) -> JSON:
        url = f"/sessions/{_seg(session)}/checkpoints"
        result: JSON = await self._json("POST", url, json={"name": name})
        return result

    async def get_checkpoint(self, checkpoint: str) -> JSON:
        result: JSON = await self._json("GET", f"/checkpoints/{_seg(checkpoint)}")
        return result

    async def list_checkpoints(self, session: str | None) -> list[JSON]:
        params = {"session": session} if session else None
        result: list[JSON] = await self._json("GET", "/checkpoints", params=params)
        return result

    async def remove_checkpoint(self, checkpoint: str) -> None:
        await self._request("DELETE", f"/checkpoints/{_seg(checkpoint)}")

    async def fork(self, checkpoint: str, count: int) -> list[JSON | ForkpointError]:
        url = f"/checkpoints/{_seg(checkpoint)}/fork"
        slots: list[JSON] = await self._json("POST", url, json={"count": count})
        return [error_from_payload(500, s) if "error" in s else s for s in slots]

    async def rollback(self, session: str, checkpoint: str | None) -> JSON:
        url = f"/sessions/{_seg(session)}/rollback"
        result: JSON = await self._json("POST", url, json={"checkpoint": checkpoint})
        return result


def _seg(value: str) -> str:
    """A path segment, escaped (ids and names are plain, but never trust that)."""
    from urllib.parse import quote

    return quote(value, safe="")


def connect(
    base_url: str | None = None, token: str | None = None, runtime: Runtime | None = None
) -> Backend:
    """Embedded without ``base_url``; else remote, with ``token`` or ``$FORKPOINT_TOKEN`` or,
    for http URLs, the token file a local ``forkpoint serve --port`` wrote."""
    if base_url is None:
        return EmbeddedBackend(runtime)
    if token is None and base_url.startswith("http"):
        token = os.environ.get("FORKPOINT_TOKEN")
        token_file = home().root / "token"
        if token is None and token_file.is_file():
            token = token_file.read_text().strip()
    return RemoteBackend(base_url, token)
