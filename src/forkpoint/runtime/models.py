"""The values the runtime hands out: sessions and checkpoints as users see them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forkpoint.store import CheckpointRecord, SessionRecord

__all__ = ["Checkpoint", "PortInfo", "Session"]


@dataclass(frozen=True)
class PortInfo:
    """A guest port forwarded to ``127.0.0.1:host_port`` on the host."""

    guest_port: int
    host_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.host_port}"

    def to_dict(self) -> dict[str, Any]:
        return {"guest_port": self.guest_port, "host_port": self.host_port, "url": self.url}


@dataclass(frozen=True)
class Session:
    """A session as reported by ``show``/``ls`` (the CLI/REST JSON contract)."""

    id: str
    name: str | None
    image: str
    state: str
    created_at: str
    parent_checkpoint: str | None
    ports: tuple[PortInfo, ...]
    memory_mib: int
    cpus: int
    network: str
    qemu_pid: int | None

    @classmethod
    def from_record(cls, record: SessionRecord) -> Session:
        return cls(
            id=record.id,
            name=record.name,
            image=record.image,
            state=str(record.state),
            created_at=record.created_at,
            parent_checkpoint=record.parent_checkpoint,
            ports=tuple(PortInfo(p.guest_port, p.host_port) for p in record.ports),
            memory_mib=record.memory_mib,
            cpus=record.cpus,
            network=str(record.network),
            qemu_pid=record.qemu_pid,
        )

    def port(self, guest_port: int) -> PortInfo | None:
        return next((p for p in self.ports if p.guest_port == guest_port), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "image": self.image,
            "state": self.state,
            "created_at": self.created_at,
            "parent_checkpoint": self.parent_checkpoint,
            "ports": [p.to_dict() for p in self.ports],
            "memory_mib": self.memory_mib,
            "cpus": self.cpus,
            "network": self.network,
        }


@dataclass(frozen=True)
class Checkpoint:
    """An immutable checkpoint (``checkpoint``/``checkpoints`` JSON contract)."""

    id: str
    session_id: str
    name: str | None
    kind: str
    created_at: str
    parent_checkpoint: str | None
    image: str
    size_bytes: int
    duration_ms: float
    pause_ms: float
    guest_ports: tuple[int, ...]

    @classmethod
    def from_record(cls, record: CheckpointRecord) -> Checkpoint:
        manifest = record.manifest
        return cls(
            id=record.id,
            session_id=record.session_id,
            name=record.name,
            kind=str(record.kind),
            created_at=record.created_at,
            parent_checkpoint=record.parent_checkpoint,
            image=record.image,
            size_bytes=record.size_bytes,
            duration_ms=float(manifest.get("duration_ms", 0.0)),
            pause_ms=float(manifest.get("pause_ms", 0.0)),
            guest_ports=tuple(int(p) for p in manifest.get("ports", [])),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "name": self.name,
            "kind": self.kind,
            "created_at": self.created_at,
            "parent_checkpoint": self.parent_checkpoint,
            "image": self.image,
            "size_bytes": self.size_bytes,
            "duration_ms": round(self.duration_ms, 1),
            "pause_ms": round(self.pause_ms, 1),
        }
