"""``forkpoint ui``: the web page on 127.0.0.1, with a one-time login URL (like Jupyter)."""

from __future__ import annotations

import secrets
import signal
import sys
from typing import Annotated

import typer

from forkpoint.cli.output import err_console, reports_errors

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("ui")(ui_command)


@reports_errors
def ui_command(
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port (0: any).")] = 0,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
) -> None:
    """Serve the web page (sessions, lineage tree, diffs, checkpoint/fork/rollback buttons)
    and the API on 127.0.0.1; prints a login URL that works once."""
    from forkpoint.cli.serve import raise_exit
    from forkpoint.cluster.doors import open_runtime
    from forkpoint.server import bind_tcp, create_app, serve_on, write_token

    signal.signal(signal.SIGTERM, raise_exit)
    runtime = open_runtime()  # with FORKPOINT_CLUSTER set: the cluster's
    try:
        sock = bind_tcp("127.0.0.1", port)
        bound = sock.getsockname()[1]
        token = write_token(runtime.home.token)
        login = secrets.token_urlsafe(24)
        err_console.print(
            f"forkpoint page and API on http://127.0.0.1:{bound} (bearer token in "
            f"{runtime.home.token}); open the login URL once:",
            markup=False,
            highlight=False,
        )
        sys.stdout.write(f"http://127.0.0.1:{bound}/ui/login?token={login}\n")
        sys.stdout.flush()
        serve_on(create_app(runtime, token=token, login_token=login), sock, log_level=log_level)
    finally:
        runtime.close()
