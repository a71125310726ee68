"""Every operation forkpoint offers through its doors, each declared once.

An :class:`Op` says what an operation is — its name, request and response models, the
runtime call, what admission it needs (heavy operations may answer 202), whether it is a
history step, its HTTP method and path, its MCP tool — and the doors derive from it:
REST routes (``server/app.py``), MCP tools (``mcp/server.py``) and the SDK's
``ApiClient`` calls (``sdk/_client.py``). Adding an operation: its request/response
models, the runtime method, one entry here, and (only if it prints something new) a CLI
formatter. What a door adds stays in the door: REST's OpenAPI links, MCP's wrapping of
lists in an object.

The few operations whose shape is not "JSON in, JSON out" are wired by hand in each door
and listed in :data:`BY_HAND`: ``exec`` (a foreground | background union answering two
shapes), the file routes (raw bytes both ways), ``kill_process`` and ``list_checkpoints``
(query parameters), a terminal's start and connect (NDJSON streams), the events' SSE
stream, health and the 202 operations.
"""

from __future__ import annotations

import asyncio
import base64
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from forkpoint.errors import ForkpointError
from forkpoint.models import (
    Checkpoint,
    CheckpointTransfer,
    ErrorResponse,
    Event,
    FileCheck,
    FileEvent,
    GuestRestore,
    HistoryStep,
    HostStatus,
    ImageInfo,
    Metric,
    OperationKind,
    Port,
    Process,
    PtySize,
    Session,
    StateDiff,
    Volume,
    VolumeEntry,
    VolumeFile,
    Watcher,
)
from forkpoint.requests import (
    CheckpointRequest,
    CreateSessionRequest,
    CreateVolumeRequest,
    DiffRequest,
    EgressRequest,
    EventsRequest,
    ForkRequest,
    ImageBuildRequest,
    MetricsRequest,
    PauseRequest,
    PortRequest,
    PullRequest,
    PushRequest,
    RollbackPreviewRequest,
    RollbackRequest,
    TerminalInputRequest,
    TerminalSizeRequest,
    TimeoutRequest,
    UndoRequest,
    VolumeDirRequest,
    VolumeEntriesRequest,
    VolumeMetadataRequest,
    VolumePathRequest,
    VolumeWriteRequest,
    WatcherEventsRequest,
    WatchRequest,
)

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime
    from forkpoint.runtime.admission import Admission, Ticket

__all__ = ["BY_HAND", "OPERATIONS", "Cost", "Op", "admit", "operation"]

#: An operation's ids, by path parameter: ``session_id``, ``checkpoint_id``, ``pid``.
Ids = dict[str, Any]


class Cost(enum.Enum):
    """What admission an operation needs (``runtime/admission.py`` says how much)."""

    CREATE = "create"
    FORK = "fork"
    CHECKPOINT = "checkpoint"
    ROLLBACK = "rollback"  # rollback and undo: one session more if it was not running
    PREVIEW = "preview"  # a rollback preview's scratch fork
    DIFF = "diff"  # a diff's scratch forks

    @property
    def kind(self) -> OperationKind | None:
        """The long-operation kind of a heavy cost (it may answer 202); None for scratch."""
        return _KINDS.get(self)


_KINDS = {
    Cost.CREATE: OperationKind.CREATE,
    Cost.FORK: OperationKind.FORK,
    Cost.CHECKPOINT: OperationKind.CHECKPOINT,
    Cost.ROLLBACK: OperationKind.ROLLBACK,
}


@dataclass(frozen=True)
class Op:
    """One operation. ``call(runtime, ids, request)`` runs it; ``path`` (under ``/v1``)
    names its ids; ``response`` None: nothing is answered (HTTP 204). ``summary`` is its
    one line, ``description`` what an agent should know (the MCP tool's text)."""

    name: str
    method: str
    path: str
    call: Callable[..., Awaitable[Any]]
    summary: str
    tag: str
    request: type[BaseModel] | None = None
    response: Any = None
    status: int = 200
    cost: Cost | None = None
    #: In a session keeping history it checkpoints first (REST: may answer 429).
    step: bool = False
    #: Exposed as an MCP tool (its parameters: the ids, then the request's fields).
    mcp: bool = False
    description: str = ""

    @property
    def ids(self) -> list[str]:
        """The path parameters, in order."""
        return [part[1:-1].split(":")[0] for part in self.path.split("/") if part[:1] == "{"]


# -- the calls -----------------------------------------------------------------------------


async def _create(rt: Runtime, ids: Ids, request: CreateSessionRequest) -> Session:
    return await rt.create(**request.model_dump())


async def _list_sessions(rt: Runtime, ids: Ids, request: None) -> list[Session]:
    return await asyncio.to_thread(rt.list_sessions)


async def _get_session(rt: Runtime, ids: Ids, request: None) -> Session:
    return await asyncio.to_thread(rt.get, ids["session_id"])


async def _remove_session(rt: Runtime, ids: Ids, request: None) -> None:
    await rt.remove(ids["session_id"])


async def _set_timeout(rt: Runtime, ids: Ids, request: TimeoutRequest) -> Session:
    return await rt.set_timeout(
        ids["session_id"], request.timeout_s, request.on_expiry, request.keep_memory
    )


async def _set_egress(rt: Runtime, ids: Ids, request: EgressRequest) -> Session:
    return await rt.set_egress(
        ids["session_id"], request.allow_net, request.deny_net, request.inject_headers
    )


async def _pause(rt: Runtime, ids: Ids, request: PauseRequest) -> Session:
    return await rt.pause(ids["session_id"], request.keep_memory)


async def _resume(rt: Runtime, ids: Ids, request: None) -> Session:
    return await rt.resume(ids["session_id"])


async def _rollback(rt: Runtime, ids: Ids, request: RollbackRequest) -> Session:
    return await rt.rollback(ids["session_id"], request.checkpoint)


async def _rollback_preview(rt: Runtime, ids: Ids, request: RollbackPreviewRequest) -> StateDiff:
    return await rt.rollback_preview(ids["session_id"], request.checkpoint, patch=request.patch)


async def _diff(rt: Runtime, ids: Ids, request: DiffRequest) -> StateDiff:
    return await rt.diff(
        request.a, request.b, patch=request.patch, include_tmp=request.include_tmp,
        exclude=request.exclude,
    )  # fmt: skip


async def _history(rt: Runtime, ids: Ids, request: None) -> list[HistoryStep]:
    return await rt.history(ids["session_id"])


async def _undo(rt: Runtime, ids: Ids, request: UndoRequest) -> Session:
    return await rt.undo(ids["session_id"], request.steps)


async def _type_into_terminal(rt: Runtime, ids: Ids, request: TerminalInputRequest) -> None:
    await rt.send_stdin(ids["session_id"], ids["pid"], base64.b64decode(request.data))


async def _resize_terminal(rt: Runtime, ids: Ids, request: TerminalSizeRequest) -> None:
    await rt.resize_process(ids["session_id"], ids["pid"], PtySize(request.cols, request.rows))


async def _close_terminal(rt: Runtime, ids: Ids, request: None) -> None:
    await rt.signal_process(ids["session_id"], ids["pid"], "KILL")


async def _create_watcher(rt: Runtime, ids: Ids, request: WatchRequest) -> Watcher:
    return await rt.create_watcher(ids["session_id"], **request.model_dump())


async def _watcher_events(rt: Runtime, ids: Ids, request: WatcherEventsRequest) -> list[FileEvent]:
    return await rt.watcher_events(ids["session_id"], ids["watcher_id"], wait=request.wait)


async def _remove_watcher(rt: Runtime, ids: Ids, request: None) -> None:
    await rt.remove_watcher(ids["session_id"], ids["watcher_id"])


async def _metrics(rt: Runtime, ids: Ids, request: MetricsRequest) -> list[Metric]:
    return await rt.metrics(ids["session_id"], request.start, request.end)


async def _events(rt: Runtime, ids: Ids, request: EventsRequest) -> list[Event]:
    return await rt.events(request.after, request.session, request.wait, request.limit)


async def _processes(rt: Runtime, ids: Ids, request: None) -> list[Process]:
    return await rt.ps(ids["session_id"])


async def _host_status(rt: Runtime, ids: Ids, request: None) -> HostStatus:
    return await asyncio.to_thread(rt.host_status)


async def _restore_status(rt: Runtime, ids: Ids, request: None) -> GuestRestore:
    return await rt.restore_status(ids["session_id"])


async def _forward_port(rt: Runtime, ids: Ids, request: PortRequest) -> Port:
    return await rt.forward_port(ids["session_id"], request.guest_port)


async def _checkpoint(rt: Runtime, ids: Ids, request: CheckpointRequest) -> Checkpoint:
    return await rt.checkpoint(ids["session_id"], request.name)


async def _get_checkpoint(rt: Runtime, ids: Ids, request: None) -> Checkpoint:
    return await asyncio.to_thread(rt.get_checkpoint, ids["checkpoint_id"])


async def _remove_checkpoint(rt: Runtime, ids: Ids, request: None) -> None:
    await rt.remove_checkpoint(ids["checkpoint_id"])


async def _fork(rt: Runtime, ids: Ids, request: ForkRequest) -> list[Session | ErrorResponse]:
    results = await rt.fork(ids["checkpoint_id"], request.count, spread=request.spread)
    return [ErrorResponse.of(r) if isinstance(r, ForkpointError) else r for r in results]


async def _push(rt: Runtime, ids: Ids, request: PushRequest) -> CheckpointTransfer:
    return await rt.push_checkpoint(ids["checkpoint_id"], request.to)


async def _pull(rt: Runtime, ids: Ids, request: PullRequest) -> CheckpointTransfer:
    return await rt.pull_checkpoint(request.ref, request.source)


async def _verify(rt: Runtime, ids: Ids, request: None) -> list[FileCheck]:
    return await asyncio.to_thread(rt.verify_checkpoint, ids["checkpoint_id"])


async def _recover(rt: Runtime, ids: Ids, request: None) -> list[Session | ErrorResponse]:
    results = await rt.recover()
    return [ErrorResponse.of(r) if isinstance(r, ForkpointError) else r for r in results]


async def _list_images(rt: Runtime, ids: Ids, request: None) -> list[ImageInfo]:
    return await asyncio.to_thread(rt.images)


async def _build_image(rt: Runtime, ids: Ids, request: ImageBuildRequest) -> ImageInfo:
    return await rt.build_image(request)


async def _remove_image(rt: Runtime, ids: Ids, request: None) -> list[str]:
    return await rt.remove_image(ids["image"])


async def _create_volume(rt: Runtime, ids: Ids, request: CreateVolumeRequest) -> Volume:
    return await rt.create_volume(request.name)


async def _list_volumes(rt: Runtime, ids: Ids, request: None) -> list[Volume]:
    return await asyncio.to_thread(rt.list_volumes)


async def _get_volume(rt: Runtime, ids: Ids, request: None) -> Volume:
    return await asyncio.to_thread(rt.get_volume, ids["volume"])


async def _remove_volume(rt: Runtime, ids: Ids, request: None) -> None:
    await rt.remove_volume(ids["volume"])


async def _volume_entries(
    rt: Runtime, ids: Ids, request: VolumeEntriesRequest
) -> list[VolumeEntry]:
    return await rt.volume_list(ids["volume"], request.path, request.depth)


async def _volume_stat(rt: Runtime, ids: Ids, request: VolumePathRequest) -> VolumeEntry:
    return await rt.volume_stat(ids["volume"], request.path)


async def _read_volume_file(rt: Runtime, ids: Ids, request: VolumePathRequest) -> VolumeFile:
    return await rt.volume_read_file(ids["volume"], request.path)


async def _write_volume_file(rt: Runtime, ids: Ids, request: VolumeWriteRequest) -> VolumeEntry:
    return await rt.volume_write(
        ids["volume"], request.path, request.content(), force=request.force, mode=request.mode,
        uid=request.uid, gid=request.gid,
    )  # fmt: skip


async def _volume_make_dir(rt: Runtime, ids: Ids, request: VolumeDirRequest) -> VolumeEntry:
    return await rt.volume_make_dir(
        ids["volume"], request.path, force=request.force, mode=request.mode, uid=request.uid,
        gid=request.gid,
    )  # fmt: skip


async def _volume_set_metadata(
    rt: Runtime, ids: Ids, request: VolumeMetadataRequest
) -> VolumeEntry:
    return await rt.volume_set_metadata(
        ids["volume"], request.path, mode=request.mode, uid=request.uid, gid=request.gid
    )


async def _volume_remove(rt: Runtime, ids: Ids, request: VolumePathRequest) -> None:
    await rt.volume_remove(ids["volume"], request.path)


# -- the table -----------------------------------------------------------------------------

_S = "/sessions/{session_id}"
_V = "/volumes/{volume}"
_C = "/checkpoints/{checkpoint_id:checkpoint_ref}"

OPERATIONS: tuple[Op, ...] = (
    Op(
        "create_session", "POST", "/sessions", _create, "Create a session", "sessions",
        CreateSessionRequest, Session, status=201, cost=Cost.CREATE, mcp=True,
        description="Create a session (a microVM) from an image; ``ports`` are guest ports "
        "to forward to the host's 127.0.0.1. The guest reaches the internet but not the "
        "host, private or link-local addresses; ``allow_net``/``deny_net`` (CIDRs, or host "
        "names judged by the name each HTTP or TLS connection asks for) adjust that. "
        "``timeout_s``: seconds until it is removed (or paused: ``on_expiry``). "
        "``disk_mib``: its virtual "
        "disk's size. ``history``: checkpoint automatically before every exec and file "
        "write, so `undo` can take steps back (``history_keep`` of them). ``volumes``: "
        "{guest path: volume} to mount; a volume is outside every checkpoint (forks share "
        "it, a rollback does not undo it). Returns the session (id, ports with URLs, ...).",
    ),
    Op("list_images", "GET", "/images", _list_images, "List images", "images",
       response=list[ImageInfo], mcp=True,
       description="Each guest image's newest build: what sessions can be created from."),
    Op(
        "build_image", "POST", "/images", _build_image, "Build an image", "images",
        ImageBuildRequest, ImageInfo, status=201, mcp=True,
        description="Build a guest image (cached by content; minutes when new): a minimal "
        "Debian plus ``packages``, or a ``dockerfile`` built with podman, ``files`` its "
        "context (path -> base64). Its CMD runs in every session from the start; LABEL "
        "dev.forkpoint.ready-cmd=<shell command> makes the boot wait until it succeeds. "
        "RUN steps run as root on the host, as docker build's do.",
    ),
    Op("remove_image", "DELETE", "/images/{image}", _remove_image, "Remove an image", "images",
       response=list[str],
       description="Every build of the image, unless a session or checkpoint needs it."),
    Op("list_sessions", "GET", "/sessions", _list_sessions, "List sessions", "sessions",
       response=list[Session], mcp=True,
       description="Every session with its state and forwarded ports."),
    Op("get_session", "GET", _S, _get_session, "Show a session", "sessions", response=Session),
    Op("remove_session", "DELETE", _S, _remove_session, "Remove a session", "sessions",
       status=204),
    Op(
        "set_timeout", "POST", f"{_S}/timeout", _set_timeout, "Set a session's lifetime",
        "sessions", TimeoutRequest, Session,
        description="The session's lifetime ends ``timeout_s`` seconds from now (null: "
        "never); then it is removed, or paused (``on_expiry``).",
    ),
    Op(
        "set_egress", "PUT", f"{_S}/egress", _set_egress, "Set where a session's guest may "
        "connect", "sessions", EgressRequest, Session, mcp=True,
        description="Replace the session's egress adjustments: ``allow_net``/``deny_net`` "
        "(CIDRs, or host names such as pypi.org or *.example.com, judged by the name each "
        "HTTP or TLS connection asks for; an allowed name beats a denied one) on top of the "
        "defaults (internet yes; host, private and link-local addresses no); empty lists "
        "restore the defaults. A running guest is held to them "
        "at once for every new connection.",
    ),
    Op(
        "pause", "POST", f"{_S}/pause", _pause, "Pause a session", "sessions",
        PauseRequest, Session, cost=Cost.CHECKPOINT, mcp=True,
        description="Checkpoint the session and stop its VM; resume brings it back as it was "
        "(same id and ports, processes at the same PIDs). A paused session never expires. "
        "keep_memory=false keeps only its disk: resume then boots it anew from that disk "
        "(same id and ports, its processes started afresh).",
    ),
    Op(
        "resume", "POST", f"{_S}/resume", _resume, "Resume a paused session", "sessions",
        response=Session, cost=Cost.ROLLBACK, mcp=True,
        description="Bring a paused session back from the checkpoint it was paused at.",
    ),
    Op(
        "rollback", "POST", f"{_S}/rollback", _rollback, "Roll a session back", "sessions",
        RollbackRequest, Session, cost=Cost.ROLLBACK,
        description="Reset the session (same id and ports) to a checkpoint (default: its "
        "latest), processes included.",
    ),
    Op(
        "rollback_preview", "POST", f"{_S}/rollback/preview", _rollback_preview,
        "Preview a rollback", "history", RollbackPreviewRequest, StateDiff, cost=Cost.PREVIEW,
        description="What the rollback would undo (files, processes, listening ports); "
        "changes nothing.",
    ),
    Op(
        "diff", "POST", "/diff", _diff, "Diff two checkpoints or sessions", "history",
        DiffRequest, StateDiff, cost=Cost.DIFF, mcp=True,
        description="What changed between two checkpoints or sessions: files "
        "added/removed/modified (path, size, mode; with patch=true a unified diff of small "
        "text files), processes started/gone (pid, command) and listening ports "
        "opened/closed. Only a: a session is compared with its latest checkpoint (what a "
        "rollback would undo), a checkpoint with its session now. /proc, /sys, /dev, /run, "
        "/tmp and /etc/hostname are left out.",
    ),
    Op("history", "GET", f"{_S}/history", _history, "A session's steps", "history",
       response=list[HistoryStep], mcp=True,
       description="The steps of a session created with history=true, oldest first: for "
       "each, the checkpoint taken just before it, its label (the command, or the path "
       "written), its time, the disk space it costs and the forks started from it."),
    Op(
        "undo", "POST", f"{_S}/undo", _undo, "Undo steps", "history", UndoRequest, Session,
        cost=Cost.ROLLBACK, mcp=True,
        description="Undo the last step(s) of a session created with history=true: roll it "
        "back to the checkpoint taken before them, including processes they killed or "
        "started and files they wrote or deleted. steps=2 undoes the last two "
        "commands/writes.",
    ),
    Op(
        "metrics", "GET", f"{_S}/metrics", _metrics, "A session's metrics", "sessions",
        MetricsRequest, list[Metric], mcp=True,
        description="CPU, memory and disk of a running session, sampled every 5 s by a "
        "long-lived door (serve, MCP, E2B) and kept an hour; start/end bound the time.",
    ),
    Op(
        "events", "GET", "/events", _events, "What happened to sessions", "sessions",
        EventsRequest, list[Event], mcp=True,
        description="Sessions' lifecycle events in order (created, forked, checkpointed, "
        "rolled_back, paused, resumed, removed, expired, restore_hook_failed), whoever "
        "caused them; ask again "
        "with after=<the last id seen>; wait (s) waits for the next. GET /v1/events/stream "
        "is the same as server-sent events.",
    ),
    Op("processes", "GET", f"{_S}/processes", _processes, "A session's processes",
       "commands", response=list[Process]),
    Op(
        "host_status", "GET", "/host", _host_status, "The host's room against the limits",
        "sessions", response=HostStatus, mcp=True,
        description="How many sessions run and may run, the host's memory (available, "
        "and given to running guests) and free disk against the reserve, and the VMs "
        "started ahead (warm VMs, rollback standbys): whether there is room for more.",
    ),
    Op(
        "restore_status", "GET", f"{_S}/restore", _restore_status,
        "What the guest made of its latest restore", "commands", response=GuestRestore,
        mcp=True,
        description="The guest's view of its latest restore (create, fork, rollback, "
        "resume): its generation, the processes it signalled (those registered under "
        "/run/forkpoint/notify, e.g. with forkpoint_guest.on_restore) and each "
        "/etc/forkpoint/restore.d hook's exit status.",
    ),
    Op("type_into_terminal", "POST", f"{_S}/terminals/{{pid}}/input", _type_into_terminal,
       "Type into a terminal", "terminals", TerminalInputRequest, status=204),
    Op("resize_terminal", "POST", f"{_S}/terminals/{{pid}}/size", _resize_terminal,
       "Resize a terminal (its program gets SIGWINCH)", "terminals", TerminalSizeRequest,
       status=204),
    Op("close_terminal", "DELETE", f"{_S}/terminals/{{pid}}", _close_terminal,
       "Close a terminal (its process group is killed)", "terminals", status=204),
    Op(
        "create_watcher", "POST", f"{_S}/watchers", _create_watcher,
        "Watch a directory for changes", "files", WatchRequest, Watcher, status=201,
        mcp=True,
        description="Watch a guest directory (recursive: its subdirectories too); then "
        "watcher_events returns what changed (create, write, remove, rename, chmod).",
    ),
    Op(
        "watcher_events", "POST", f"{_S}/watchers/{{watcher_id}}/events", _watcher_events,
        "A watcher's changes since it was last asked", "files", WatcherEventsRequest,
        list[FileEvent], mcp=True,
        description="The changes a watcher saw since it was last asked, in order; with "
        "wait (s), waits for the first when there is none yet.",
    ),
    Op("remove_watcher", "DELETE", f"{_S}/watchers/{{watcher_id}}", _remove_watcher,
       "Stop watching", "files", status=204, mcp=True,
       description="Stop a watcher."),
    Op(
        "forward_port", "POST", f"{_S}/ports", _forward_port, "Forward a guest port", "ports",
        PortRequest, Port, mcp=True,
        description="Forward a guest port to http://127.0.0.1:<host_port> on the host.",
    ),
    Op(
        "checkpoint", "POST", f"{_S}/checkpoints", _checkpoint, "Checkpoint a session",
        "checkpoints", CheckpointRequest, Checkpoint, status=201, cost=Cost.CHECKPOINT,
        mcp=True,
        description="Checkpoint a running session: memory, disk and every live process.",
    ),
    Op("get_checkpoint", "GET", _C, _get_checkpoint, "Show a checkpoint", "checkpoints",
       response=Checkpoint),
    Op("remove_checkpoint", "DELETE", _C, _remove_checkpoint, "Remove a checkpoint",
       "checkpoints", status=204),
    Op(
        "fork", "POST", f"{_C}/fork", _fork,
        "Start sessions from a checkpoint; a failed fork is an error in its slot",
        "checkpoints", ForkRequest, list[Session | ErrorResponse], cost=Cost.FORK, mcp=True,
        description="Start ``count`` new sessions from a checkpoint; each wakes up with the "
        "same processes running. A failed fork is reported as an error in its slot.",
    ),
    Op(
        "push_checkpoint", "POST", f"{_C}/push", _push, "Push a checkpoint", "checkpoints",
        PushRequest, CheckpointTransfer, mcp=True,
        description="Upload a checkpoint, with what the bucket lacks of its lineage, to an "
        "S3-compatible store (s3://BUCKET/PREFIX); its id and name become refs to its "
        "content digest. Endpoint and credentials: the server's own AWS variables.",
    ),
    Op(
        "pull_checkpoint", "POST", "/checkpoints/pull", _pull, "Pull a checkpoint",
        "checkpoints", PullRequest, CheckpointTransfer, status=201, mcp=True,
        description="Download checkpoint ``ref`` (sha256:<digest>, or the id or name it was "
        "pushed under) from s3://BUCKET/PREFIX ``from`` into this home, verified; then fork "
        "it. Refused (409 incompatible_checkpoint) before any RAM moves if this host cannot "
        "restore it.",
    ),
    Op(
        "verify_checkpoint", "POST", f"{_C}/verify", _verify, "Verify a checkpoint's files",
        "checkpoints", response=list[FileCheck], mcp=True,
        description="Hash every file of a checkpoint against its manifest: one verdict per "
        "file (ok, or what is wrong). A damaged manifest is a 409 damaged_checkpoint.",
    ),
    Op(
        "recover_sessions", "POST", "/recover", _recover,
        "Bring back every crashed session", "sessions",
        response=list[Session | ErrorResponse], mcp=True,
        description="Roll every crashed session back to its latest checkpoint (same id, "
        "same ports), e.g. after the host restarted; one slot per session, a failure as an "
        "error in its slot.",
    ),
    Op(
        "create_volume", "POST", "/volumes", _create_volume, "Create a volume", "volumes",
        CreateVolumeRequest, Volume, status=201, mcp=True,
        description="A directory on the host that outlives sessions, for files an agent "
        "keeps. It is outside every checkpoint: forks share it, a rollback does not undo it.",
    ),
    Op("list_volumes", "GET", "/volumes", _list_volumes, "List volumes", "volumes",
       response=list[Volume], mcp=True,
       description="Every volume with the space its files take."),
    Op("get_volume", "GET", _V, _get_volume, "Show a volume", "volumes", response=Volume),
    Op("remove_volume", "DELETE", _V, _remove_volume, "Remove a volume", "volumes",
       status=204, description="The volume and every file in it (refused while mounted)."),
    Op("volume_entries", "GET", f"{_V}/entries", _volume_entries, "List a volume directory",
       "volumes", VolumeEntriesRequest, list[VolumeEntry], mcp=True,
       description="The entries below a directory of a volume, depth levels deep."),
    Op("volume_stat", "GET", f"{_V}/stat", _volume_stat, "Describe a volume path", "volumes",
       VolumePathRequest, VolumeEntry),
    Op("read_volume_file", "GET", f"{_V}/files", _read_volume_file, "Read a volume file",
       "volumes", VolumePathRequest, VolumeFile, mcp=True,
       description="A file of a volume: its entry and its content (base64)."),
    Op("write_volume_file", "PUT", f"{_V}/files", _write_volume_file, "Write a volume file",
       "volumes", VolumeWriteRequest, VolumeEntry, mcp=True,
       description="Write a file of a volume (data: base64); its directory must exist, "
       "force=true replaces an existing file. The new content appears whole."),
    Op("volume_make_dir", "POST", f"{_V}/dirs", _volume_make_dir, "Make a volume directory",
       "volumes", VolumeDirRequest, VolumeEntry, status=201,
       description="force=true: its parents too, and an existing directory is fine."),
    Op("volume_set_metadata", "PATCH", f"{_V}/entries", _volume_set_metadata,
       "Change a volume path's mode or owner", "volumes", VolumeMetadataRequest, VolumeEntry),
    Op("volume_remove", "POST", f"{_V}/remove", _volume_remove, "Remove a volume path",
       "volumes", VolumePathRequest, status=204, mcp=True,
       description="A file, or a directory with everything in it."),
)  # fmt: skip

#: The operations each door wires by hand (see the module's docstring).
BY_HAND = (
    "health", "exec_command", "kill_process", "read_file", "write_file", "remove_file",
    "list_files", "list_checkpoints", "list_operations", "get_operation", "open_terminal",
    "connect_terminal", "stream_events",
)  # fmt: skip

_BY_NAME = {op.name: op for op in OPERATIONS}


def operation(name: str) -> Op:
    """The declared operation ``name``."""
    return _BY_NAME[name]


async def admit(op: Op, admission: Admission, ids: Ids, request: Any) -> tuple[Ticket, str | None]:
    """The ticket ``op`` needs (its ids looked up first: an unknown one is a ``NotFound``,
    never a ``Busy``) and the id its long operation works on."""
    if op.cost is Cost.CREATE:
        return await admission.create(), None
    if op.cost is Cost.FORK:
        ticket, source = await admission.fork(ids["checkpoint_id"], request.count)
        return ticket, source.id
    if op.cost is Cost.CHECKPOINT:
        ticket, session = await admission.checkpoint(ids["session_id"])
        return ticket, session.id
    if op.cost is Cost.ROLLBACK:
        ticket, session = await admission.rollback(ids["session_id"])
        return ticket, session.id
    if op.cost is Cost.PREVIEW:
        await asyncio.to_thread(admission.lookups.get, ids["session_id"])
        return await admission.scratch(1), None
    if op.cost is Cost.DIFF:
        forks = await asyncio.to_thread(admission.lookups.diff_forks, request.a, request.b)
        return await admission.scratch(forks), None
    return admission.free(), None
