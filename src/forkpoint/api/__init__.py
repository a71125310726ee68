"""The operations forkpoint offers, declared once (:mod:`forkpoint.api.table`); the REST
routes, MCP tools and the SDK's calls are derived from them."""

from forkpoint.api.table import BY_HAND, OPERATIONS, Cost, Op, admit, operation

__all__ = ["BY_HAND", "OPERATIONS", "Cost", "Op", "admit", "operation"]
