"""Where forkpoint keeps its state (``$FORKPOINT_HOME`` and its fixed layout), and what
one API server admits (:class:`ApiLimits`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

N = TypeVar("N", int, float)

__all__ = ["ApiLimits", "Home", "home"]


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
