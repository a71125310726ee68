"""A checkpoint on disk: its files, and the manifest that says what they hold.

QEMU does not verify that a device-state file matches its own build, the RAM file or the
machine shape; loading a mismatched one corrupts the guest silently. The manifest, written
once next to them and checked before every restore, does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkpoint.config import Home
from forkpoint.errors import IncompatibleCheckpoint, NotFound
from forkpoint.models import CheckpointKind
from forkpoint.vm.shape import MachineShape
from forkpoint.vm.stats import CheckpointStats

__all__ = ["FORMAT", "CheckpointFiles", "Manifest"]

FORMAT = 1
"""Version of the manifest's JSON layout; a checkpoint of another format is refused."""

_COMPATIBLE_KEYS = ("qemu", "accel", "memory_mib", "cpus", "argv_layout")


@dataclass(frozen=True)
class CheckpointFiles:
    """Where one checkpoint's files are: ``<dir>/ram``, ``<dir>/state``, ``<dir>/manifest.json``.

    ``ram`` is the guest RAM (sparse; sessions restored from it map it copy-on-write),
    ``state`` the device state without RAM. The only place that spells these names out.
    """

    dir: Path

    @classmethod
    def of(cls, home: Home, checkpoint_id: str) -> CheckpointFiles:
        return cls(home.checkpoints / checkpoint_id)

    def staging(self) -> CheckpointFiles:
        """The temp directory a checkpoint is written into before it is renamed to ``dir``
        (invisible to readers: a crash never leaves a half checkpoint)."""
        return CheckpointFiles(self.dir.with_name(f".tmp-{self.dir.name}"))

    @property
    def ram(self) -> Path:
        return self.dir / "ram"

    @property
    def state(self) -> Path:
        return self.dir / "state"

    @property
    def manifest(self) -> Path:
        return self.dir / "manifest.json"

    def complete(self) -> bool:
        """True if the checkpoint is there to restore (its files are renamed in last)."""
        return self.state.exists()


@dataclass(frozen=True)
class Manifest:
    """What one checkpoint holds and how it was made: ``manifest.json`` as a value.

    ``shape`` + ``argv_layout`` must match the host's for a restore (see
    :meth:`check_compatible`); ``stats`` and ``duration_ms`` record where its time went.
    """

    id: str
    session_id: str
    name: str | None
    kind: CheckpointKind
    shape: MachineShape
    argv_layout: int
    qemu_version: str
    image: str
    image_hash: str
    disk_layer: str
    parent_checkpoint: str | None
    ports: tuple[int, ...]
    stats: CheckpointStats
    duration_ms: float
    #: What a host must match to restore it beyond ``shape`` (``vm.host.host_facts``:
    #: accel, TSC rate under TCG, CPU and kernel under KVM); empty in older checkpoints.
    host: dict[str, object] = field(default_factory=dict)
    #: ``{"state": {"size", "sha256"}, "ram": {"size", "ctime_ns", SUM_KEY}}`` (see
    #: ``integrity``); None for a checkpoint written before checkpoints recorded files.
    files: dict[str, dict[str, Any]] | None = None
    #: The guest had processes or hooks to tell of a restore (``guest/restore.py``): a
    #: restore of this checkpoint returns once the guest has told them.
    restore_listeners: bool = False
    #: The volumes the guest had mounted: ``(volume id, guest path)`` pairs; a restore
    #: serves them again (``forkpoint/volume_server.py``).
    volumes: tuple[tuple[str, str], ...] = ()

    # -- files -------------------------------------------------------------------------

    @classmethod
    def load(cls, files: CheckpointFiles) -> Manifest:
        """Read ``files.manifest``.

        :raises NotFound: the file is missing or unreadable;
        :raises IncompatibleCheckpoint: written in another format.
        """
        try:
            data = json.loads(files.manifest.read_text())
        except (OSError, ValueError) as error:
            raise NotFound(f"checkpoint files missing or unreadable: {files.dir}") from error
        if not isinstance(data, dict):
            raise NotFound(f"checkpoint manifest is not an object: {files.dir}")
        return cls.from_dict(data, checkpoint_id=files.dir.name)

    def save(self, files: CheckpointFiles) -> None:
        """Write ``files.manifest`` (read-only, never overwritten) and fsync it."""
        data = json.dumps(self.to_dict(), indent=2, sort_keys=True).encode()
        fd = os.open(files.manifest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- JSON --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON layout of format :data:`FORMAT` (flat, as forkpoint always wrote it)."""
        s = self.stats
        out: dict[str, Any] = {
            "format": FORMAT, "id": self.id, "session_id": self.session_id, "name": self.name,
            "kind": str(self.kind),
            "machine": {**self.shape.to_dict(), "argv_layout": self.argv_layout},
            "qemu_version": self.qemu_version, "image": self.image,
            "image_hash": self.image_hash, "disk_layer": self.disk_layer,
            "parent_checkpoint": self.parent_checkpoint, "ports": list(self.ports),
            "ram_bytes": s.ram_bytes, "state_bytes": s.state_bytes,
            "written_bytes": s.written_bytes, "pause_ms": s.pause_ms,
            "base_copy_ms": s.base_copy_ms, "device_state_ms": s.device_state_ms,
            "written_ms": s.written_ms, "duration_ms": self.duration_ms,
            **({"host": dict(self.host)} if self.host else {}),
            **({"restore_listeners": True} if self.restore_listeners else {}),
            **({"volumes": [list(v) for v in self.volumes]} if self.volumes else {}),
        }  # fmt: skip
        if self.files is not None:
            out["files"] = self.files
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, checkpoint_id: str = "") -> Manifest:
        """The manifest in ``data`` (as :meth:`to_dict` writes it; the time split of a
        checkpoint written before it was recorded reads as 0).

        :raises IncompatibleCheckpoint: another format, or a field missing or malformed.
        """
        what = checkpoint_id or str(data.get("id", "?"))
        if data.get("format") != FORMAT:
            raise IncompatibleCheckpoint(
                f"checkpoint {what} has manifest format {data.get('format')!r}; "
                f"this forkpoint reads format {FORMAT}"
            )
        try:
            machine = data["machine"]
            return cls(
                id=str(data["id"]),
                session_id=str(data["session_id"]),
                name=None if data.get("name") is None else str(data["name"]),
                kind=CheckpointKind(data["kind"]),
                shape=MachineShape(
                    memory_mib=int(machine["memory_mib"]),
                    cpus=int(machine["cpus"]),
                    accel=machine["accel"],
                    qemu=str(machine["qemu"]),
                ),
                argv_layout=int(machine["argv_layout"]),
                qemu_version=str(data.get("qemu_version", "")),
                image=str(data["image"]),
                image_hash=str(data["image_hash"]),
                disk_layer=str(data["disk_layer"]),
                parent_checkpoint=data.get("parent_checkpoint"),
                ports=tuple(int(p) for p in data.get("ports", ())),
                stats=CheckpointStats(
                    pause_ms=float(data.get("pause_ms", 0.0)),
                    base_copy_ms=float(data.get("base_copy_ms", 0.0)),
                    device_state_ms=float(data.get("device_state_ms", 0.0)),
                    written_ms=float(data.get("written_ms", 0.0)),
                    written_bytes=int(data.get("written_bytes", 0)),
                    ram_bytes=int(data.get("ram_bytes", 0)),
                    state_bytes=int(data.get("state_bytes", 0)),
                ),
                duration_ms=float(data.get("duration_ms", 0.0)),
                host=dict(data.get("host") or {}),
                files=dict(data["files"]) if isinstance(data.get("files"), dict) else None,
                restore_listeners=data.get("restore_listeners") is True,
                volumes=tuple((str(v), str(at)) for v, at in data.get("volumes", ())),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise IncompatibleCheckpoint(
                f"checkpoint {what} has a malformed manifest ({type(error).__name__}: {error})"
            ) from error

    # -- restore -----------------------------------------------------------------------

    def check_compatible(self, here: MachineShape) -> None:
        """Refuse a checkpoint made by another QEMU build, accel or machine shape.

        :raises IncompatibleCheckpoint: naming what differs.
        """
        theirs = {**self.shape.to_dict(), "argv_layout": self.argv_layout}
        mine = here.to_dict()  # with this forkpoint's argv layout
        for key in _COMPATIBLE_KEYS:
            if theirs[key] != mine[key]:
                raise IncompatibleCheckpoint(
                    f"checkpoint {self.id} was made with {key}={theirs[key]!r}, "
                    f"this host has {key}={mine[key]!r}; it can only be restored on the same "
                    "QEMU build, accelerator and machine shape"
                )
