"""Where portable checkpoints are kept: an S3-compatible bucket, or one tar archive.

Both hold the same keys under one root: ``blobs/<sha256>`` (RAM packs, device states, disk
layers; each zstd-compressed, named by the sha256 of its stored bytes),
``manifests/<sha256>`` (a checkpoint's portable manifest, named by its own digest) and
``refs/<name>`` (a name: the digest it points at). Objects are immutable, so writing one
that exists is skipped: an interrupted push or pull is simply run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from forkpoint.errors import (
    DamagedCheckpoint,
    InternalError,
    InvalidInput,
    NotConfigured,
    NotFound,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "ObjectStore",
    "S3Store",
    "TarReader",
    "TarWriter",
    "TransferCounter",
    "check_size",
    "sha256_file",
]

_MULTIPART = 64 << 20  # objects larger than this go up in parts (S3 caps one PUT at 5 GiB)
_PART = 16 << 20
_READ = 1 << 20


@dataclass
class TransferCounter:
    """Bytes and objects moved, for the report (and the lineage test)."""

    sent_bytes: int = 0
    received_bytes: int = 0
    sent_objects: int = 0
    skipped_objects: int = 0
    received_objects: int = 0
    keys_received: list[str] = field(default_factory=list)

    def received(self, key: str, size: int) -> None:
        self.received_bytes += size
        self.received_objects += 1
        self.keys_received.append(key)


class ObjectStore(Protocol):
    counter: TransferCounter

    def has(self, key: str) -> bool: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def put_bytes(self, key: str, data: bytes, *, overwrite: bool = False) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def get_file(self, key: str, dest: Path, max_bytes: int | None = None) -> None:
        """Download ``key`` to ``dest``; stop with DamagedCheckpoint past ``max_bytes``."""

    def describe(self) -> str: ...


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_READ):
            digest.update(chunk)
    return digest.hexdigest()


class S3Store:
    """``s3://BUCKET/PREFIX`` through boto3. The endpoint and credentials come from the
    usual AWS variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, …) unless given.
    Path-style addressing: what self-hosted servers (MinIO, localbucket, Ceph) all take."""

    def __init__(self, url: str, endpoint: str | None = None) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise InvalidInput(f"not an S3 URL: {url!r} (expected s3://BUCKET/PREFIX)")
        import boto3
        from botocore.config import Config

        self.url = url
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.counter = TransferCounter()
        if endpoint is not None and not _valid_endpoint(endpoint):
            raise InvalidInput(f"not an S3 endpoint URL: {endpoint!r} (expected http(s)://HOST)")
        self._client: S3Client = boto3.client(
            "s3",
            endpoint_url=endpoint or None,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 5, "mode": "standard"},
                connect_timeout=10,
                read_timeout=120,
                # Checksums on every request only where asked: not every S3-compatible
                # server knows the newer trailing-checksum headers.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def describe(self) -> str:
        return self.url

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def has(self, key: str) -> bool:
        try:
            with _s3_errors(f"HEAD {key}"):
                self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except NotFound:
            return False
        return True

    def put_file(self, key: str, path: Path) -> None:
        if self.has(key):
            self.counter.skipped_objects += 1
            return
        size = path.stat().st_size
        if size > _MULTIPART:
            self._put_multipart(key, path)
        else:
            self.put_bytes(key, path.read_bytes())
            return
        self.counter.sent_bytes += size
        self.counter.sent_objects += 1

    def put_bytes(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        """One PUT; an immutable object is written only if absent (``If-None-Match: *``:
        two pushes racing to write it both succeed, once)."""
        from botocore.exceptions import ClientError

        extra: dict[str, Any] = {} if overwrite else {"IfNoneMatch": "*"}
        try:
            with _s3_errors(f"PUT {key}"):
                try:
                    self._client.put_object(
                        Bucket=self.bucket, Key=self._key(key), Body=data, **extra
                    )
                except ClientError as error:
                    if _status(error) != 412:
                        raise
                    self.counter.skipped_objects += 1
                    return  # written meanwhile: same name, same bytes
        except NotFound:
            raise NotFound(f"no bucket {self.bucket!r} at the S3 endpoint") from None
        self.counter.sent_bytes += len(data)
        self.counter.sent_objects += 1

    def _put_multipart(self, key: str, path: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(key)
        with _s3_errors(f"upload {key}"):
            upload = self._client.create_multipart_upload(Bucket=self.bucket, Key=full)
        upload_id = upload["UploadId"]
        try:
            parts = []
            with path.open("rb") as f:
                number = 1
                while chunk := f.read(_PART):
                    answer = self._client.upload_part(
                        Bucket=self.bucket, Key=full, UploadId=upload_id,
                        PartNumber=number, Body=chunk,
                    )  # fmt: skip
                    parts.append({"ETag": answer["ETag"], "PartNumber": number})
                    number += 1
            self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
            )  # fmt: skip
        except (ClientError, BotoCoreError) as error:
            with contextlib.suppress(ClientError, BotoCoreError):
                self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=full, UploadId=upload_id
                )
            raise _s3_error(error, f"upload {key}") from error

    def get_bytes(self, key: str) -> bytes:
        with _s3_errors(f"GET {key}"):
            answer = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            data = answer["Body"].read()
        self.counter.received(key, len(data))
        return data

    def get_file(self, key: str, dest: Path, max_bytes: int | None = None) -> None:
        with _s3_errors(f"GET {key}"):
            answer = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            size = 0
            with dest.open("wb") as out:
                for chunk in answer["Body"].iter_chunks(_READ):
                    size += len(chunk)
                    check_size(key, size, max_bytes)
                    out.write(chunk)
        self.counter.received(key, size)

    def keys(self, under: str) -> list[str]:
        """Every key under ``under`` (relative to this store's prefix)."""
        found: list[str] = []
        start = len(self._key(""))
        try:
            with _s3_errors(f"LIST {under}"):
                pages = self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self._key(under)
                )
                for page in pages:
                    found += [item["Key"][start:] for item in page.get("Contents", [])]
        except NotFound:  # some servers answer 404 for a prefix nothing was written under
            return []
        return found

    def delete(self, key: str) -> None:
        """Remove ``key`` (mutable records only: blobs and manifests are immutable)."""
        with _s3_errors(f"DELETE {key}"):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))


def check_size(key: str, size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise DamagedCheckpoint(f"object {key} is larger than its manifest says ({max_bytes})")


def _valid_endpoint(endpoint: str) -> bool:
    parsed = urlparse(endpoint)
    return parsed.scheme in ("http", "https") and bool(parsed.netloc) and endpoint.isascii()


def _status(error: Exception) -> int:
    response: dict[str, Any] = getattr(error, "response", {}) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _s3_error(error: Exception, what: str) -> Exception:
    from botocore.exceptions import NoCredentialsError

    if _status(error) == 404:
        return NotFound(f"not in the store: {what.split(' ', 1)[1]}")
    if isinstance(error, NoCredentialsError):
        return NotConfigured(
            "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile)"
        )
    return InternalError(f"S3 {what} failed: {error}")


@contextlib.contextmanager
def _s3_errors(what: str) -> Iterator[None]:
    """botocore's errors as forkpoint's (one line each); 404 is NotFound."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as error:
        raise _s3_error(error, what) from error


class TarWriter:
    """A new tar archive holding the objects of one export (blobs are already compressed,
    so the tar itself is not)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.counter = TransferCounter()
        self._names: set[str] = set()
        self._tar = tarfile.open(path, "w")
        self._closed = False

    def describe(self) -> str:
        return str(self.path)

    def has(self, key: str) -> bool:
        return key in self._names

    def put_file(self, key: str, path: Path) -> None:
        if key in self._names:
            return
        self._tar.add(path, arcname=key, recursive=False, filter=_plain)
        self._sent(key, path.stat().st_size)

    def put_bytes(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        if key in self._names and not overwrite:
            return
        info = _plain(tarfile.TarInfo(key))
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))
        self._sent(key, len(data))

    def _sent(self, key: str, size: int) -> None:
        self._names.add(key)
        self.counter.sent_bytes += size
        self.counter.sent_objects += 1

    def get_bytes(self, key: str) -> bytes:
        raise NotFound(f"{self.path} is being written")

    def get_file(self, key: str, dest: Path, max_bytes: int | None = None) -> None:
        raise NotFound(f"{self.path} is being written")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._tar.close()
        with self.path.open("rb+") as f:
            os.fsync(f.fileno())


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """No owner, no time: the archive says nothing of the host it was made on."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o444
    return info


class TarReader:
    """An archive made by :class:`TarWriter`, read in place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.counter = TransferCounter()
        try:
            self._tar = tarfile.open(path, "r:")
            self._members = {m.name: m for m in self._tar.getmembers() if m.isfile()}
        except (OSError, tarfile.TarError) as error:
            raise InvalidInput(f"not a forkpoint checkpoint archive: {path} ({error})") from error

    def describe(self) -> str:
        return str(self.path)

    def has(self, key: str) -> bool:
        return key in self._members

    def put_file(self, key: str, path: Path) -> None:
        raise InvalidInput(f"{self.path} is read-only")

    def put_bytes(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        raise InvalidInput(f"{self.path} is read-only")

    def _open(self, key: str) -> io.BufferedReader:
        member = self._members.get(key)
        f = self._tar.extractfile(member) if member is not None else None
        if f is None:
            raise NotFound(f"not in {self.path.name}: {key}")
        return f  # type: ignore[return-value]

    def read_at(self, key: str, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of ``key`` from ``offset`` (b"" past its end), uncounted:
        a node serving its export to another (``cluster/transfer.py``)."""
        member = self._open(key)
        member.seek(offset)
        return member.read(size)

    def get_bytes(self, key: str) -> bytes:
        data = self._open(key).read()
        self.counter.received(key, len(data))
        return data

    def get_file(self, key: str, dest: Path, max_bytes: int | None = None) -> None:
        src = self._open(key)
        size = 0
        with dest.open("wb") as out:
            while chunk := src.read(_READ):
                size += len(chunk)
                check_size(key, size, max_bytes)
                out.write(chunk)
        self.counter.received(key, size)

    def close(self) -> None:
        self._tar.close()
