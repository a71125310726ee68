"""The E2B gateway: the official ``e2b`` SDK drives forkpoint, unmodified.

``forkpoint serve --e2b`` serves E2B's control plane and an envd emulation on P
(default 127.0.0.1:3000) and sandbox ports (``get_host``) on Q (default P+1).
See docs/architecture.md, "E2B compatibility".
"""

from __future__ import annotations

from .app import create_e2b_app
from .proxy import SandboxProxy
from .sandboxes import GatewayConfig, Sandboxes
from .serve import TokenFile, run_gateway

__all__ = [
    "GatewayConfig",
    "SandboxProxy",
    "Sandboxes",
    "TokenFile",
    "create_e2b_app",
    "run_gateway",
]
