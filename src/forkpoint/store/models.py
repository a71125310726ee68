"""Records kept in the metadata store: frozen dataclasses plus their state enums.

Records are values: the store returns new ones on every read or update, never mutates
them. Timestamps are ISO-8601 UTC strings with millisecond precision and a ``Z`` suffix
(``2024-05-01T12:00:00.123Z``), so they sort lexically and go into JSON as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from forkpoint.errors import InvalidInput
from forkpoint.models import (
    ID_PATTERN,
    NAME_PATTERN,
    RESERVED_CHECKPOINT_NAMES,
    CheckpointKind,
    Expiry,
    Network,
    SessionState,
)

__all__ = [
    "CheckpointKind",
    "CheckpointRecord",
    "Expiry",
    "LayerRecord",
    "Network",
    "PortForward",
    "SessionRecord",
    "SessionState",
    "TemplateRecord",
    "new_checkpoint_id",
    "new_session_id",
    "utc_now",
    "validate_name",
]

_ID_RE = re.compile(ID_PATTERN)
_NAME_RE = re.compile(NAME_PATTERN)


def utc_now(ago_s: float = 0.0) -> str:
    """The current time (less ``ago_s`` seconds) as ISO-8601 UTC with milliseconds, e.g.
    ``2024-05-01T12:00:00.123Z``: the store's timestamps, which compare as strings."""
    when = datetime.now(UTC) - timedelta(seconds=ago_s)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_session_id() -> str:
    """A fresh session id: ``s-`` + 10 hex digits."""
    import secrets  # here: it loads hashlib, which no query needs

    return "s-" + secrets.token_hex(5)


def new_checkpoint_id() -> str:
    """A fresh checkpoint id: ``c-`` + 10 hex digits."""
    import secrets

    return "c-" + secrets.token_hex(5)


def validate_name(name: str | None, what: str) -> str | None:
    """Return ``name`` if it is a valid session/checkpoint name (or None).

    Names are 1-63 characters of ``[A-Za-z0-9._-]``, start with a letter or digit and
    must not look like an id (so ``get_*(id_or_name)`` is never ambiguous).

    Raises:
        InvalidInput: the name is malformed.
    """
    if name is None:
        return None
    if what == "checkpoint" and name in RESERVED_CHECKPOINT_NAMES:
        raise InvalidInput(
            f"invalid checkpoint name {name!r}: reserved (/v1/checkpoints/{name} is a route)"
        )
    if not isinstance(name, str) or not _NAME_RE.match(name) or _ID_RE.match(name):
        raise InvalidInput(
            f"invalid {what} name {name!r}: use 1-63 of [A-Za-z0-9._-], "
            "starting with a letter or digit, not shaped like an id"
        )
    return name


@dataclass(frozen=True)
class PortForward:
    """A guest TCP port forwarded to ``127.0.0.1:host_port``."""

    guest_port: int
    host_port: int

    def to_dict(self) -> dict[str, Any]:
        return {"guest_port": self.guest_port, "host_port": self.host_port}


@dataclass(frozen=True)
class SessionRecord:
    """One session (one microVM). ``id`` is stable across rollbacks.

    ``disk_layer`` is the file name (under ``Home.layers``) of the session's writable
    qcow2 overlay; ``generation`` grows by one on every restore/rollback;
    ``aux_pids`` are helper processes (e.g. the network helper) to reap with QEMU.
    """

    id: str
    name: str | None
    image: str
    image_hash: str
    state: SessionState
    created_at: str
    parent_checkpoint: str | None
    memory_mib: int
    cpus: int
    network: Network
    disk_layer: str
    generation: int = 0
    qemu_pid: int | None = None
    aux_pids: tuple[int, ...] = ()
    ports: tuple[PortForward, ...] = ()
    uid: int | None = None  # assigned by Store.insert_session when None
    disk_mib: int | None = None
    expires_at: str | None = None
    egress: dict[str, Any] = field(default_factory=dict, hash=False)
    on_expiry: Expiry = Expiry.REMOVE
    #: Whether a pause at its expiry keeps its memory (else only its disk: see paused_on_disk).
    pause_memory: bool = True
    #: Paused without its memory: it resumes by booting from its disk.
    paused_on_disk: bool = False

    @classmethod
    def new(
        cls,
        *,
        image: str,
        image_hash: str,
        disk_layer: str,
        memory_mib: int,
        cpus: int,
        network: Network = Network.USER,
        name: str | None = None,
        parent_checkpoint: str | None = None,
        state: SessionState = SessionState.CREATING,
        disk_mib: int | None = None,
        expires_at: str | None = None,
        on_expiry: Expiry = Expiry.REMOVE,
        egress: dict[str, Any] | None = None,
    ) -> SessionRecord:
        """A new record with a fresh id and ``created_at`` = now (not yet stored)."""
        return cls(
            id=new_session_id(),
            name=name,
            image=image,
            image_hash=image_hash,
            state=state,
            created_at=utc_now(),
            parent_checkpoint=parent_checkpoint,
            memory_mib=memory_mib,
            cpus=cpus,
            network=network,
            disk_layer=disk_layer,
            disk_mib=disk_mib,
            expires_at=expires_at,
            on_expiry=on_expiry,
            egress=egress or {},
        )

    def port_for(self, guest_port: int) -> PortForward | None:
        """The forward of ``guest_port``, if there is one."""
        return next((p for p in self.ports if p.guest_port == guest_port), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (enums as their string values, tuples as lists)."""
        return {
            "id": self.id,
            "name": self.name,
            "image": self.image,
            "image_hash": self.image_hash,
            "state": self.state.value,
            "created_at": self.created_at,
            "parent_checkpoint": self.parent_checkpoint,
            "memory_mib": self.memory_mib,
            "cpus": self.cpus,
            "network": self.network.value,
            "disk_layer": self.disk_layer,
            "generation": self.generation,
            "qemu_pid": self.qemu_pid,
            "aux_pids": list(self.aux_pids),
            "ports": [p.to_dict() for p in self.ports],
            "uid": self.uid,
            "disk_mib": self.disk_mib,
            "expires_at": self.expires_at,
            "egress": self.egress,
            "on_expiry": self.on_expiry.value,
            "pause_memory": self.pause_memory,
            "paused_on_disk": self.paused_on_disk,
        }


@dataclass(frozen=True)
class CheckpointRecord:
    """An immutable checkpoint: memory + device state + frozen ``disk_layer`` + manifest.

    ``parent_checkpoint`` is the checkpoint the session was started from (None for a
    cold boot); ``size_bytes`` is what the checkpoint's own files take on disk.
    """

    id: str
    session_id: str
    name: str | None
    kind: CheckpointKind
    created_at: str
    disk_layer: str
    parent_checkpoint: str | None
    image: str
    image_hash: str
    manifest: dict[str, Any] = field(default_factory=dict, hash=False)
    size_bytes: int = 0

    @classmethod
    def new(
        cls,
        *,
        session_id: str,
        disk_layer: str,
        image: str,
        image_hash: str,
        manifest: dict[str, Any],
        size_bytes: int = 0,
        name: str | None = None,
        kind: CheckpointKind = CheckpointKind.USER,
        parent_checkpoint: str | None = None,
    ) -> CheckpointRecord:
        """A new record with a fresh id and ``created_at`` = now (not yet stored)."""
        return cls(
            id=new_checkpoint_id(),
            session_id=session_id,
            name=name,
            kind=kind,
            created_at=utc_now(),
            disk_layer=disk_layer,
            parent_checkpoint=parent_checkpoint,
            image=image,
            image_hash=image_hash,
            manifest=manifest,
            size_bytes=size_bytes,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (enums as their string values)."""
        return {
            "id": self.id,
            "session_id": self.session_id,
            "name": self.name,
            "kind": self.kind.value,
            "created_at": self.created_at,
            "disk_layer": self.disk_layer,
            "parent_checkpoint": self.parent_checkpoint,
            "image": self.image,
            "image_hash": self.image_hash,
            "manifest": dict(self.manifest),
            "size_bytes": self.size_bytes,
        }


@dataclass(frozen=True)
class LayerRecord:
    """A qcow2 disk layer (file name under ``Home.layers``) and the layer it is backed by."""

    name: str
    backing: str | None
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "backing": self.backing, "created_at": self.created_at}


@dataclass(frozen=True)
class TemplateRecord:
    """The template checkpoint of one image on one machine shape.

    ``machine_key`` is opaque to the store (the runtime builds it from the QEMU build,
    accel, memory and cpus).
    """

    image_hash: str
    machine_key: str
    checkpoint_id: str
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "image_hash": self.image_hash,
            "machine_key": self.machine_key,
            "checkpoint_id": self.checkpoint_id,
            "created_at": self.created_at,
        }
