"""The orchestrator: sessions, checkpoints, forks, rollback, ports, GC."""

from forkpoint.runtime.runtime import Runtime

__all__ = ["Runtime"]
