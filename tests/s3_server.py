"""A real S3-compatible server for tests: ``localbucket`` (a test dependency) on 127.0.0.1,
on a free port, storing its buckets as folders under a temp directory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from forkpoint.bench.local_s3 import local_s3


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


@contextmanager
def s3_server(data: Path, bucket: str = "forkpoint") -> Iterator[S3Server]:
    """Start localbucket with ``bucket``, the AWS variables pointing at it; stop it after."""
    data.mkdir(parents=True, exist_ok=True)
    with local_s3(data, bucket) as endpoint:
        yield S3Server(endpoint=endpoint, data=data, bucket=bucket)
