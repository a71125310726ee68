"""A running ``forkpoint serve --e2b`` for tests (a subprocess, as a user runs it), and
the E2B environment that points the real ``e2b`` SDK at it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from forkpoint.config import home


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Gateway:
    port: int
    proxy_port: int
    api_key: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What ``eval "$(forkpoint e2b env)"`` sets (the CA files: the gateway made them)."""
        tls = home().tls
        return {
            "E2B_API_KEY": self.api_key,
            "E2B_API_URL": self.url,
            "E2B_SANDBOX_URL": self.url,
            "E2B_DOMAIN": f"localhost:{self.proxy_port}",
            "SSL_CERT_FILE": str(tls / "bundle.pem"),
            "REQUESTS_CA_BUNDLE": str(tls / "bundle.pem"),
            "CURL_CA_BUNDLE": str(tls / "bundle.pem"),
            "NODE_EXTRA_CA_CERTS": str(tls / "ca.pem"),
        }


@contextmanager
def running_gateway(*extra: str) -> Iterator[Gateway]:
    """Start the gateway, export the E2B variables while it runs, stop it afterwards."""
    port, proxy_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "forkpoint.cli.app", "serve", "--e2b", "--port", str(port),
         "--proxy-port", str(proxy_port), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"the E2B gateway did not start: {err}") from None
                time.sleep(0.1)
        gateway = Gateway(port, proxy_port, home().token.read_text().strip())
        saved = {k: os.environ.get(k) for k in gateway.env}
        os.environ.update(gateway.env)
        try:
            yield gateway
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
