"""Where forkpoint keeps its state (``$FORKPOINT_HOME`` and its fixed layout), the limits
an operator sets through the environment (:class:`HostLimits`, :class:`LimitDefaults`), and
what one API server admits (:class:`ApiLimits`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

N = TypeVar("N", int, float)

__all__ = ["ApiLimits", "Home", "HostLimits", "LimitDefaults", "home", "parse_size"]


@dataclass(frozen=True)
class Home:
    """The on-disk layout under ``$FORKPOINT_HOME`` (default ``~/.local/share/forkpoint``)."""

    root: Path

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def sessions(self) -> Path:
        return self.root / "sessions"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def layers(self) -> Path:
        """Disk layers (qcow2). Shared by checkpoints and sessions, referenced by name."""
        return self.root / "layers"

    @property
    def portable(self) -> Path:
        """Push/pull bookkeeping: which checkpoint has which portable digest, scratch."""
        return self.root / "portable"

    @property
    def volumes(self) -> Path:
        """Volumes' files, a directory each (``volumes/<id>``), outside every checkpoint."""
        return self.root / "volumes"

    @property
    def db(self) -> Path:
        return self.root / "forkpoint.db"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def token(self) -> Path:
        """The API token ``forkpoint serve --port`` writes (also the E2B API key)."""
        return self.root / "token"

    @property
    def tls(self) -> Path:
        """The local CA that signs sandbox hosts' certificates (``e2b/tls.py``)."""
        return self.root / "tls"

    def ensure(self) -> Home:
        from forkpoint.storage import mount_image_if_needed  # after a reboot (see there)

        mount_image_if_needed(self.root)
        for path in (self.images, self.sessions, self.checkpoints, self.layers, self.cache):
            path.mkdir(parents=True, exist_ok=True)
        return self


def cluster_address() -> str | None:
    """The Ray cluster every door talks to (``FORKPOINT_CLUSTER=HEAD:6379``); None: this
    host alone."""
    return os.environ.get("FORKPOINT_CLUSTER", "").strip() or None


def home() -> Home:
    """The active home, from ``$FORKPOINT_HOME`` or the XDG default."""
    env = os.environ.get("FORKPOINT_HOME")
    root = Path(env) if env else Path.home() / ".local" / "share" / "forkpoint"
    return Home(root.expanduser().resolve())


# -- what one API server admits ----------------------------------------------------------

MAX_WAIT_S = 8.0  # the longest a heavy request may be told to wait (``?wait=``)


@dataclass(frozen=True)
class ApiLimits:
    """What one ``forkpoint serve`` admits; past a limit it answers 429 with Retry-After.

    ``max_sessions``: running sessions (counted in the home, plus those this server is
    starting) that create, fork and rollback may bring about (``FORKPOINT_API_MAX_SESSIONS``,
    default 32). ``max_heavy``: create, fork, checkpoint and rollback calls running at once
    (``FORKPOINT_API_MAX_HEAVY``, default the number of CPUs, at least 2). ``wait_s``: how
    long such a call waits for its result before answering 202 with an operation to poll
    (``FORKPOINT_API_WAIT``, default 5 s, at most 8; a request's ``?wait=`` overrides).
    """

    max_sessions: int = 32
    max_heavy: int = max(2, os.cpu_count() or 2)
    wait_s: float = 5.0

    @classmethod
    def from_env(cls) -> ApiLimits:
        """:raises ValueError: a variable is set to something that is not such a limit."""
        default = cls()
        limits = cls(
            max_sessions=_env_number("FORKPOINT_API_MAX_SESSIONS", int, default.max_sessions),
            max_heavy=_env_number("FORKPOINT_API_MAX_HEAVY", int, default.max_heavy),
            wait_s=_env_number("FORKPOINT_API_WAIT", float, default.wait_s),
        )
        if limits.max_sessions < 1 or limits.max_heavy < 1:
            raise ValueError("FORKPOINT_API_MAX_SESSIONS and FORKPOINT_API_MAX_HEAVY must be >= 1")
        if not 0 <= limits.wait_s <= MAX_WAIT_S:
            raise ValueError(f"FORKPOINT_API_WAIT must be 0..{MAX_WAIT_S:g} seconds")
        return limits


def _env_number(name: str, kind: Callable[[str], N], default: N) -> N:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


# -- host limits (free disk, session count) -------------------------------------------

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``"512M"``, ``"1G"``, ``"1.5GiB"``, ``"4096"`` → bytes (binary units).

    :raises ValueError: not a size.
    """
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in _UNITS else ""
    number = float(value.removesuffix(unit) if unit else value)
    if number < 0:
        raise ValueError(f"negative size: {text!r}")
    return int(number * _UNITS[unit])


@dataclass(frozen=True)
class HostLimits:
    """What the host allows, from the environment (read per operation, so a server picks
    up no change without a restart — but every CLI call does).

    ``disk_reserve``: free space that create, fork and checkpoint leave on the home's
    filesystem (``FORKPOINT_DISK_RESERVE``: a size like ``2G`` or a share like ``5%``;
    default 1 GiB). ``max_sessions``: running sessions at most (``FORKPOINT_MAX_SESSIONS``,
    default 32). ``warm_vms``: QEMU processes kept started ahead for creates of each
    image template and machine shape in use (``FORKPOINT_WARM_VMS``, default 0: none; see
    ``runtime/sessions/warm.py``). ``rollback_standbys``: sessions that keep a QEMU started ahead
    for their next rollback (``FORKPOINT_ROLLBACK_STANDBYS``, default 0; see
    ``runtime/restore/standby.py``). ``restore_hook_timeout_s``: how long each of a
    guest's restore hooks may run (``FORKPOINT_RESTORE_HOOK_TIMEOUT``, seconds, default
    10; see ``guest/restore.py``).
    """

    disk_reserve: str = "1G"
    max_sessions: int = 32
    warm_vms: int = 0
    rollback_standbys: int = 0
    restore_hook_timeout_s: int = 10

    @classmethod
    def from_env(cls) -> HostLimits:
        """:raises ValueError: a variable is set to something that is not a limit."""
        default = cls()
        reserve = os.environ.get("FORKPOINT_DISK_RESERVE", "").strip() or default.disk_reserve
        count = _env_int("FORKPOINT_MAX_SESSIONS", default.max_sessions, 1, 1 << 16)
        warm = _env_int("FORKPOINT_WARM_VMS", default.warm_vms, 0, 64)
        standbys = _env_int("FORKPOINT_ROLLBACK_STANDBYS", default.rollback_standbys, 0, 64)
        hook_timeout = _env_int(
            "FORKPOINT_RESTORE_HOOK_TIMEOUT", default.restore_hook_timeout_s, 1, 300
        )
        limits = cls(reserve, count, warm, standbys, hook_timeout)
        limits.reserve_bytes(1)  # fail now, not in the middle of an operation
        return limits

    def reserve_bytes(self, filesystem_bytes: int) -> int:
        """The reserve in bytes on a filesystem of ``filesystem_bytes``."""
        if self.disk_reserve.endswith("%"):
            share = float(self.disk_reserve[:-1])
            if not 0 <= share <= 100:
                raise ValueError(f"FORKPOINT_DISK_RESERVE must be 0-100 %: {self.disk_reserve}")
            return int(filesystem_bytes * share / 100)
        try:
            return parse_size(self.disk_reserve)
        except ValueError:
            raise ValueError(
                f"FORKPOINT_DISK_RESERVE must be a size (2G) or a share (5%): {self.disk_reserve}"
            ) from None


# -- per-session resource limits (cgroups) ----------------------------------------------


@dataclass(frozen=True)
class LimitDefaults:
    """Per-session limits that do not follow from the machine's shape.

    ``pids_max`` (``FORKPOINT_PIDS_MAX``) bounds QEMU's threads plus passt: QEMU has ≈ 4 +
    one per vCPU, and up to 64 more in its block I/O pool under load. ``io_weight``
    (``FORKPOINT_IO_WEIGHT``, cgroup v2's scale 1–10000, 100 = everyone equal).
    """

    pids_max: int = 256
    io_weight: int = 100

    @classmethod
    def from_env(cls) -> LimitDefaults:
        """:raises ValueError: a variable is set to something out of range (one line)."""
        return cls(
            pids_max=_env_int("FORKPOINT_PIDS_MAX", cls.pids_max, 32, 1 << 22),
            io_weight=_env_int("FORKPOINT_IO_WEIGHT", cls.io_weight, 1, 10000),
        )


def _env_int(name: str, default: int, low: int, high: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, not {raw!r}")
    return int(raw)
