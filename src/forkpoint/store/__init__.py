"""The metadata store: SQLite (WAL) records of sessions, checkpoints, layers, templates.

The database is the source of truth shared by every forkpoint process on one home;
:mod:`forkpoint.store.locks` serializes the operations on one session across processes.
"""

from __future__ import annotations

from forkpoint.store.db import DEFAULT_BUSY_TIMEOUT_S, KEEP, Keep, Store
from forkpoint.store.locks import (
    DEFAULT_LOCK_TIMEOUT_S,
    global_lock,
    global_lock_async,
    session_lock,
    session_lock_async,
)
from forkpoint.store.models import (
    CheckpointKind,
    CheckpointRecord,
    LayerRecord,
    Network,
    PortForward,
    SessionRecord,
    SessionState,
    TemplateRecord,
    new_checkpoint_id,
    new_session_id,
    utc_now,
    validate_name,
)
from forkpoint.store.schema import SCHEMA_VERSION

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "DEFAULT_LOCK_TIMEOUT_S",
    "KEEP",
    "SCHEMA_VERSION",
    "CheckpointKind",
    "CheckpointRecord",
    "Keep",
    "LayerRecord",
    "Network",
    "PortForward",
    "SessionRecord",
    "SessionState",
    "Store",
    "TemplateRecord",
    "global_lock",
    "global_lock_async",
    "new_checkpoint_id",
    "new_session_id",
    "session_lock",
    "session_lock_async",
    "utc_now",
    "validate_name",
]
