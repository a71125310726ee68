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

            missing = await client.call_tool("read_file", {"session": "nope", "path": "/x"})
            assert missing.is_error
            [text] = missing.content
            assert isinstance(text, TextContent)
            assert "not_found: unknown session: nope" in text.text

            bad = await client.call_tool("forward_port", {"session": "x", "guest_port": 70000})
            assert bad.is_error

    asyncio.run(scenario())
