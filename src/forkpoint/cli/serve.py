"""``forkpoint serve [--socket PATH | --port N]`` and ``forkpoint mcp``."""

from __future__ import annotations

import secrets
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from forkpoint.cli.output import err_console, reports_errors
from forkpoint.errors import InvalidInput

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
    app.command("mcp")(mcp_command)


@reports_errors
def serve_command(
    socket_path: Annotated[
        Path | None,
        typer.Option("--socket", help="Unix socket (default $FORKPOINT_HOME/forkpoint.sock)."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", min=0, max=65535, help="TCP port (needs a bearer token)."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="TCP address (loopback only).")] = "127.0.0.1",
    allow_remote: Annotated[
        bool,
        typer.Option("--allow-remote", help="Allow a non-loopback --host."),
    ] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
    e2b: Annotated[
        bool,
        typer.Option("--e2b", help="Serve the E2B API instead (default port 3000; see README)."),
    ] = False,
    proxy_port: Annotated[
        int | None,
        typer.Option("--proxy-port", min=0, max=65535, help="With --e2b: sandbox ports (P+1)."),
    ] = None,
    e2b_timeout: Annotated[
        int,
        typer.Option("--e2b-timeout", min=1, help="With --e2b: default sandbox timeout (s)."),
    ] = 300,
    template_builds: Annotated[
        bool,
        typer.Option(
            "--template-builds",
            help="With --e2b: serve E2B's template builds. Their steps run as root on this "
            "host (podman, chroot isolation), so the API key then grants that.",
        ),
    ] = False,
) -> None:
    """Serve the REST API (/v1, OpenAPI at /v1/openapi.json) until interrupted.

    By default on a private unix socket (mode 0600). With --port: on 127.0.0.1, every
    request needs the bearer token written to $FORKPOINT_HOME/token (printed once).
    """
    from forkpoint.cluster.doors import open_runtime
    from forkpoint.runtime.housekeeping.reaper import reap_forever
    from forkpoint.server import bind_tcp, bind_unix, create_app, is_loopback, serve_on, write_token

    if socket_path is not None and port is not None:
        raise InvalidInput("use either --socket or --port, not both")
    if not is_loopback(host) and not allow_remote:
        raise InvalidInput(
            f"refusing to listen on non-loopback address {host}; pass --allow-remote to expose "
            "the API beyond this machine (it stays token-protected)"
        )
    if e2b:
        from forkpoint.cli.e2b import serve_e2b

        if socket_path is not None:
            raise InvalidInput("--e2b serves on TCP: use --port, not --socket")
        signal.signal(signal.SIGTERM, raise_exit)
        serve_e2b(
            host=host, port=port, proxy_port=proxy_port, timeout_s=e2b_timeout,
            log_level=log_level, template_builds=template_builds,
        )  # fmt: skip
        return
    if proxy_port is not None or template_builds:
        raise InvalidInput("--proxy-port and --template-builds apply to --e2b only")
    if port is None and host != "127.0.0.1":
        raise InvalidInput("--host applies to --port only")
    # From here on SIGTERM unwinds (finally blocks run): the socket file gets removed.
    signal.signal(signal.SIGTERM, raise_exit)
    runtime = open_runtime()  # with FORKPOINT_CLUSTER set: the cluster's

    def reaper() -> Coroutine[Any, Any, None]:  # lifetimes and log caps, every second
        return reap_forever(runtime)

    try:
        if port is None:
            path = (socket_path or runtime.home.root / "forkpoint.sock").absolute()
            sock = bind_unix(path)
            try:
                err_console.print(f"forkpoint API on unix:{path}", markup=False, highlight=False)
                serve_on(create_app(runtime), sock, log_level=log_level, beside=reaper)
            finally:
                path.unlink(missing_ok=True)
        else:
            sock = bind_tcp(host, port)
            bound = sock.getsockname()[1]
            token_path = runtime.home.token
            token = write_token(token_path)
            err_console.print(
                f"forkpoint API on http://{host}:{bound} (bearer token in {token_path})",
                markup=False,
                highlight=False,
            )
            login = secrets.token_urlsafe(24)  # the web page's one-time login
            sys.stdout.write(f"token: {token}\n")  # printed once; also in the token file
            sys.stdout.write(f"page: http://{host}:{bound}/ui/login?token={login}\n")
            sys.stdout.flush()
            app = create_app(runtime, token=token, login_token=login)
            serve_on(app, sock, log_level=log_level, beside=reaper)
    finally:
        runtime.close()


def raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@reports_errors
def mcp_command() -> None:
    """Serve forkpoint's tools over MCP (stdio transport) for an agent to use."""
    from forkpoint.cluster.doors import open_runtime
    from forkpoint.mcp import run_stdio

    runtime = open_runtime()  # with FORKPOINT_CLUSTER set: the cluster's
    try:
        run_stdio(runtime)
    finally:
        runtime.close()
