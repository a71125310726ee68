"""Row <-> record mapping, field validation and lookup guards for :mod:`forkpoint.store.db`."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping

from forkpoint.errors import Conflict, InvalidInput, NotFound
from forkpoint.store.models import (
    CheckpointKind,
    CheckpointRecord,
    Expiry,
    Network,
    PortForward,
    SessionRecord,
    SessionState,
    validate_name,
)

__all__ = [
    "CHECKPOINT_COLUMNS",
    "SESSION_COLUMNS",
    "SESSION_UPDATERS",
    "check_bool",
    "check_int",
    "check_layer_name",
    "check_port",
    "check_str",
    "checkpoint_from_row",
    "describe_dependents",
    "egress_json",
    "enum_value",
    "kind_value",
    "opt_pid",
    "opt_str",
    "pids_json",
    "ports_of",
    "require_absent",
    "require_checkpoint",
    "require_layer",
    "require_name_free",
    "session_from_row",
]

SESSION_COLUMNS = (
    "id, name, image, image_hash, state, created_at, parent_checkpoint, memory_mib, cpus, "
    "network, disk_layer, generation, qemu_pid, aux_pids, uid, disk_mib, expires_at, egress, "
    "on_expiry, pause_memory, paused_on_disk"
)
CHECKPOINT_COLUMNS = (
    "id, session_id, name, kind, created_at, disk_layer, parent_checkpoint, image, "
    "image_hash, manifest, size_bytes"
)


# --- field validation -------------------------------------------------


def check_int(value: object, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{what} must be an integer >= {minimum}, not {value!r}")
    return value


def check_bool(value: object, what: str) -> int:
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be true or false, not {value!r}")
    return int(value)


def check_str(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{what} must be a non-empty string, not {value!r}")
    return value


def opt_str(value: object, what: str) -> str | None:
    return None if value is None else check_str(value, what)


def opt_pid(value: object) -> int | None:
    return None if value is None else check_int(value, "qemu_pid", minimum=1)


def pids_json(value: object) -> str:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidInput(f"aux_pids must be a list of pids, not {value!r}")
    return json.dumps([check_int(pid, "aux_pids entry", minimum=1) for pid in value])


def egress_json(value: object) -> str:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"egress must be a JSON object, not {value!r}")
    return json.dumps(dict(value), sort_keys=True)


def enum_value(
    enum: type[SessionState] | type[Network] | type[Expiry], value: object, what: str
) -> str:
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return enum(value).value
    except ValueError:
        choices = ", ".join(member.value for member in enum)
        raise InvalidInput(f"{what} must be one of {choices}, not {value!r}") from None


def check_port(value: object, what: str) -> int:
    port = check_int(value, what, minimum=1)
    if port > 65535:
        raise InvalidInput(f"{what} must be at most 65535, not {port}")
    return port


# Columns update_session may change, with their validators (value -> SQL value).
# id, created_at and ports are not among them (ports: add_port / remove_ports).
SESSION_UPDATERS: dict[str, Callable[[object], object]] = {
    "name": lambda v: validate_name(opt_str(v, "name"), "session"),
    "image": lambda v: check_str(v, "image"),
    "image_hash": lambda v: check_str(v, "image_hash"),
    "state": lambda v: enum_value(SessionState, v, "state"),
    "parent_checkpoint": lambda v: opt_str(v, "parent_checkpoint"),
    "memory_mib": lambda v: check_int(v, "memory_mib", minimum=1),
    "cpus": lambda v: check_int(v, "cpus", minimum=1),
    "network": lambda v: enum_value(Network, v, "network"),
    "disk_layer": lambda v: check_str(v, "disk_layer"),
    "generation": lambda v: check_int(v, "generation", minimum=0),
    "qemu_pid": opt_pid,
    "aux_pids": pids_json,
    "disk_mib": lambda v: None if v is None else check_int(v, "disk_mib", minimum=1),
    "expires_at": lambda v: opt_str(v, "expires_at"),
    "egress": lambda v: egress_json(v),
    "on_expiry": lambda v: enum_value(Expiry, v, "on_expiry"),
    "pause_memory": lambda v: check_bool(v, "pause_memory"),
    "paused_on_disk": lambda v: check_bool(v, "paused_on_disk"),
}


def session_from_row(row: sqlite3.Row, ports: Iterable[PortForward]) -> SessionRecord:
    return SessionRecord(
        id=row["id"],
        name=row["name"],
        image=row["image"],
        image_hash=row["image_hash"],
        state=SessionState(row["state"]),
        created_at=row["created_at"],
        parent_checkpoint=row["parent_checkpoint"],
        memory_mib=row["memory_mib"],
        cpus=row["cpus"],
        network=Network(row["network"]),
        disk_layer=row["disk_layer"],
        generation=row["generation"],
        qemu_pid=row["qemu_pid"],
        aux_pids=tuple(json.loads(row["aux_pids"])),
        ports=tuple(ports),
        uid=row["uid"],
        disk_mib=row["disk_mib"],
        expires_at=row["expires_at"],
        egress=json.loads(row["egress"]),
        on_expiry=Expiry(row["on_expiry"]),
        pause_memory=bool(row["pause_memory"]),
        paused_on_disk=bool(row["paused_on_disk"]),
    )


def ports_of(conn: sqlite3.Connection, session_id: str) -> list[PortForward]:
    return [
        PortForward(row[0], row[1])
        for row in conn.execute(
            "SELECT guest_port, host_port FROM ports WHERE session_id = ? ORDER BY guest_port",
            (session_id,),
        )
    ]


def checkpoint_from_row(row: sqlite3.Row) -> CheckpointRecord:
    return CheckpointRecord(
        id=row["id"],
        session_id=row["session_id"],
        name=row["name"],
        kind=CheckpointKind(row["kind"]),
        created_at=row["created_at"],
        disk_layer=row["disk_layer"],
        parent_checkpoint=row["parent_checkpoint"],
        image=row["image"],
        image_hash=row["image_hash"],
        manifest=json.loads(row["manifest"]),
        size_bytes=row["size_bytes"],
    )


def kind_value(kind: object) -> str:
    try:
        if not isinstance(kind, str):
            raise ValueError(kind)
        return CheckpointKind(kind).value
    except ValueError:
        choices = ", ".join(member.value for member in CheckpointKind)
        raise InvalidInput(f"checkpoint kind must be one of {choices}, not {kind!r}") from None


def check_layer_name(name: object) -> None:
    if not isinstance(name, str) or not name or "/" in name or "\0" in name or name in (".", ".."):
        raise InvalidInput(f"invalid layer name {name!r}: must be a plain file name")


def require_absent(
    conn: sqlite3.Connection, table: str, column: str, value: str, what: str
) -> None:
    if conn.execute(f"SELECT 1 FROM {table} WHERE {column} = ?", (value,)).fetchone():
        raise Conflict(f"{what} already exists")


def require_name_free(conn: sqlite3.Connection, table: str, what: str, name: str) -> None:
    row = conn.execute(f"SELECT id FROM {table} WHERE name = ?", (name,)).fetchone()
    if row is not None:
        raise Conflict(f"{what} name {name!r} is already taken by {row[0]}")


def require_layer(conn: sqlite3.Connection, name: str) -> None:
    if not conn.execute("SELECT 1 FROM layers WHERE name = ?", (name,)).fetchone():
        raise NotFound(f"unknown layer: {name}")


def require_checkpoint(conn: sqlite3.Connection, checkpoint_id: str | None) -> None:
    if (
        checkpoint_id is not None
        and not conn.execute("SELECT 1 FROM checkpoints WHERE id = ?", (checkpoint_id,)).fetchone()
    ):
        raise NotFound(f"unknown checkpoint: {checkpoint_id}")


def describe_dependents(ids: list[str]) -> str:
    sessions = [i for i in ids if i.startswith("s-")]
    checkpoints = [i for i in ids if not i.startswith("s-")]
    parts = []
    if sessions:
        parts.append(("session " if len(sessions) == 1 else "sessions ") + ", ".join(sessions))
    if checkpoints:
        parts.append(
            ("checkpoint " if len(checkpoints) == 1 else "checkpoints ") + ", ".join(checkpoints)
        )
    return " and ".join(parts) + " (delete those first)"
