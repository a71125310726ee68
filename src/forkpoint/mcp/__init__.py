"""forkpoint over MCP (stdio): tools for agents, thin calls into the runtime."""

from forkpoint.mcp.server import TOOL_NAMES, build_server, run_stdio

__all__ = ["TOOL_NAMES", "build_server", "run_stdio"]
