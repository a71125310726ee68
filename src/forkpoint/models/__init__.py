"""forkpoint's data model: one type per concept, and every limit, defined once.

These are the values users see. The runtime returns them, the REST API declares them as
its response types, the CLI prints them with ``--json``, MCP tools return them, and the SDK
parses its responses into them. Guest-side values that cross the agent protocol unchanged
(a process, a directory entry, a started background process) are the
:mod:`forkpoint.protocol` dataclasses, re-exported here under their public names. The
request bodies, with these limits as validation rules, are :mod:`forkpoint.requests`.

Commands and processes are in ``models/commands.py``, wire-only values (errors, health) in
``models/wire.py``, checkpoint transfers in ``models/portable.py``; all are imported from
here, and load on first use. Frozen standard-library dataclasses, not pydantic models, on
purpose: importing this package costs next to nothing, so ``forkpoint ls --json`` stays
fast (pydantic alone takes longer to import than the whole command may). pydantic
validates and serialises these dataclasses wherever it is already loaded (REST, SDK, MCP).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from forkpoint.models.commands import (
        CommandResult,
        ProcessEvent,
        ProcessEventKind,
        TrackedProcess,
    )
    from forkpoint.models.history import (
        FileChange,
        HistoryStep,
        PortChange,
        ProcessChange,
        StateDiff,
    )
    from forkpoint.models.portable import CheckpointTransfer, FileCheck, TransferKind
    from forkpoint.models.wire import (
        ErrorDetail,
        ErrorResponse,
        Health,
        Operation,
        OperationKind,
        OperationState,
    )
    from forkpoint.protocol.models import DirEntry as FileEntry
    from forkpoint.protocol.models import HookRun as RestoreHook
    from forkpoint.protocol.models import ProcessInfo as Process
    from forkpoint.protocol.models import PtySize
    from forkpoint.protocol.models import RestoreStatus as GuestRestore
    from forkpoint.protocol.models import SpawnResult as BackgroundProcess
    from forkpoint.protocol.models import StatResult as FileStat
    from forkpoint.protocol.models import WatchEvent as FileEvent

# Loaded on first use (PEP 562): `forkpoint ls --json` must not pay for what it does not
# need (the protocol package, a dozen more dataclasses) — see "CLI start-up" in the docs.
_LAZY = {
    "FileEntry": ("forkpoint.protocol.models", "DirEntry"),
    "Process": ("forkpoint.protocol.models", "ProcessInfo"),
    "PtySize": ("forkpoint.protocol.models", "PtySize"),
    "GuestRestore": ("forkpoint.protocol.models", "RestoreStatus"),
    "RestoreHook": ("forkpoint.protocol.models", "HookRun"),
    "BackgroundProcess": ("forkpoint.protocol.models", "SpawnResult"),
    "FileStat": ("forkpoint.protocol.models", "StatResult"),
    "FileEvent": ("forkpoint.protocol.models", "WatchEvent"),
    "CommandResult": ("forkpoint.models.commands", "CommandResult"),
    "ProcessEvent": ("forkpoint.models.commands", "ProcessEvent"),
    "ProcessEventKind": ("forkpoint.models.commands", "ProcessEventKind"),
    "TrackedProcess": ("forkpoint.models.commands", "TrackedProcess"),
    "ErrorDetail": ("forkpoint.models.wire", "ErrorDetail"),
    "ErrorResponse": ("forkpoint.models.wire", "ErrorResponse"),
    "Health": ("forkpoint.models.wire", "Health"),
    "FileChange": ("forkpoint.models.history", "FileChange"),
    "HistoryStep": ("forkpoint.models.history", "HistoryStep"),
    "PortChange": ("forkpoint.models.history", "PortChange"),
    "ProcessChange": ("forkpoint.models.history", "ProcessChange"),
    "StateDiff": ("forkpoint.models.history", "StateDiff"),
    "CheckpointTransfer": ("forkpoint.models.portable", "CheckpointTransfer"),
    "TransferKind": ("forkpoint.models.portable", "TransferKind"),
    "FileCheck": ("forkpoint.models.portable", "FileCheck"),
    "Operation": ("forkpoint.models.wire", "Operation"),
    "OperationKind": ("forkpoint.models.wire", "OperationKind"),
    "OperationState": ("forkpoint.models.wire", "OperationState"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(module), attribute)


__all__ = [
    "Event",
    "EventKind",
    "ID_PATTERN",
    "MAX_CPUS",
    "MAX_DISK_MIB",
    "MAX_EGRESS_RULES",
    "MAX_FORKS",
    "DEFAULT_CPUS",
    "DEFAULT_MEMORY_MIB",
    "MAX_MEMORY_MIB",
    "MAX_PORTS",
    "MAX_TIMEOUT_S",
    "MAX_VOLUME_FILE_BYTES",
    "VOLUME_UID",
    "MIN_MEMORY_MIB",
    "NAME_PATTERN",
    "RESERVED_CHECKPOINT_NAMES",
    "BackgroundProcess",
    "Checkpoint",
    "CheckpointKind",
    "Expiry",
    "CheckpointTransfer",
    "FileCheck",
    "CommandResult",
    "ErrorDetail",
    "ErrorResponse",
    "FileChange",
    "FileEntry",
    "FileEvent",
    "Watcher",
    "Volume",
    "VolumeEntry",
    "VolumeFile",
    "Metric",
    "HostStatus",
    "ImageInfo",
    "FileStat",
    "Health",
    "HistoryStep",
    "Limits",
    "Network",
    "Operation",
    "OperationKind",
    "OperationState",
    "OutputEncoding",
    "Port",
    "PortChange",
    "Process",
    "ProcessChange",
    "ProcessEvent",
    "ProcessEventKind",
    "PtySize",
    "GuestRestore",
    "RestoreHook",
    "Session",
    "SessionState",
    "StateDiff",
    "TrackedProcess",
    "TransferKind",
    "to_json_data",
]

# -- limits ----------------------------------------------------------------------------

MIN_MEMORY_MIB, MAX_MEMORY_MIB = 128, 65536  # guest RAM
# A session's shape when none is asked for: every door's default (one place).
DEFAULT_MEMORY_MIB, DEFAULT_CPUS = 512, 1
MAX_DISK_MIB = 1 << 20  # a session's virtual disk (create --disk); at least the image's
MAX_CPUS = 64
MAX_FORKS = 128  # sessions one fork call may start (the bench forks 100)
MAX_PORTS = 64  # guest ports forwarded at create
MAX_TIMEOUT_S = 30 * 24 * 3600  # a session's lifetime (create --timeout)
#: The largest file a volume's content API reads or writes in one request (bytes).
MAX_VOLUME_FILE_BYTES = 64 * 1024 * 1024
MAX_EGRESS_RULES = 64  # CIDRs in each of a session's egress allow and deny lists
# Each session's QEMU and passt run as a uid of their own, from a block of JAIL_UIDS that
# belongs to the session's home: block b (1..JAIL_HOME_BLOCKS, chosen by the home's path, so
# that two homes on one host — a test home beside the real one — rarely share one) holds
# JAIL_UID_BASE + b * JAIL_UIDS + 0..JAIL_UIDS-1. JAIL_UID_BASE itself is for VMs of no
# session (image builds). All far above the ranges Debian gives users and /etc/subuid.
JAIL_UID_BASE = 1_900_000_000
JAIL_UIDS = 65_536
JAIL_HOME_BLOCKS = 256
SESSION_UIDS = range(JAIL_UID_BASE + JAIL_UIDS, JAIL_UID_BASE + (JAIL_HOME_BLOCKS + 1) * JAIL_UIDS)
#: Who owns volumes' files on the host and serves them to guests (``volume_server.py``):
#: no session's uid, so no guest's QEMU can touch them.
VOLUME_UID = JAIL_UID_BASE - 1
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
#: Names the REST API's checkpoint paths use themselves (``POST /v1/checkpoints/pull``):
#: ``/v1/checkpoints/{checkpoint_id}`` does not match them, so no checkpoint takes them.
RESERVED_CHECKPOINT_NAMES = frozenset({"pull"})
ID_PATTERN = r"^[sc]-[0-9a-f]{10}$"  # names may not look like this (ids and names share refs)

OutputEncoding = Literal["text", "base64"]


# -- states ----------------------------------------------------------------------------


class SessionState(StrEnum):
    """Lifecycle of a session. ``crashed``: its QEMU died without being asked to.
    ``lost``: the cluster node it ran on is gone (``forkpoint recover`` revives it)."""

    CREATING = "creating"
    RUNNING = "running"
    STOPPED = "stopped"
    CRASHED = "crashed"
    LOST = "lost"


class Network(StrEnum):
    """Guest networking: ``user`` (outbound + forwards) or ``none`` (a NIC with nothing
    behind it)."""

    USER = "user"
    NONE = "none"


class CheckpointKind(StrEnum):
    """Why a checkpoint exists. ``user``: made on request (a user's, listed); the others
    are forkpoint's own, hidden from checkpoint lists: ``template``: an image booted to
    "agent ready"; ``history``: taken automatically before a step (``history``/``undo``
    list them); ``pause``: a paused session's state (``resume`` restores it); ``fork``:
    the moment a running session was forked."""

    USER = "user"
    TEMPLATE = "template"
    HISTORY = "history"
    PAUSE = "pause"
    FORK = "fork"


class Expiry(StrEnum):
    """What happens to a session when its lifetime ends: ``remove`` it (E2B's kill), or
    ``pause`` it (checkpoint and stop; ``resume`` brings it back)."""

    REMOVE = "remove"
    PAUSE = "pause"


# -- values ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Watcher:
    """A directory of a session watched for pollers (``Runtime.watcher_events``): ``id``
    names it within its session. ``entries``: each event carries the path's entry."""

    id: str
    session_id: str
    path: str
    recursive: bool = False
    entries: bool = False


@dataclass(frozen=True)
class Volume:
    """A directory on the host that outlives sessions, for files an agent keeps: ``name``
    is unique, ``token`` the E2B content API's credential for it. ``size_bytes``: what
    its files take; ``mounts``: where sessions have it (``"<session id>:<guest path>"``)."""

    id: str
    name: str
    created_at: str
    token: str
    size_bytes: int = 0
    mounts: tuple[str, ...] = ()


@dataclass(frozen=True)
class VolumeEntry:
    """A path in a volume: ``type`` file, directory, symlink or unknown; times ISO 8601."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: str
    mtime: str
    ctime: str


@dataclass(frozen=True)
class VolumeFile:
    """A volume file's content (``data``: base64) and what it is."""

    entry: VolumeEntry
    data: str


class EventKind(StrEnum):
    """What happened to a session: ``created`` (from an image), ``forked`` (a new session
    from a checkpoint), ``checkpointed``, ``rolled_back`` (also an undo), ``paused``,
    ``resumed``, ``removed`` (on request) and ``expired`` (its lifetime ended: removed or
    paused, see ``detail["then"]``); ``restore_hook_failed``: one of the guest's restore
    hooks failed or was killed at its time limit (``detail``: ``hook``, ``status``,
    ``event``, ``generation``; the restore itself went on)."""

    CREATED = "created"
    FORKED = "forked"
    CHECKPOINTED = "checkpointed"
    ROLLED_BACK = "rolled_back"
    PAUSED = "paused"
    RESUMED = "resumed"
    REMOVED = "removed"
    EXPIRED = "expired"
    RESTORE_HOOK_FAILED = "restore_hook_failed"


@dataclass(frozen=True)
class Event:
    """One thing that happened to a session (``Runtime.events``), whichever door or
    process did it. ``id`` grows with every event: ask for those after the last one seen.
    ``at``: when (the store's UTC timestamp). ``checkpoint``: the one it was made from,
    made, or rolled back to. ``detail``: the rest (image, checkpoint kind, ...)."""

    id: int
    at: str
    kind: EventKind
    session: str
    checkpoint: str | None = None
    detail: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Metric:
    """One sample of a running session's use (``Runtime.metrics``), taken every few
    seconds. ``at``: when (the store's UTC timestamp). ``cpu_used_pct``: the host CPU its
    VM used since the sample before, as a share of its vCPUs (0–100). Memory and disk in
    bytes as the guest counts them: ``mem_used`` = total − available, ``mem_cache`` its
    page cache, the root filesystem's size and use. An idle guest is not woken to be
    measured: its memory and disk are those of its last sample."""

    at: str
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


@dataclass(frozen=True)
class HostStatus:
    """The host's room against forkpoint's limits, now. Sessions: running ones and the
    most allowed (``FORKPOINT_MAX_SESSIONS``); memory in MiB: the host's RAM, what the
    kernel says is still available, and the guest RAM of the running sessions; disk in
    bytes: free on the home's filesystem and the reserve operations leave
    (``FORKPOINT_DISK_RESERVE``); ``warm_vms``: QEMU processes started ahead (``forkpoint
    warm``), ``standbys``: rollbacks started ahead; ``load_1m``: the host's load average."""

    sessions_running: int
    sessions_max: int
    cpus: int
    load_1m: float
    memory_total_mib: int
    memory_available_mib: int
    memory_sessions_mib: int
    disk_free_bytes: int
    disk_reserve_bytes: int
    warm_vms: int
    standbys: int


@dataclass(frozen=True)
class ImageInfo:
    """A guest image (the newest build of its name). ``source``: where its root filesystem
    came from (``kind`` ``debian``, ``dockerfile``, ``containers-storage``…); ``start`` and
    ``ready``: the service its template boot starts and the check it waits for."""

    name: str
    hash: str
    suite: str
    kernel_version: str
    size_bytes: int
    created_at: str
    source: dict[str, str]
    packages: list[str]
    start: list[str]
    ready: str | None = None


@dataclass(frozen=True)
class Port:
    """A guest port forwarded to ``127.0.0.1:host_port`` on the host (never elsewhere).
    ``url`` is always ``http://127.0.0.1:<host_port>`` (derived, whatever is passed)."""

    guest_port: int
    host_port: int
    url: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", f"http://127.0.0.1:{self.host_port}")


@dataclass(frozen=True)
class Limits:
    """The resource limits in force on a session's VM (QEMU and passt), read back from
    its cgroup: memory in bytes (guest RAM + QEMU's bounded overhead, no swap), CPU time
    as a number of CPUs, tasks, and I/O weight (1–10000, 100 = equal share). ``None``
    and a name in ``not_enforced``: this host does not enforce it (see the docs)."""

    memory_bytes: int | None
    cpus: float | None
    pids_max: int | None
    io_weight: int | None
    not_enforced: tuple[str, ...] = ()


@dataclass(frozen=True)
class Session:
    """One session (one microVM). ``id`` is stable across rollbacks; ``created_at`` is
    ISO-8601 UTC (``2026-05-01T12:00:00.123Z``); ``parent_checkpoint`` is the checkpoint
    it was last restored from. ``expires_at`` (ISO-8601 UTC, None: never): when its
    lifetime ends (``create --timeout``), and ``on_expiry`` what happens then (a paused
    session never expires). ``disk_bytes``: host disk its own files use now (its
    top disk layer, logs; not the layers and checkpoints it shares). ``disk_mib``: its
    virtual disk's size when chosen at create (None: the image's)."""

    id: str
    name: str | None
    image: str
    state: SessionState
    created_at: str
    parent_checkpoint: str | None
    memory_mib: int
    cpus: int
    network: Network
    ports: tuple[Port, ...] = ()
    limits: Limits | None = None  # None: no VM running, or none of its cgroups exist
    # Adjustments to the default egress policy: {"allow": [CIDR, ...], "deny": [...]}.
    egress: dict[str, list[str]] = field(
        default_factory=lambda: {"allow": [], "deny": []}, hash=False
    )
    expires_at: str | None = None
    disk_bytes: int = 0
    disk_mib: int | None = None
    on_expiry: Expiry = Expiry.REMOVE
    #: Whether a pause at its expiry keeps its memory (else only its disk).
    keep_memory: bool = True
    #: Paused keeping only its disk: ``resume`` boots it anew from that disk.
    paused_on_disk: bool = False
    #: The cluster node it runs on (None on one host).
    node: str | None = None

    def port(self, guest_port: int) -> Port | None:
        """The forward of ``guest_port``, if there is one."""
        return next((p for p in self.ports if p.guest_port == guest_port), None)


@dataclass(frozen=True)
class Checkpoint:
    """An immutable checkpoint: memory, device state and disk of a session at one moment.
    ``pause_ms``: how long the VM was paused; ``guest_ports``: what its forks forward.
    ``size_bytes``: its RAM and device state; ``disk_bytes``: host disk it uses now (those
    files plus the disk layer it froze); ``shared_bytes``: the part of that which other
    checkpoints hold too (where RAM files are reflinks: what did not change between
    them), so ``disk_bytes - shared_bytes`` is its own."""

    id: str
    session_id: str
    name: str | None
    kind: CheckpointKind
    created_at: str
    parent_checkpoint: str | None
    image: str
    size_bytes: int
    duration_ms: float
    pause_ms: float
    guest_ports: tuple[int, ...] = ()
    disk_bytes: int = 0
    shared_bytes: int = 0


def to_json_data(value: Any) -> Any:
    """``value`` (these values, lists/tuples of them, dicts, enums) as plain JSON data."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_json_data(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_json_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_data(v) for v in value]
    return value
