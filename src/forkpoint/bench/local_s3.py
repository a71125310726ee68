"""A ``localbucket`` S3 server on 127.0.0.1 (a development dependency), for the bench's
push/pull rows and the tests: a real S3 wire protocol with nothing to set up."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["local_s3"]

_AWS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


@contextlib.contextmanager
def local_s3(data: Path, bucket: str) -> Iterator[str]:
    """localbucket on a free loopback port storing under ``data``, with ``bucket`` made
    (a folder of ``data``); the AWS variables point at it while it runs (it checks no
    credentials, but requests are signed). Yields the endpoint URL."""
    (data / bucket).mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, localbucket; sys.exit(localbucket.main())",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            str(data),
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = {key: os.environ.get(key) for key in _AWS}
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="local", AWS_SECRET_ACCESS_KEY="local",
        AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    try:
        _wait_listening(port, proc)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("localbucket did not start")
        time.sleep(0.05)
