"""A real S3-compatible server for tests: ``localbucket`` (a test dependency) on 127.0.0.1,
on a free port, storing its buckets as folders under a temp directory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    data: Path  # DATA_ROOT: bucket/key is the file data/bucket/key
    bucket: str

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def objects(self, prefix: str) -> dict[str, int]:
        """Every object under ``prefix`` and its size, as the server stores it."""
        root = self.data / self.bucket / prefix
        return {
            str(p.relative_to(root)): p.stat().st_size
            for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def s3_server(data: Path, bucket: str = "forkpoint") -> Iterator[S3Server]:
    """Start localbucket, make ``bucket``, point the AWS variables at it; stop it after."""
    data.mkdir(parents=True, exist_ok=True)
    port = _free_port()
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
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
        AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("localbucket did not start") from None
                time.sleep(0.05)
        client = boto3.client(
            "s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"})
        )
        client.create_bucket(Bucket=bucket)
        yield S3Server(endpoint=endpoint, data=data, bucket=bucket)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
