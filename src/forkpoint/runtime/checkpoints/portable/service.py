"""The four operations as the runtime offers them (blocking; it runs them in a thread)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from forkpoint.errors import InvalidInput
from forkpoint.models import Checkpoint
from forkpoint.models.portable import CheckpointTransfer, TransferKind
from forkpoint.runtime.checkpoints.portable.common import EXPORT_REF, Local, Progress
from forkpoint.runtime.checkpoints.portable.objects import (
    ObjectStore,
    S3Store,
    TarReader,
    TarWriter,
)
from forkpoint.runtime.checkpoints.portable.pull import Puller
from forkpoint.runtime.checkpoints.portable.push import Pusher
from forkpoint.store import CheckpointRecord
from forkpoint.store.locks import global_lock

__all__ = ["export_checkpoint", "import_checkpoint", "pull_checkpoint", "push_checkpoint"]

_PULL_LOCK_S = 3600.0  # one pull at a time per home; a big one may take long

CheckpointOf = Callable[[CheckpointRecord], Checkpoint]


def push_checkpoint(
    local: Local, checkpoint_of: CheckpointOf, checkpoint: str, to: str,
    endpoint: str | None, progress: Progress,
) -> CheckpointTransfer:  # fmt: skip
    started = time.perf_counter()
    objects = S3Store(to, endpoint)
    record, digest = Pusher(local, objects, progress).push(checkpoint)
    return _result(TransferKind.PUSH, checkpoint_of(record), digest, objects, started)


def pull_checkpoint(
    local: Local, checkpoint_of: CheckpointOf, ref: str, source: str | ObjectStore,
    endpoint: str | None, progress: Progress,
) -> CheckpointTransfer:  # fmt: skip
    """From an S3 URL, or any object store (a cluster node's export)."""
    started = time.perf_counter()
    objects = S3Store(source, endpoint) if isinstance(source, str) else source
    with global_lock(local.home, "pull", timeout_s=_PULL_LOCK_S):
        checkpoint_id, digest = Puller(local, objects, progress).pull(ref)
    record = local.store.get_checkpoint(checkpoint_id)
    return _result(TransferKind.PULL, checkpoint_of(record), digest, objects, started)


def export_checkpoint(
    local: Local, checkpoint_of: CheckpointOf, checkpoint: str, path: Path, progress: Progress
) -> CheckpointTransfer:
    """One archive with the checkpoint and its whole lineage, written aside and renamed."""
    started = time.perf_counter()
    if path.is_dir():
        raise InvalidInput(f"{path} is a directory: name the archive file")
    if not path.parent.is_dir():
        raise InvalidInput(f"no directory {path.parent} to write {path.name} into")
    part = path.with_name(f".{path.name}.part")
    writer = TarWriter(part)
    try:
        record, digest = Pusher(local, writer, progress).push(checkpoint)
        writer.put_bytes(EXPORT_REF, f"sha256:{digest}\n".encode(), overwrite=True)
        writer.close()
        part.rename(path)
    except BaseException:
        writer.close()
        part.unlink(missing_ok=True)
        raise
    return _result(TransferKind.EXPORT, checkpoint_of(record), digest, writer, started, path)


def import_checkpoint(
    local: Local, checkpoint_of: CheckpointOf, path: Path, progress: Progress
) -> CheckpointTransfer:
    started = time.perf_counter()
    if not path.is_file():
        raise InvalidInput(f"no archive file {path}")
    reader = TarReader(path)
    try:
        with global_lock(local.home, "pull", timeout_s=_PULL_LOCK_S):
            checkpoint_id, digest = Puller(local, reader, progress).pull(EXPORT_REF)
    finally:
        reader.close()
    record = local.store.get_checkpoint(checkpoint_id)
    return _result(TransferKind.IMPORT, checkpoint_of(record), digest, reader, started, path)


def _result(
    kind: TransferKind, checkpoint: Checkpoint, digest: str, objects: ObjectStore,
    started: float, location: Path | None = None,
) -> CheckpointTransfer:  # fmt: skip
    c = objects.counter
    return CheckpointTransfer(
        kind=kind, checkpoint=checkpoint, digest=f"sha256:{digest}",
        location=str(location) if location is not None else objects.describe(),
        sent_bytes=c.sent_bytes, received_bytes=c.received_bytes,
        sent_objects=c.sent_objects, skipped_objects=c.skipped_objects,
        received_objects=c.received_objects,
        duration_ms=(time.perf_counter() - started) * 1000,
    )  # fmt: skip
