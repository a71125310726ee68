"""The orchestrator: sessions, checkpoints, forks, rollback, ports, GC."""

from forkpoint.runtime.models import Checkpoint, PortInfo, Session
from forkpoint.runtime.runtime import Runtime

__all__ = ["Checkpoint", "PortInfo", "Runtime", "Session"]
