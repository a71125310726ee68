"""Where forkpoint keeps its state: ``$FORKPOINT_HOME`` and its fixed layout."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Home", "home"]


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
