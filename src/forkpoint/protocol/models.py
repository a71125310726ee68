"""Typed args and results of every op, shared by the host client and the guest agent.

Units: times in ns or ms as named, timeouts in seconds, sizes in bytes, modes as ints.
Validation lives in ``__post_init__`` (raising ValueError, which decoding turns into
BadArguments) so both sides refuse the same things.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

__all__ = [
    "CHUNK_BYTES",
    "EXEC_MAX_OUTPUT_BYTES",
    "OPS",
    "DirEntry",
    "Empty",
    "ExecArgs",
    "ExecResult",
    "HelloArgs",
    "HelloResult",
    "KillArgs",
    "ListDirArgs",
    "MakeDirArgs",
    "MakeDirResult",
    "PidArgs",
    "ProcEndResult",
    "ProcInputArgs",
    "ProcListResult",
    "ProcResizeArgs",
    "ProcSignalArgs",
    "ProcStartArgs",
    "PtySize",
    "ProcAttachArgs",
    "RenameArgs",
    "StreamCancelArgs",
    "StreamCreditArgs",
    "TrackedProcessInfo",
    "TunnelArgs",
    "TunnelEndResult",
    "TunnelOpenArgs",
    "TunnelWriteArgs",
    "STREAM_WINDOW_BYTES",
    "STREAM_READ_BYTES",
    "ListDirResult",
    "Op",
    "PathArgs",
    "ProcessInfo",
    "GuestStats",
    "PsResult",
    "ListeningSocket",
    "ScanArgs",
    "ScanResult",
    "ReadFileArgs",
    "ReadFileResult",
    "check_metadata",
    "RemoveArgs",
    "RemoveResult",
    "RestoreIdentityArgs",
    "RestoreIdentityResult",
    "RestoreFacts",
    "RestoreStatus",
    "RestoreStatusArgs",
    "HookRun",
    "RESTORE_EVENTS",
    "RESTORE_LISTENERS_PORT",
    "VOLUMES_PORT",
    "MAX_HOOK_TIMEOUT_S",
    "SpawnArgs",
    "SpawnResult",
    "StatArgs",
    "StatResult",
    "WriteBeginArgs",
    "WriteBeginResult",
    "WriteChunkArgs",
    "WriteChunkResult",
    "WriteCommitArgs",
    "WriteCommitResult",
    "WriteHandleArgs",
    "WATCH_EVENT_TYPES",
    "WatchDirArgs",
    "WatchEndResult",
    "WatchEvent",
    "WatchFlushArgs",
]

CHUNK_BYTES: Final = 256 * 1024  # file data per chunk event / write_chunk request
EXEC_MAX_OUTPUT_BYTES: Final = 1024 * 1024  # collected stdout (and stderr) cap per exec
MAX_ENTROPY_BYTES: Final = 4096
# Flow control of long-lived streams (process output, tunnels): the agent sends at most
# this many bytes a stream's host has not yet acknowledged with stream_credit, plus one read.
STREAM_WINDOW_BYTES: Final = 1024 * 1024
STREAM_READ_BYTES: Final = 64 * 1024  # the most one stdout/stderr/data event carries
MAX_LIST_DEPTH: Final = 16
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\$?$")
_HOSTNAME_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*$")
_MIN_TIME_NS = 946_684_800 * 10**9  # 2000-01-01: anything earlier is a bug on the host
_MAX_TIME_NS = 7_258_118_400 * 10**9  # 2200-01-01


class Op(StrEnum):
    HELLO = "hello"
    EXEC = "exec"
    SPAWN = "spawn"
    READ_FILE = "read_file"
    WRITE_BEGIN = "write_begin"
    WRITE_CHUNK = "write_chunk"
    WRITE_COMMIT = "write_commit"
    WRITE_ABORT = "write_abort"
    LIST_DIR = "list_dir"
    STAT = "stat"
    REMOVE = "remove"
    PS = "ps"
    KILL = "kill"
    RESTORE_IDENTITY = "restore_identity"
    # the envd-like process model: processes the agent owns, streams one can re-attach to
    PROC_START = "proc_start"
    PROC_ATTACH = "proc_attach"
    PROC_INPUT = "proc_input"
    PROC_CLOSE_STDIN = "proc_close_stdin"
    PROC_SIGNAL = "proc_signal"
    PROC_LIST = "proc_list"
    PROC_RESIZE = "proc_resize"  # a PTY's window size
    # flow control and cancellation of a stream (proc_start/proc_attach/tunnel_open)
    STREAM_CREDIT = "stream_credit"
    STREAM_CANCEL = "stream_cancel"
    # a TCP connection to 127.0.0.1:port in the guest, carried over this channel
    TUNNEL_OPEN = "tunnel_open"
    TUNNEL_WRITE = "tunnel_write"
    TUNNEL_SHUTDOWN = "tunnel_shutdown"
    MAKE_DIR = "make_dir"
    RENAME = "rename"
    SCAN = "scan"
    # a directory's changes (inotify), streamed; flushed on request
    WATCH_DIR = "watch_dir"
    WATCH_FLUSH = "watch_flush"
    # the guest's memory and root filesystem use, for a session's metrics
    STATS = "stats"
    # what the guest made of its latest restore: generation, processes told, hooks run
    RESTORE_STATUS = "restore_status"


def _check_path(path: str, what: str = "path") -> None:
    if not path.startswith("/"):
        raise ValueError(f"{what} must be absolute: {path!r}")
    if "\x00" in path:
        raise ValueError(f"{what} must not contain NUL bytes")
    if len(path) > 4096:
        raise ValueError(f"{what} is longer than 4096 characters")


def _check_command(argv: list[str] | None, shell: str | None) -> None:
    if (argv is None) == (shell is None):
        raise ValueError("give exactly one of argv (list) or shell (string)")
    if argv is not None and not argv:
        raise ValueError("argv must not be empty")
    for s in [*(argv or []), shell or ""]:
        if "\x00" in s:
            raise ValueError("command must not contain NUL bytes")


def _check_env(env: dict[str, str]) -> None:
    for k, v in env.items():
        if not k or "=" in k or "\x00" in k or "\x00" in v:
            raise ValueError(f"invalid environment variable name or value: {k!r}")


def _check_user(user: str | None) -> None:
    if user is not None and not _USER_RE.match(user):
        raise ValueError(f"invalid user name: {user!r}")


_METADATA_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
_METADATA_VALUE_RE = re.compile(r"^[\x20-\x7e]{0,4000}$")


def check_metadata(metadata: Mapping[str, str] | None) -> None:
    """Keys: letters, digits, ``_.-``; values: printable US-ASCII (what E2B's SDK allows,
    and what fits in the ``X-Metadata-<key>`` headers that carry them).

    :raises ValueError:
    """
    for key, value in (metadata or {}).items():
        if not _METADATA_KEY_RE.match(key):
            raise ValueError(f"invalid metadata key {key!r}: use letters, digits, '_', '.', '-'")
        if not _METADATA_VALUE_RE.match(value):
            raise ValueError(f"invalid metadata value for {key!r}: printable US-ASCII only")


def _check_window(window: int) -> None:
    if not STREAM_READ_BYTES <= window <= 64 * STREAM_WINDOW_BYTES:
        raise ValueError(f"window must be {STREAM_READ_BYTES}..{64 * STREAM_WINDOW_BYTES} bytes")


@dataclass(frozen=True, slots=True)
class Empty:
    """Args or result of ops that carry nothing."""


@dataclass(frozen=True, slots=True)
class HelloArgs:
    """``identity``: apply this restore identity first, unless its token already was."""

    nonce: str
    protocol_version: int
    identity: RestoreIdentityArgs | None = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.nonce) <= 128:
            raise ValueError("nonce must be 1..128 characters")


@dataclass(frozen=True, slots=True)
class HelloResult:
    """``identity_token``: the token of the last restore identity applied (None: none)."""

    nonce: str
    protocol_version: int
    pid: int
    hostname: str
    boot_id: str
    identity_token: str | None = None


@dataclass(frozen=True, slots=True)
class ExecArgs:
    """Run a command to completion. ``timeout`` in seconds (None: no limit)."""

    argv: list[str] | None = None
    shell: str | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    stdin: bytes | None = None
    timeout: float | None = None
    stream: bool = False  # send stdout/stderr events while running
    max_output: int = EXEC_MAX_OUTPUT_BYTES
    user: str | None = None  # None: the image's USER (OCI images), else root

    def __post_init__(self) -> None:
        _check_command(self.argv, self.shell)
        if self.cwd is not None:
            _check_path(self.cwd, "cwd")
        _check_env(self.env)
        _check_user(self.user)
        if self.timeout is not None and not 0 < self.timeout <= 7 * 86400:
            raise ValueError("timeout must be > 0 and at most 7 days (seconds)")
        if not 0 <= self.max_output <= EXEC_MAX_OUTPUT_BYTES:
            raise ValueError(f"max_output must be 0..{EXEC_MAX_OUTPUT_BYTES} bytes")


@dataclass(frozen=True, slots=True)
class ExecResult:
    """``exit_code`` is 128+signal when killed by a signal (then ``signal`` is set).

    ``stdout``/``stderr`` hold at most ``max_output`` bytes each; ``truncated`` says
    whether more was produced (all of it was still streamed).
    """

    exit_code: int
    signal: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    duration_ms: float
    pid: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class SpawnArgs:
    """Start a detached background command (own session, output to a log file)."""

    argv: list[str] | None = None
    shell: str | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None  # None: the image's USER (OCI images), else root

    def __post_init__(self) -> None:
        _check_command(self.argv, self.shell)
        if self.cwd is not None:
            _check_path(self.cwd, "cwd")
        _check_env(self.env)
        _check_user(self.user)


@dataclass(frozen=True, slots=True)
class SpawnResult:
    pid: int
    log_path: str


@dataclass(frozen=True, slots=True)
class PathArgs:
    path: str

    def __post_init__(self) -> None:
        _check_path(self.path)


ReadFileArgs = PathArgs


@dataclass(frozen=True, slots=True)
class ListDirArgs:
    """``depth`` 1: the directory's entries; 2: also its subdirectories' entries, ..."""

    path: str
    depth: int = 1

    def __post_init__(self) -> None:
        _check_path(self.path)
        if not 1 <= self.depth <= MAX_LIST_DEPTH:
            raise ValueError(f"depth must be 1..{MAX_LIST_DEPTH}")


@dataclass(frozen=True, slots=True)
class ReadFileResult:
    """Sent after the file's bytes went out as ``chunk`` events."""

    size: int


@dataclass(frozen=True, slots=True)
class WriteBeginArgs:
    """Open an upload: data goes to a temp file next to ``path``, renamed on commit."""

    path: str
    mode: int = 0o644
    make_parents: bool = True
    user: str | None = None  # the file (and parents it creates) belong to this user
    #: Stored on the file as ``user.e2b.<key>`` extended attributes (keys lowercased); a
    #: write replaces the file, so its old metadata goes with it.
    metadata: dict[str, str] | None = None

    def __post_init__(self) -> None:
        _check_path(self.path)
        if not 0 <= self.mode <= 0o7777:
            raise ValueError("mode must be between 0 and 0o7777")
        _check_user(self.user)
        check_metadata(self.metadata)


@dataclass(frozen=True, slots=True)
class WriteBeginResult:
    handle: str


@dataclass(frozen=True, slots=True)
class WriteChunkArgs:
    """Write ``data`` at byte ``offset`` (chunks may arrive in any order)."""

    handle: str
    offset: int
    data: bytes

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ValueError("offset must be >= 0")


@dataclass(frozen=True, slots=True)
class WriteChunkResult:
    written: int


@dataclass(frozen=True, slots=True)
class WriteCommitArgs:
    """Check the size (bytes), set the mode and rename into place."""

    handle: str
    size: int


@dataclass(frozen=True, slots=True)
class WriteCommitResult:
    path: str
    size: int


@dataclass(frozen=True, slots=True)
class WriteHandleArgs:
    handle: str


@dataclass(frozen=True, slots=True)
class DirEntry:
    """``type``: file, dir, symlink or other. ``mtime_ns`` in ns since the epoch.

    ``mode``: the permission bits. Newer agents also fill ``path`` (absolute), ``owner``
    and ``group`` (names, or the number when it has none) and ``target`` (a symlink's).
    """

    name: str
    type: str
    size: int
    mode: int
    mtime_ns: int
    path: str | None = None
    owner: str | None = None
    group: str | None = None
    target: str | None = None
    metadata: dict[str, str] | None = None  # its ``user.e2b.*`` extended attributes


@dataclass(frozen=True, slots=True)
class ListDirResult:
    entries: list[DirEntry]


@dataclass(frozen=True, slots=True)
class StatArgs:
    path: str
    follow_symlinks: bool = True

    def __post_init__(self) -> None:
        _check_path(self.path)


@dataclass(frozen=True, slots=True)
class StatResult:
    path: str
    type: str
    size: int
    mode: int
    mtime_ns: int
    uid: int
    gid: int
    owner: str | None = None  # as in DirEntry
    group: str | None = None
    target: str | None = None
    metadata: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class RemoveArgs:
    """Remove a file, symlink or directory (a non-empty one only with ``recursive``)."""

    path: str
    recursive: bool = True

    def __post_init__(self) -> None:
        _check_path(self.path)
        if self.path.rstrip("/") == "":
            raise ValueError("refusing to remove /")


@dataclass(frozen=True, slots=True)
class RemoveResult:
    path: str
    type: str


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    ppid: int
    cmd: str


@dataclass(frozen=True, slots=True)
class GuestStats:
    """Bytes, as the guest's kernel counts them: RAM (``/proc/meminfo``: total, available,
    page cache) and the root filesystem (``statvfs``: total, used)."""

    mem_total: int
    mem_available: int
    mem_cached: int
    disk_total: int
    disk_used: int


@dataclass(frozen=True, slots=True)
class PsResult:
    processes: list[ProcessInfo]


@dataclass(frozen=True, slots=True)
class KillArgs:
    """Send signal number ``signal`` to ``pid`` (to its process group with ``group``)."""

    pid: int
    signal: int = 15
    group: bool = False

    def __post_init__(self) -> None:
        if self.pid <= 1:
            raise ValueError("pid must be > 1 (refusing to signal init or a process group)")
        if not 0 <= self.signal <= 64:
            raise ValueError("signal must be 0..64")


#: What a restore was, as the guest's processes are told (``RestoreFacts.event``).
RESTORE_EVENTS: Final = ("create", "fork", "rollback", "resume")
#: The virtio-serial port a guest holds open while it has processes or hooks to tell of a
#: restore: QEMU shows the host whether it is open, with no round trip to the guest.
RESTORE_LISTENERS_PORT: Final = "restore-listeners"
#: The virtio-serial port of a guest's volume mounts (``guest/volumes.py``).
VOLUMES_PORT: Final = "volumes"
#: The longest one restore hook may be given.
MAX_HOOK_TIMEOUT_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class RestoreFacts:
    """What a restore was, for the guest's processes: ``event`` (one of
    :data:`RESTORE_EVENTS`), the ``checkpoint`` it came from and the ``session`` the VM is
    now; ``hook_timeout_s``: how long each hook in ``/etc/forkpoint/restore.d`` may run."""

    event: str
    session: str
    checkpoint: str
    hook_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.event not in RESTORE_EVENTS:
            raise ValueError(f"event must be one of {', '.join(RESTORE_EVENTS)}")
        for name in ("session", "checkpoint"):
            if not 1 <= len(getattr(self, name)) <= 128:
                raise ValueError(f"{name} must be 1..128 characters")
        if not 0 < self.hook_timeout_s <= MAX_HOOK_TIMEOUT_S:
            raise ValueError(f"hook_timeout_s must be in (0, {MAX_HOOK_TIMEOUT_S:g}]")


@dataclass(frozen=True, slots=True)
class RestoreIdentityArgs:
    """Fresh identity after a restore: wall clock (ns since the epoch), entropy, hostname.

    ``token`` names the restore it belongs to: an agent applies each token once.
    ``restore``: what the restore was; the agent then tells the guest's processes (see
    ``guest/restore.py``).
    """

    time_ns: int
    entropy: bytes
    hostname: str | None = None
    token: str | None = None
    restore: RestoreFacts | None = None

    def __post_init__(self) -> None:
        if not _MIN_TIME_NS <= self.time_ns <= _MAX_TIME_NS:
            raise ValueError("time_ns must be ns since the epoch between 2000 and 2200")
        if not 16 <= len(self.entropy) <= MAX_ENTROPY_BYTES:
            raise ValueError(f"entropy must be 16..{MAX_ENTROPY_BYTES} bytes")
        if self.hostname is not None and (
            len(self.hostname) > 64 or not _HOSTNAME_RE.match(self.hostname)
        ):
            raise ValueError(f"invalid hostname: {self.hostname!r}")
        if self.token is not None and not 1 <= len(self.token) <= 128:
            raise ValueError("token must be 1..128 characters")


@dataclass(frozen=True, slots=True)
class RestoreIdentityResult:
    """``clock_delta_ns``: new minus old wall clock. ``dry_run``: validated only."""

    clock_set: bool
    clock_delta_ns: int
    entropy_bytes: int
    reseeded: bool
    hostname: str | None
    dry_run: bool


@dataclass(frozen=True, slots=True)
class RestoreStatusArgs:
    """Wait up to ``wait_s`` for the latest restore's hooks to finish."""

    wait_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.wait_s <= 2 * MAX_HOOK_TIMEOUT_S:
            raise ValueError(f"wait_s must be 0..{2 * MAX_HOOK_TIMEOUT_S:g}")


@dataclass(frozen=True, slots=True)
class HookRun:
    """One restore hook's run: its file name, exit status (None: killed at its time
    limit, or it could not start: see ``error``) and how long it took."""

    name: str
    exit_code: int | None
    duration_ms: float
    timed_out: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True, slots=True)
class RestoreStatus:
    """The guest's view of its latest restore. ``generation`` counts the restores along
    this VM's lineage (0: never restored since it booted); ``notified``: the pids that
    were sent their signal; ``listeners``: processes registered now; ``hooks``: the
    executable hooks in ``/etc/forkpoint/restore.d`` now; ``hook_runs``: those of the
    latest restore, ``hooks_running`` while they still run."""

    generation: int
    event: str | None = None
    session: str | None = None
    checkpoint: str | None = None
    at: str | None = None
    notified: list[int] = field(default_factory=list)
    listeners: int = 0
    hooks: int = 0
    hooks_running: bool = False
    hook_runs: list[HookRun] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class MakeDirArgs:
    """Create a directory and its parents (those it creates belong to ``user``)."""

    path: str
    user: str | None = None
    mode: int = 0o755

    def __post_init__(self) -> None:
        _check_path(self.path)
        _check_user(self.user)
        if not 0 <= self.mode <= 0o7777:
            raise ValueError("mode must be between 0 and 0o7777")


@dataclass(frozen=True, slots=True)
class MakeDirResult:
    """``created``: False when the directory already existed."""

    created: bool


@dataclass(frozen=True, slots=True)
class RenameArgs:
    """Move ``src`` to ``dst`` (replacing a file there); with ``user``, only if that user
    may write both directories."""

    src: str
    dst: str
    user: str | None = None

    def __post_init__(self) -> None:
        _check_path(self.src, "src")
        _check_path(self.dst, "dst")
        _check_user(self.user)


@dataclass(frozen=True, slots=True)
class PtySize:
    """A terminal's window: columns and rows."""

    cols: int
    rows: int

    def __post_init__(self) -> None:
        if not (1 <= self.cols <= 1000 and 1 <= self.rows <= 1000):
            raise ValueError("a PTY is 1..1000 columns by 1..1000 rows")


@dataclass(frozen=True, slots=True)
class ProcStartArgs:
    """Start a process the agent owns (see ``guest/processes.py``).

    Streams a ``start`` event (data: the pid in ASCII), then ``stdout``/``stderr``, and
    answers with :class:`ProcEndResult`. ``timeout`` (s, None: none) bounds its life, even
    with nobody attached. ``stdin``: keep stdin open for ``proc_input``, else /dev/null.
    ``user``: run as that user (its groups, HOME, default cwd = its home). ``pty``: run
    on a new pseudo-terminal of that size, its controlling terminal (stdin, stdout and
    stderr): its output streams as ``pty`` events, ``proc_input`` types into it.
    """

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    stdin: bool = False
    tag: str | None = None
    timeout: float | None = None
    window: int = STREAM_WINDOW_BYTES
    pty: PtySize | None = None

    def __post_init__(self) -> None:
        _check_command(self.argv, None)
        if self.cwd is not None:
            _check_path(self.cwd, "cwd")
        _check_env(self.env)
        _check_user(self.user)
        _check_window(self.window)
        if self.tag is not None and len(self.tag) > 256:
            raise ValueError("tag must be at most 256 characters")
        if self.timeout is not None and not 0 < self.timeout <= 30 * 86400:
            raise ValueError("timeout must be > 0 and at most 30 days (seconds)")


@dataclass(frozen=True, slots=True)
class ProcAttachArgs:
    """Stream a process's output again: ``start``, new output, then the result."""

    pid: int
    window: int = STREAM_WINDOW_BYTES

    def __post_init__(self) -> None:
        _check_window(self.window)


@dataclass(frozen=True, slots=True)
class ProcEndResult:
    """How a proc_start/proc_attach stream ended. ``ended`` False: it was cancelled (the
    process runs on). ``exit_code`` is 128+N when signal N killed it."""

    pid: int
    ended: bool
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class PidArgs:
    pid: int


@dataclass(frozen=True, slots=True)
class ProcInputArgs:
    pid: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ProcResizeArgs:
    """Set the window size of a process's PTY (the kernel tells it: SIGWINCH)."""

    pid: int
    size: PtySize


@dataclass(frozen=True, slots=True)
class ProcSignalArgs:
    """Send signal number ``signal`` to the process's group."""

    pid: int
    signal: int

    def __post_init__(self) -> None:
        if not 1 <= self.signal <= 64:
            raise ValueError("signal must be 1..64")


@dataclass(frozen=True, slots=True)
class TrackedProcessInfo:
    """A process started with proc_start: running, or ended recently (exit kept)."""

    pid: int
    argv: list[str]
    cwd: str
    env: dict[str, str]
    user: str | None
    tag: str | None
    stdin: bool
    running: bool
    exit_code: int | None = None
    signal: int | None = None
    pty: bool = False


@dataclass(frozen=True, slots=True)
class ProcListResult:
    processes: list[TrackedProcessInfo]


@dataclass(frozen=True, slots=True)
class StreamCreditArgs:
    """The host consumed ``bytes`` more of stream ``request_id`` (this connection's)."""

    request_id: int
    bytes: int

    def __post_init__(self) -> None:
        if self.bytes <= 0:
            raise ValueError("bytes must be > 0")


@dataclass(frozen=True, slots=True)
class StreamCancelArgs:
    """End stream ``request_id``: a process stream detaches (the process runs on), a
    tunnel closes."""

    request_id: int


@dataclass(frozen=True, slots=True)
class TunnelOpenArgs:
    """Connect to 127.0.0.1:``port`` in the guest. Streams ``start`` once connected,
    then ``data`` events; answers with :class:`TunnelEndResult` at the guest side's EOF."""

    port: int
    window: int = STREAM_WINDOW_BYTES

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError("port must be 1..65535")
        _check_window(self.window)


@dataclass(frozen=True, slots=True)
class TunnelEndResult:
    """``eof``: the guest side closed its end for writing (else it was cancelled/reset)."""

    eof: bool


#: What happened to a watched path (fsnotify's words, as E2B's envd reports them).
WATCH_EVENT_TYPES = ("create", "write", "remove", "rename", "chmod")


@dataclass(frozen=True, slots=True)
class WatchDirArgs:
    """Stream the changes under directory ``path`` (``recursive``: in its subdirectories
    too, also ones made later): ``start`` once watching, then ``fs`` events (data: a
    JSON :class:`WatchEvent`), until cancelled or the directory is gone. ``entries``:
    each event carries the path's entry (when it still exists)."""

    path: str
    recursive: bool = False
    entries: bool = False
    window: int = STREAM_WINDOW_BYTES

    def __post_init__(self) -> None:
        _check_path(self.path)
        _check_window(self.window)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """``name``: the path relative to the watched directory; ``type``: one of
    :data:`WATCH_EVENT_TYPES`."""

    name: str
    type: str
    entry: DirEntry | None = None


@dataclass(frozen=True, slots=True)
class WatchEndResult:
    """Why a watch ended: "cancelled", "removed" (the directory went away) or
    "overflow" (the kernel dropped events: the host missed some)."""

    reason: str


@dataclass(frozen=True, slots=True)
class WatchFlushArgs:
    """Send the changes of watch ``request_id`` that happened before this request
    (before its answer) now."""

    request_id: int


@dataclass(frozen=True, slots=True)
class TunnelArgs:
    """The tunnel opened by request ``tunnel`` (its tunnel_open request id)."""

    tunnel: int


@dataclass(frozen=True, slots=True)
class TunnelWriteArgs:
    tunnel: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ScanArgs:
    """Walk ``roots`` (not following symlinks, not entering ``exclude``) and list the
    processes and listening TCP sockets: what a diff compares."""

    roots: list[str] = field(default_factory=lambda: ["/"])
    exclude: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.roots:
            raise ValueError("roots must not be empty")
        for path in (*self.roots, *self.exclude):
            _check_path(path)


@dataclass(frozen=True, slots=True)
class ListeningSocket:
    """A listening TCP socket: address, port and (when found) the owning process."""

    address: str
    port: int
    pid: int = 0


@dataclass(frozen=True, slots=True)
class ScanResult:
    """The walk, as zlib-compressed bytes: ``paths``, each followed by a NUL, and
    ``numbers``, four int64s per path in the guest's byte order (x86: little-endian):
    size, ``st_mode``, inode, ctime (ns). Equal inode and ctime: unchanged. The agent
    streams them as ``chunk`` events (first ``paths_bytes``, then ``numbers_bytes``; no
    frame limit on the tree's size); the host puts them here as base64 (``paths``,
    ``numbers``). ``count`` entries; ``duration_ms`` the scan's time in the guest."""

    count: int
    processes: list[ProcessInfo]
    listening: list[ListeningSocket]
    duration_ms: float = 0.0
    paths_bytes: int = 0
    numbers_bytes: int = 0
    paths: str = ""
    numbers: str = ""


OPS: Final[dict[Op, tuple[type, type]]] = {
    Op.HELLO: (HelloArgs, HelloResult),
    Op.EXEC: (ExecArgs, ExecResult),
    Op.SPAWN: (SpawnArgs, SpawnResult),
    Op.READ_FILE: (PathArgs, ReadFileResult),
    Op.WRITE_BEGIN: (WriteBeginArgs, WriteBeginResult),
    Op.WRITE_CHUNK: (WriteChunkArgs, WriteChunkResult),
    Op.WRITE_COMMIT: (WriteCommitArgs, WriteCommitResult),
    Op.WRITE_ABORT: (WriteHandleArgs, Empty),
    Op.LIST_DIR: (ListDirArgs, ListDirResult),
    Op.STAT: (StatArgs, StatResult),
    Op.REMOVE: (RemoveArgs, RemoveResult),
    Op.PS: (Empty, PsResult),
    Op.KILL: (KillArgs, Empty),
    Op.RESTORE_IDENTITY: (RestoreIdentityArgs, RestoreIdentityResult),
    Op.PROC_START: (ProcStartArgs, ProcEndResult),
    Op.PROC_ATTACH: (ProcAttachArgs, ProcEndResult),
    Op.PROC_INPUT: (ProcInputArgs, Empty),
    Op.PROC_CLOSE_STDIN: (PidArgs, Empty),
    Op.PROC_SIGNAL: (ProcSignalArgs, Empty),
    Op.PROC_LIST: (Empty, ProcListResult),
    Op.PROC_RESIZE: (ProcResizeArgs, Empty),
    Op.STREAM_CREDIT: (StreamCreditArgs, Empty),
    Op.STREAM_CANCEL: (StreamCancelArgs, Empty),
    Op.TUNNEL_OPEN: (TunnelOpenArgs, TunnelEndResult),
    Op.TUNNEL_WRITE: (TunnelWriteArgs, Empty),
    Op.TUNNEL_SHUTDOWN: (TunnelArgs, Empty),
    Op.MAKE_DIR: (MakeDirArgs, MakeDirResult),
    Op.RENAME: (RenameArgs, Empty),
    Op.SCAN: (ScanArgs, ScanResult),
    Op.WATCH_DIR: (WatchDirArgs, WatchEndResult),
    Op.WATCH_FLUSH: (WatchFlushArgs, Empty),
    Op.STATS: (Empty, GuestStats),
    Op.RESTORE_STATUS: (RestoreStatusArgs, RestoreStatus),
}
"""Args and result model of each op."""
