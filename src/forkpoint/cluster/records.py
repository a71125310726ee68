"""What the cluster knows of every session and checkpoint, kept in its S3 store.

A node's own store is the truth about what runs there; these records are what survives
the node: where a session ran, the placement-group bundle Ray reserved for it, the
checkpoint it would be revived from. They live in the store (``cluster/sessions/<id>``,
``cluster/checkpoints/<id>``), not in Ray's head, so neither a node's nor the head's loss
loses them. The E2B gateway's row of a sandbox (``cluster/e2b/<id>``: its tokens,
metadata, template) lives there too, so a revived sandbox keeps them; it goes with its
session's record.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from forkpoint.errors import NotFound
from forkpoint.runtime.checkpoints.portable.objects import S3Store
from forkpoint.store.e2b import E2bSandboxRecord

__all__ = ["CheckpointEntry", "Records", "SandboxEntries", "SessionEntry"]

_SESSIONS = "cluster/sessions/"
_CHECKPOINTS = "cluster/checkpoints/"
_SANDBOXES = "cluster/e2b/"


@dataclass(frozen=True)
class SessionEntry:
    id: str
    name: str | None
    node: str  # Ray node id
    group: str  # its placement group's name
    bundle: int  # its bundle in that group
    image: str
    created_at: str
    memory_mib: int
    cpus: int
    #: What it would be revived from: its latest checkpoint in the store, else the
    #: checkpoint it started from (None: created from an image, nothing pushed yet).
    revive_from: str | None = None
    #: Its node's forkpoint name: the node rejoining under a new Ray id finds it by this.
    node_name: str = ""

    def moved(self, node: str, node_name: str) -> SessionEntry:
        return replace(self, node=node, node_name=node_name)


@dataclass(frozen=True)
class CheckpointEntry:
    id: str
    name: str | None
    node: str  # where it was taken
    memory_mib: int
    cpus: int
    pushed: bool  # in the store: any node can restore it
    qemu: str | None = None  # the QEMU build that took it (restores only under it)


class Records:
    def __init__(self, store: S3Store) -> None:
        self.store = store

    def put_session(self, entry: SessionEntry) -> None:
        self.store.put_bytes(_SESSIONS + entry.id, _encode(entry), overwrite=True)

    def sessions(self) -> list[SessionEntry]:
        return [SessionEntry(**fields) for fields in _all(self.store, _SESSIONS)]

    def session(self, ref: str) -> SessionEntry:
        """By id or name. :raises NotFound:"""
        for entry in self.sessions():
            if ref in (entry.id, entry.name):
                return entry
        raise NotFound(f"no session {ref!r} in the cluster")

    def drop_session(self, session_id: str) -> None:
        self.store.delete(_SESSIONS + session_id)
        self.store.delete(_SANDBOXES + session_id)  # an E2B sandbox's row goes with it

    def put_checkpoint(self, entry: CheckpointEntry) -> None:
        self.store.put_bytes(_CHECKPOINTS + entry.id, _encode(entry), overwrite=True)

    def checkpoints(self) -> list[CheckpointEntry]:
        return [CheckpointEntry(**fields) for fields in _all(self.store, _CHECKPOINTS)]

    def checkpoint(self, ref: str) -> CheckpointEntry:
        """By id (one GET) or name. :raises NotFound:"""
        if self.store.has(_CHECKPOINTS + ref):
            return CheckpointEntry(**json.loads(self.store.get_bytes(_CHECKPOINTS + ref)))
        for entry in self.checkpoints():
            if entry.name == ref:
                return entry
        raise NotFound(f"no checkpoint {ref!r} in the cluster")

    def drop_checkpoint(self, checkpoint_id: str) -> None:
        self.store.delete(_CHECKPOINTS + checkpoint_id)


class SandboxEntries:
    """The E2B gateway's sandbox rows on a cluster (its ``SandboxRecords``)."""

    def __init__(self, store: S3Store) -> None:
        self.store = store

    def insert(self, record: E2bSandboxRecord) -> E2bSandboxRecord:
        self.store.put_bytes(_SANDBOXES + record.session_id, _encode(record))
        return record

    def get(self, session_id: str) -> E2bSandboxRecord:
        """:raises NotFound:"""
        try:
            return E2bSandboxRecord(**json.loads(self.store.get_bytes(_SANDBOXES + session_id)))
        except NotFound:
            raise NotFound(f"sandbox {session_id} not found") from None

    def list(self) -> list[E2bSandboxRecord]:
        found = [E2bSandboxRecord(**fields) for fields in _all(self.store, _SANDBOXES)]
        return sorted(found, key=lambda r: r.started_at)

    def delete(self, session_id: str) -> None:
        self.store.delete(_SANDBOXES + session_id)


def _all(store: S3Store, prefix: str) -> list[dict[str, Any]]:
    found = []
    for key in store.keys(prefix):
        try:
            found.append(json.loads(store.get_bytes(key)))
        except NotFound:  # removed since it was listed
            continue
    return found


def _encode(entry: SessionEntry | CheckpointEntry | E2bSandboxRecord) -> bytes:
    return json.dumps(asdict(entry), sort_keys=True).encode()
