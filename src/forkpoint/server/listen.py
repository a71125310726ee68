"""Where the API listens: a private unix socket (default) or loopback TCP with a token.

uvicorn chmods a unix socket it creates itself to 0666, so the socket is bound here
(under a 0177 umask, then checked) and handed to uvicorn already listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import stat
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from forkpoint.errors import Conflict, InvalidInput
from forkpoint.threads import use_fan_out_pool

__all__ = [
    "bind_tcp",
    "bind_unix",
    "is_loopback",
    "serve_on",
    "write_token",
]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any 127.0.0.0/8 or ::1 address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_unix(path: Path) -> socket.socket:
    """A listening unix socket at ``path`` that only this user can use (mode 0600).

    :raises Conflict: another server is already listening there.
    :raises InvalidInput: the path exists and is not a socket.
    """
    if len(os.fsencode(path)) >= 108:
        raise InvalidInput(f"socket path too long for a unix socket: {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise InvalidInput(f"{path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # stale: its server is gone
            else:
                raise Conflict(f"a server is already listening on {path}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # never exists with looser permissions, not even briefly
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    try:
        os.chmod(path, 0o600)
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode != 0o600:
            raise Conflict(f"could not make {path} private (mode {mode:o})")
        sock.listen(128)
    except BaseException:
        sock.close()
        path.unlink(missing_ok=True)
        raise
    return sock


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise Conflict(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock


def write_token(path: Path) -> str:
    """Generate a new bearer token and store it at ``path`` (mode 0600, atomically)."""
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token


def serve_on(
    app: FastAPI,
    sock: socket.socket,
    *,
    log_level: str = "warning",
    beside: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Serve ``app`` on an already listening socket until SIGINT/SIGTERM; ``beside`` (e.g.
    the session reaper) runs in the same event loop meanwhile."""
    config = uvicorn.Config(app, log_level=log_level, lifespan="off", access_log=False)
    server = uvicorn.Server(config)

    async def serve() -> None:
        use_fan_out_pool()
        task = asyncio.create_task(beside()) if beside is not None else None
        try:
            await server.serve(sockets=[sock])
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # uvicorn shuts down gracefully on SIGTERM, then re-raises it against the handler
    # that was there before: make that one an exception so callers' cleanup runs.
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        asyncio.run(serve())
    finally:
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(OSError):
            sock.close()


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
