"""The operation table is what the doors serve: every REST route is a declared operation
or one of the few wired by hand, and every declared operation is a route (and, where the
table says so, an MCP tool)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from forkpoint.api import BY_HAND, OPERATIONS
from forkpoint.mcp import TOOL_NAMES, build_server
from forkpoint.runtime import Runtime
from forkpoint.server import create_app


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    opened = Runtime.open()
    yield opened
    opened.close()


def test_every_route_is_declared_or_by_hand(runtime: Runtime) -> None:
    spec = create_app(runtime).openapi()
    routes = {
        op["operationId"]: (method.upper(), path, op)
        for path, item in spec["paths"].items()
        for method, op in item.items()
    }
    assert set(routes) == {op.name for op in OPERATIONS} | set(BY_HAND)
    for op in OPERATIONS:
        method, path, served = routes[op.name]
        assert (method, path) == (op.method, "/v1" + op.path.replace(":checkpoint_ref", ""))
        assert str(op.status) in served["responses"], op.name


def test_mcp_tools_are_the_declared_ones_and_a_few_by_hand(runtime: Runtime) -> None:
    listed = {tool.name for tool in asyncio.run(build_server(runtime).list_tools())}
    declared = {op.name for op in OPERATIONS if op.mcp}
    assert declared <= listed == set(TOOL_NAMES)
    assert listed - declared == {"exec", "read_file", "write_file", "rollback", "remove_session"}
