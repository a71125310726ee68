"""``forkpoint mcp`` through the real MCP client over stdio (no VM: an empty home)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

from forkpoint.mcp import TOOL_NAMES

FORKPOINT = Path(sys.executable).with_name("forkpoint")


def _params(home: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(FORKPOINT), args=["mcp"], env={"FORKPOINT_HOME": str(home)}
    )


def _payload(result: Any) -> Any:
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


@pytest.mark.timeout(180)
def test_tools_are_listed_and_callable(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Client(_params(tmp_path / "home")) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(TOOL_NAMES) <= set(tools)
            assert tools["exec"].description and "background" in tools["exec"].description
            port = tools["forward_port"].input_schema["properties"]["guest_port"]
            assert port["maximum"] == 65535

            listed = await client.call_tool("list_sessions", {})
            assert not listed.is_error
            assert _payload(listed) == {"sessions": []}
            host = _payload(await client.call_tool("host_status", {}))
            assert host["sessions_running"] == 0 and host["sessions_max"] >= 1
            assert 0 < host["memory_available_mib"] <= host["memory_total_mib"]

            missing = await client.call_tool("read_file", {"session": "nope", "path": "/x"})
            assert missing.is_error
            [text] = missing.content
            assert isinstance(text, TextContent)
            assert "not_found: unknown session: nope" in text.text

            bad = await client.call_tool("forward_port", {"session": "x", "guest_port": 70000})
            assert bad.is_error

    asyncio.run(scenario())


def test_tool_parameters_are_the_rest_request_fields() -> None:
    """A tool's parameters are its REST body's fields, with the same limits: the copies
    drifted when each door declared its own (MCP's exec timeout capped at a day where REST
    allows seven, MCP's undo took ``true`` for 1, its create lacked network and disk_mib)."""
    from forkpoint.mcp import build_server
    from forkpoint.requests import (
        CreateSessionRequest,
        ForegroundExecRequest,
        PullRequest,
        UndoRequest,
    )

    async def tools() -> dict[str, Any]:
        listed = await build_server(None).list_tools()  # type: ignore[arg-type]
        return {tool.name: tool.input_schema["properties"] for tool in listed}

    schemas = asyncio.run(tools())

    def rest(model: Any) -> dict[str, Any]:
        return dict(model.model_json_schema(by_alias=True)["properties"])

    assert set(schemas["create_session"]) == set(rest(CreateSessionRequest))
    assert schemas["exec"]["timeout"]["anyOf"][0]["maximum"] == 7 * 86400
    assert (
        schemas["exec"]["timeout"]["anyOf"][0] == rest(ForegroundExecRequest)["timeout"]["anyOf"][0]
    )
    assert schemas["undo"]["steps"]["maximum"] == rest(UndoRequest)["steps"]["maximum"]
    assert set(schemas["pull_checkpoint"]) == set(rest(PullRequest))  # "from", as in REST


@pytest.mark.timeout(180)
def test_tools_refuse_what_rest_refuses(tmp_path: Path) -> None:
    """JSON true is no integer and 1 no flag, through MCP as through REST."""

    async def scenario() -> None:
        async with Client(_params(tmp_path / "home")) as client:
            for tool, arguments in (
                ("undo", {"session": "s", "steps": True}),
                ("create_session", {"memory_mib": True}),
                ("create_session", {"history": 1}),
                ("exec", {"session": "s", "command": "true", "timeout": 8 * 86400}),
            ):
                result = await client.call_tool(tool, arguments)
                assert result.is_error, (tool, arguments)
                [text] = result.content
                assert isinstance(text, TextContent) and "unknown session" not in text.text

    asyncio.run(scenario())
