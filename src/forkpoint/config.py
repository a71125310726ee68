"""Where forkpoint keeps its state: ``$FORKPOINT_HOME`` and its fixed layout."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Home", "LimitDefaults", "home"]


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
    def db(self) -> Path:
        return self.root / "forkpoint.db"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def token(self) -> Path:
        """The API token ``forkpoint serve --port`` writes (also the E2B API key)."""
        return self.root / "token"

    def ensure(self) -> Home:
        for path in (self.images, self.sessions, self.checkpoints, self.layers, self.cache):
            path.mkdir(parents=True, exist_ok=True)
        return self


def home() -> Home:
    """The active home, from ``$FORKPOINT_HOME`` or the XDG default."""
    env = os.environ.get("FORKPOINT_HOME")
    root = Path(env) if env else Path.home() / ".local" / "share" / "forkpoint"
    return Home(root.expanduser().resolve())


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
