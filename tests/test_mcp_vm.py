"""The MCP tools derived from the operation table, against real sessions through the real
MCP client: create with history, a step, its history, undo, checkpoint, verify it, fork
it, a rollback preview, recover (nothing crashed), and the tools' errors."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

pytestmark = pytest.mark.vm

FORKPOINT = Path(sys.executable).with_name("forkpoint")


def _payload(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


@pytest.mark.timeout(300)
def test_derived_tools_drive_a_session() -> None:
    params = StdioServerParameters(command=str(FORKPOINT), args=["mcp"], env=dict(os.environ))

    async def scenario() -> None:
        async with Client(params) as client:

            async def call(tool: str, **arguments: Any) -> Any:
                return _payload(await client.call_tool(tool, arguments))

            session = await call("create_session", history=True, history_keep=3)
            sid = session["id"]
            made: list[str] = [sid]
            try:
                await call("exec", session=sid, command="echo one > /root/f")
                [step] = (await call("history", session=sid))["steps"]
                assert step["label"].startswith("echo one")
                undone = await call("undo", session=sid)
                assert undone["id"] == sid
                ck = await call("checkpoint", session=sid, name="mcp-ck")
                files = (await call("verify_checkpoint", checkpoint=ck["id"]))["files"]
                assert files and all(f["ok"] for f in files), files
                [child] = (await call("fork", checkpoint=ck["id"], count=1))["sessions"]
                made.append(child["id"])
                restored = await call("restore_status", session=child["id"])
                assert (restored["event"], restored["checkpoint"]) == ("fork", ck["id"])
                preview = await call("rollback", session=child["id"], dry_run=True)
                # a union answer comes wrapped in "result" (MCP's structured output)
                assert preview["result"]["source"] == ck["id"], preview
                assert (await call("recover_sessions"))["sessions"] == []
                missing = await client.call_tool("verify_checkpoint", {"checkpoint": "nope"})
                assert missing.is_error
                [text] = missing.content
                assert isinstance(text, TextContent) and "not_found" in text.text
            finally:
                for session_id in reversed(made):
                    await call("remove_session", session=session_id)

    asyncio.run(scenario())
