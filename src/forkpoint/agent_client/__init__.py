"""Host side of the agent protocol: :class:`AgentClient` and the result types it returns."""

from ..protocol import (
    DirEntry,
    ExecResult,
    HelloResult,
    ProcessInfo,
    RemoveResult,
    RestoreIdentityArgs,
    RestoreIdentityResult,
    SpawnResult,
    StatResult,
)
from .client import (
    AgentClient,
    OutputCallback,
    confirm_restore,
    fresh_identity,
    post_identity,
)

__all__ = [
    "AgentClient",
    "DirEntry",
    "ExecResult",
    "HelloResult",
    "OutputCallback",
    "ProcessInfo",
    "RemoveResult",
    "RestoreIdentityArgs",
    "RestoreIdentityResult",
    "SpawnResult",
    "StatResult",
    "confirm_restore",
    "fresh_identity",
    "post_identity",
]
