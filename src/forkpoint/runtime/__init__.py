"""The orchestrator: sessions, checkpoints, forks, rollback, ports, GC.

``Runtime`` loads on first use (PEP 562): the CLI's quick queries use
:mod:`forkpoint.runtime.queries` alone, without the VM engine and asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forkpoint.runtime.runtime import Runtime

__all__ = ["Runtime"]


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from forkpoint.runtime.runtime import Runtime

        return Runtime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
