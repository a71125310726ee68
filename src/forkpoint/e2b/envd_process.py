"""envd's ``process.Process`` service on forkpoint's guest process model.

Start and Connect stream the process's events (start with its pid first, output,
keepalives in silences, end); closing the stream does not kill the process; the
``Connect-Timeout-Ms`` deadline bounds the process's life, as in envd. The runtime's
``start_process``/``attach_process`` keep the process and its exit status in the guest.
"""

from __future__ import annotations

import base64
import signal as signals
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from forkpoint.errors import ForkpointError, NotFound
from forkpoint.models import PtySize

from .connect import (
    ConnectError,
    Keepalive,
    end_stream,
    envelope,
    read_envelopes,
    with_keepalives,
)
from .context import EnvdCall, connect_error
from .files import guest_path

if TYPE_CHECKING:
    from forkpoint.models import ProcessEvent, TrackedProcess

__all__ = ["UNARY", "stream_input", "streaming"]

DEFAULT_KEEPALIVE_S = 50.0


def _pid_of(message: dict[str, Any]) -> int | None:
    selector = message.get("process") or {}
    if not isinstance(selector, dict):
        raise ConnectError("invalid_argument", "process must be an object")
    pid = selector.get("pid")
    if pid is None:
        return None
    try:
        return int(pid)
    except (TypeError, ValueError):
        raise ConnectError("invalid_argument", f"bad pid {pid!r}") from None


async def _select(call: EnvdCall, message: dict[str, Any]) -> int:
    """The pid named by a ``ProcessSelector`` (``pid`` or ``tag``)."""
    pid = _pid_of(message)
    if pid is not None:
        return pid
    tag = (message.get("process") or {}).get("tag")
    if not tag:
        raise ConnectError("invalid_argument", "a process selector needs a pid or a tag")
    for process in await call.runtime.list_processes(call.sandbox_id):
        if process.tag == tag and process.running:
            return process.pid
    raise ConnectError("not_found", f"process with tag {tag!r} not found")


def _event(event: ProcessEvent) -> dict[str, Any]:
    if event.kind == "start":
        return {"event": {"start": {"pid": event.pid}}}
    if event.kind in ("stdout", "stderr", "pty"):
        return {"event": {"data": {event.kind: base64.b64encode(event.data).decode()}}}
    end: dict[str, Any] = {"exited": event.signal is None}
    if event.signal is not None:
        name = _signal_name(event.signal)
        end |= {"exitCode": -1, "status": f"signal: {name}"}
    else:
        code = event.exit_code or 0
        end |= {"exitCode": code, "status": f"exit status {code}"}
        if code:
            end["error"] = f"exit status {code}"
    if event.error:
        end["error"] = event.error
    return {"event": {"end": end}}


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name.removeprefix("SIG").lower()
    except ValueError:
        return str(number)


def _stream_error(sandbox_id: str, error: BaseException) -> ConnectError:
    """How a started stream ends on ``error``: a sandbox removed (killed) meanwhile is
    envd's ``unavailable`` "ended before the stream completed" — the SDK then probes the
    sandbox and tells its user it was killed."""
    if isinstance(error, NotFound):
        return ConnectError(
            "unavailable", f"the connection to sandbox {sandbox_id} ended before the stream "
            "completed",
        )  # fmt: skip
    return connect_error(error)


async def _pump(
    events: AsyncIterator[ProcessEvent],
    keepalive_s: float,
    first: ProcessEvent,
    sandbox_id: str,
    deadline_s: float | None = None,
) -> AsyncIterator[bytes]:
    """Envelopes for ``events``, with a keepalive after each ``keepalive_s`` of silence;
    when the client goes away the iterator is closed (the process goes on)."""
    yield envelope(_event(first))
    started = time.monotonic()
    try:
        async for item in with_keepalives(events, keepalive_s):
            if isinstance(item, Keepalive):
                yield envelope({"event": {"keepalive": {}}})
            elif _killed_at_deadline(item, started, deadline_s):
                # envd ends the stream with the deadline, not with the kill it caused.
                yield end_stream(ConnectError("deadline_exceeded", "context deadline exceeded"))
                return
            else:
                yield envelope(_event(item))
    except Exception as error:  # reported in the end-stream envelope
        yield end_stream(_stream_error(sandbox_id, error))
        return
    yield end_stream()


def _killed_at_deadline(event: ProcessEvent, started: float, deadline_s: float | None) -> bool:
    """A Start's process killed by its ``Connect-Timeout-Ms`` (the guest enforces it)."""
    return (
        event.kind == "end"
        and event.signal is not None
        and deadline_s is not None
        and time.monotonic() - started >= deadline_s - 0.05
    )


async def streaming(call: EnvdCall, method: str, message: dict[str, Any]) -> AsyncIterator[bytes]:
    """The response of a server-streaming call; errors before the first event raise
    :class:`ConnectError` (sent as a unary-style error)."""
    keepalive = call.keepalive_s or DEFAULT_KEEPALIVE_S
    if method == "Start":
        events = await _start(call, message)
    elif method == "Connect":
        pid = await _select(call, message)
        events = call.runtime.attach_process(call.sandbox_id, pid)
    else:
        raise ConnectError("unimplemented", f"process.Process/{method} is not a stream")
    try:
        first = await anext(aiter(events))
    except StopAsyncIteration:
        raise ConnectError("internal", "the process ended without a start event") from None
    except NotFound as error:
        if method == "Start":  # a missing cwd or executable: envd says invalid_argument
            raise ConnectError("invalid_argument", error.message) from None
        raise connect_error(error) from None
    except ForkpointError as error:
        raise connect_error(error) from None
    deadline = call.deadline_s if method == "Start" else None
    return _pump(events, keepalive, first, call.sandbox_id, deadline)


async def _start(call: EnvdCall, message: dict[str, Any]) -> AsyncIterator[ProcessEvent]:
    config = message.get("process")
    if not isinstance(config, dict) or not config.get("cmd"):
        raise ConnectError("invalid_argument", "process.cmd is required")
    pty = message.get("pty")
    args = config.get("args") or []
    envs = config.get("envs") or {}
    if not isinstance(args, list) or not isinstance(envs, dict):
        raise ConnectError("invalid_argument", "process.args must be a list, envs an object")
    env = {**call.sandbox.record.env_vars, **{str(k): str(v) for k, v in envs.items()}}
    return call.runtime.start_process(
        call.sandbox_id, str(config["cmd"]), tuple(str(a) for a in args),
        cwd=guest_path(str(config["cwd"]), call.user) if config.get("cwd") else None, env=env,
        user=call.user,
        stdin=bool(message.get("stdin", False)), tag=message.get("tag") or None,
        timeout=call.deadline_s, pty=_pty_size(pty) if pty else None,
    )  # fmt: skip


def _pty_size(pty: object) -> PtySize:
    """A ``PTY`` message's ``size`` (``{"cols": 80, "rows": 24}``)."""
    size = pty.get("size") if isinstance(pty, dict) else None
    if not isinstance(size, dict):
        raise ConnectError("invalid_argument", "pty.size must be an object")
    try:
        return PtySize(int(size.get("cols", 0)), int(size.get("rows", 0)))
    except (TypeError, ValueError) as error:
        raise ConnectError("invalid_argument", f"bad pty.size: {error}") from None


def _process_json(process: TrackedProcess) -> dict[str, Any]:
    out: dict[str, Any] = {
        "config": {
            "cmd": process.cmd, "args": list(process.args), "envs": dict(process.env),
            "cwd": process.cwd,
        },
        "pid": process.pid,
    }  # fmt: skip
    if process.tag:
        out["tag"] = process.tag
    return out


async def _list(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    processes = await call.runtime.list_processes(call.sandbox_id)
    return {"processes": [_process_json(p) for p in processes if p.running]}


_SIGNALS = {"SIGNAL_SIGKILL": signals.SIGKILL, "SIGNAL_SIGTERM": signals.SIGTERM}


async def _send_signal(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    pid = await _select(call, message)
    name = message.get("signal", "SIGNAL_SIGKILL")
    if name not in _SIGNALS:
        raise ConnectError("invalid_argument", f"unsupported signal {name!r}")
    await call.runtime.signal_process(call.sandbox_id, pid, int(_SIGNALS[name]))
    return {}


def _stdin_of(message: dict[str, Any]) -> bytes:
    """``ProcessInput``: ``stdin`` bytes, or ``pty`` bytes typed into a PTY (the agent
    writes either where the process reads)."""
    data = message.get("input") or {}
    kind = "pty" if "pty" in data else "stdin"
    try:
        return base64.b64decode(data.get(kind, ""), validate=True)
    except ValueError:
        raise ConnectError("invalid_argument", f"input.{kind} must be base64") from None


async def _send_input(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    pid = await _select(call, message)
    await call.runtime.send_stdin(call.sandbox_id, pid, _stdin_of(message))
    return {}


async def _close_stdin(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    await call.runtime.close_stdin(call.sandbox_id, await _select(call, message))
    return {}


async def _update(call: EnvdCall, message: dict[str, Any]) -> dict[str, Any]:
    """``Update``: a PTY's new window size."""
    pid = await _select(call, message)
    pty = message.get("pty")
    if not pty:
        return {}
    await call.runtime.resize_process(call.sandbox_id, pid, _pty_size(pty))
    return {}


UNARY = {
    "List": _list,
    "SendSignal": _send_signal,
    "SendInput": _send_input,
    "CloseStdin": _close_stdin,
    "Update": _update,
}


async def stream_input(call: EnvdCall, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``StreamInput``: a start envelope naming the process, then data and keepalives,
    each written to its stdin as it arrives."""
    pid: int | None = None
    try:
        async for message in read_envelopes(body):
            if "start" in message:
                pid = await _select(call, message["start"] or {})
            elif "data" in message:
                if pid is None:
                    raise ConnectError("invalid_argument", "StreamInput: data before start")
                data = _stdin_of(message["data"] or {})
                await call.runtime.send_stdin(call.sandbox_id, pid, data)
    except (ConnectError, ForkpointError) as error:
        yield end_stream(connect_error(error))
        return
    yield envelope({})
    yield end_stream()
