"""Host side of the agent protocol: :class:`AgentClient` and the result types it returns."""

from ..protocol import (
    DirEntry,
    ExecResult,
    HelloResult,
    ProcessInfo,
    RemoveResult,
    RestoreIdentityResult,
    SpawnResult,
    StatResult,
)
from .client import AgentClient, OutputCallback

__all__ = [
    "AgentClient",
    "DirEntry",
    "ExecResult",
    "HelloResult",
    "OutputCallback",
    "ProcessInfo",
    "RemoveResult",
    "RestoreIdentityResult",
    "SpawnResult",
    "StatResult",
]
