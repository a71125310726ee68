"""``forkpoint serve --e2b`` (the gateway) and ``forkpoint e2b env``."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from typing import TYPE_CHECKING, Annotated, cast

import typer

from forkpoint.cli.output import err_console, reports_errors

if TYPE_CHECKING:
    from forkpoint.e2b.tables import GatewayTables
    from forkpoint.e2b.tls import LocalCA
    from forkpoint.runtime import Runtime

__all__ = ["DEFAULT_E2B_PORT", "e2b_env", "register", "serve_e2b"]

DEFAULT_E2B_PORT = 3000

e2b_app = typer.Typer(help="Use forkpoint from E2B code (the official `e2b` SDK).")


def register(app: typer.Typer) -> None:
    app.add_typer(e2b_app, name="e2b")


def e2b_env(
    port: int, proxy_port: int | None, token: str, ca: LocalCA | None = None
) -> dict[str, str]:
    """The variables that point the ``e2b`` SDK at ``forkpoint serve --e2b`` and, with
    ``ca``, make Python (ssl, httpx, requests), curl and node trust its sandbox hosts'
    HTTPS: a bundle of the system's CAs plus forkpoint's (node adds to its own)."""
    api = f"http://127.0.0.1:{port}"
    variables = {
        "E2B_API_KEY": token,
        "E2B_API_URL": api,
        "E2B_SANDBOX_URL": api,
        "E2B_DOMAIN": f"localhost:{proxy_port or port + 1}",
    }
    if ca is not None:
        bundle = str(ca.bundle_path)
        variables |= {
            "SSL_CERT_FILE": bundle,
            "REQUESTS_CA_BUNDLE": bundle,
            "CURL_CA_BUNDLE": bundle,
            "NODE_EXTRA_CA_CERTS": str(ca.cert_path),
        }
    return variables


@e2b_app.command("env")
@reports_errors
def env_command(
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="The gateway's port.")] = (
        DEFAULT_E2B_PORT
    ),
    proxy_port: Annotated[
        int | None, typer.Option("--proxy-port", min=1, max=65535, help="Default: port + 1.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the variables as JSON.")] = False,
) -> None:
    """Print `export E2B_…` lines for `eval "$(forkpoint e2b env)"`.

    Also sets SSL_CERT_FILE, REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE to a bundle of the
    system's CAs plus forkpoint's local CA (NODE_EXTRA_CA_CERTS to the CA alone), so
    `https://<port>-<id>.localhost:…` is trusted in that shell only. Makes the API token
    and the CA if this home has none yet (the gateway then uses them)."""
    from forkpoint.config import home
    from forkpoint.e2b.tls import LocalCA
    from forkpoint.server.listen import write_token

    where = home().ensure()
    if not where.token.exists():
        write_token(where.token)
    ca = LocalCA(where.tls).ensure()
    variables = e2b_env(port, proxy_port, where.token.read_text().strip(), ca)
    if as_json:
        sys.stdout.write(json.dumps(variables, indent=2) + "\n")
        return
    for key, value in variables.items():
        sys.stdout.write(f"export {key}={shlex.quote(value)}\n")


def gateway_tables(runtime: Runtime) -> GatewayTables:
    """Where the gateway serving ``runtime`` keeps its rows: on one host in its store; on
    a cluster its sandboxes' in the cluster's store (a revived sandbox keeps its tokens),
    its template builds' in this host's (the caller closes it)."""
    from forkpoint.config import cluster_address
    from forkpoint.e2b.tables import GatewayTables

    if cluster_address() is None:
        return GatewayTables.beside(runtime.store)
    from forkpoint.cluster.records import SandboxEntries
    from forkpoint.cluster.runtime import ClusterRuntime
    from forkpoint.store import Store

    cluster = cast("ClusterRuntime", runtime)
    return GatewayTables(SandboxEntries(cluster.records.store), Store.open(runtime.home))


def serve_e2b(
    *,
    host: str,
    port: int | None,
    proxy_port: int | None,
    timeout_s: int,
    log_level: str,
    template_builds: bool = False,
) -> None:
    """Serve the gateway until interrupted (the caller checked ``host``)."""
    import socket

    from forkpoint.cluster.doors import open_runtime
    from forkpoint.config import cluster_address
    from forkpoint.e2b import GatewayConfig, TokenFile, run_gateway
    from forkpoint.e2b.tls import LocalCA
    from forkpoint.errors import Conflict, InvalidInput
    from forkpoint.server import bind_tcp

    if template_builds and cluster_address() is not None:
        raise InvalidInput(
            "E2B template builds are not available on a cluster yet (a build runs on one "
            "host; every node would need its image): unset FORKPOINT_CLUSTER to build"
        )
    # The API key and the CA exist before the port accepts anyone: a client that connects
    # at once (a test waiting for the port) finds them (`forkpoint e2b env` makes them too).
    runtime = open_runtime()  # with FORKPOINT_CLUSTER set: the cluster's
    tables = gateway_tables(runtime)
    token_path = runtime.home.token
    if not token_path.exists():
        from forkpoint.server import write_token

        write_token(token_path)
    LocalCA(runtime.home.tls).ensure()
    try:
        api_port = DEFAULT_E2B_PORT if port is None else port
        api_socket = bind_tcp(host, api_port)
        api_port = api_socket.getsockname()[1]
        proxy_sockets: list[socket.socket] = [
            bind_tcp(host, proxy_port if proxy_port is not None else api_port + 1)
        ]
        bound_proxy = proxy_sockets[0].getsockname()[1]
        if host == "127.0.0.1":  # *.localhost resolves to 127.0.0.1 and ::1 (myhostname)
            try:
                proxy_sockets.append(bind_tcp("::1", bound_proxy))
            except (Conflict, OSError):
                pass  # no IPv6 here: IPv4 alone serves
        config = GatewayConfig(
            domain=f"localhost:{bound_proxy}", default_timeout_s=timeout_s,
            template_builds=template_builds,
        )  # fmt: skip
        err_console.print(
            f"forkpoint E2B gateway: API + envd on http://{host}:{api_port}, sandbox ports on "
            f"{host}:{bound_proxy} (API key in {token_path}); "
            f'eval "$(forkpoint e2b env --port {api_port} --proxy-port {bound_proxy})"',
            markup=False,
            highlight=False,
        )
        asyncio.run(
            run_gateway(
                runtime, config, api_socket, proxy_sockets, TokenFile(token_path),
                tables=tables, log_level=log_level,
            )
        )  # fmt: skip
    finally:
        tables.templates.close()  # the runtime's own store on one host (closing is idempotent)
        runtime.close()
