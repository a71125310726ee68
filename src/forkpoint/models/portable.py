"""What a push, pull, export or import did, and what a checkpoint's verification found.
Part of :mod:`forkpoint.models` (import it from there)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from forkpoint.models import Checkpoint

__all__ = ["CheckpointTransfer", "FileCheck", "TransferKind"]


class TransferKind(StrEnum):
    PUSH = "push"
    PULL = "pull"
    EXPORT = "export"
    IMPORT = "import"


@dataclass(frozen=True)
class CheckpointTransfer:
    """One checkpoint moved to or from a store (``location``: ``s3://…`` or an archive).

    ``digest``: its portable identity (sha256 of its portable manifest; pull it by this or
    by a ref). ``sent_bytes``/``received_bytes`` count object bytes moved (compressed), not
    the RAM size; objects the store already had are ``skipped_objects``.
    """

    kind: TransferKind
    checkpoint: Checkpoint
    digest: str
    location: str
    sent_bytes: int
    received_bytes: int
    sent_objects: int
    skipped_objects: int
    received_objects: int
    duration_ms: float


@dataclass(frozen=True)
class FileCheck:
    """One file of a verified checkpoint against its manifest: ``ok``, or its ``problem``;
    ``hashed``: its bytes were read (else only its size was checked); ``ms`` it took."""

    name: str
    size: int
    ok: bool
    problem: str | None
    hashed: bool
    ms: float
