"""A TCP stream to a port of a sandbox, for both ways in (``proxy.py`` on Q, ``port_router.py``
on P): the sandbox reached as E2B's proxy reaches it (traffic token, auto-resume), then a
tunnel over its agent."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from forkpoint.errors import ForkpointError, NotFound

from .sandboxes import Sandboxes, TrafficDenied

__all__ = ["PortStream", "PortUnavailable", "sandbox_port"]


@dataclass(frozen=True)
class PortStream:
    """A connection to a sandbox's port; ``host``: the Host header a request on it must
    carry (the sandbox's ``maskRequestHost``), None: the client's own."""

    reader: Any
    writer: Any
    host: str | None


class PortUnavailable(Exception):
    """Why a request cannot reach a sandbox port: ``status`` (403, 502) and E2B's words
    (the SDK reads "was not found" as killed, "port is not open" as unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@contextlib.asynccontextmanager
async def sandbox_port(
    sandboxes: Sandboxes, sandbox_id: str, port: int, traffic_token: str | None
) -> AsyncIterator[PortStream]:
    """A connection to ``port`` in the sandbox.

    :raises PortUnavailable: unknown or paused sandbox, a missing traffic token, a failed
        auto-resume, nothing listening.
    """
    try:
        sandbox = await sandboxes.reach(sandbox_id, traffic_token)
    except NotFound:
        raise PortUnavailable(502, f"The sandbox {sandbox_id} was not found") from None
    except TrafficDenied as denied:
        raise PortUnavailable(403, denied.message) from None
    except ForkpointError as error:  # e.g. its auto-resume failed
        raise PortUnavailable(502, f"The sandbox {sandbox_id} could not resume: {error}") from None
    try:
        tunnel = sandboxes.runtime.tcp_tunnel(sandbox.id, port)
        pair = await tunnel.__aenter__()
    except ForkpointError as error:
        message = f"The sandbox {sandbox_id} is running but port is not open: {error.message}"
        raise PortUnavailable(502, message) from None
    mask = sandbox.record.host_mask
    try:
        yield PortStream(*pair, None if mask is None else mask.replace("${PORT}", str(port)))
    finally:
        with contextlib.suppress(Exception):
            await tunnel.__aexit__(None, None, None)
