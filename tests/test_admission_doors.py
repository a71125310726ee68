"""One admission policy, every door: with one session running and a cap of one, a create
is refused through REST, MCP and the E2B gateway alike — each in its own dialect — and
nothing starts. (The policy's arithmetic, without VMs: ``test_api_limits.py``.)"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

from e2b_gateway import running_gateway
from forkpoint.config import ApiLimits, home
from forkpoint.models import Session
from forkpoint.runtime import Runtime
from forkpoint.server import create_app

pytestmark = pytest.mark.vm

FORKPOINT = Path(sys.executable).with_name("forkpoint")
CAP = {"FORKPOINT_API_MAX_SESSIONS": "1"}


@pytest.fixture(scope="module")
def one_running() -> Iterator[Runtime]:
    """The test home with one session running: a cap of one is reached."""
    runtime = Runtime.open()
    session = asyncio.run(runtime.create())
    try:
        yield runtime
    finally:
        asyncio.run(runtime.remove(session.id))
        runtime.close()


def _running(runtime: Runtime) -> list[Session]:
    return [s for s in runtime.list_sessions() if s.state == "running"]


def test_rest_answers_429_with_retry_after(one_running: Runtime) -> None:
    async def scenario() -> httpx.Response:
        app = create_app(one_running, limits=ApiLimits(max_sessions=1))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.post("/v1/sessions", json={})

    refused = asyncio.run(scenario())
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "5"
    assert refused.json()["error"]["code"] == "busy"
    assert len(_running(one_running)) == 1


def test_mcp_answers_a_busy_tool_error(one_running: Runtime) -> None:
    params = StdioServerParameters(command=str(FORKPOINT), args=["mcp"], env={**os.environ, **CAP})

    async def scenario() -> str:
        async with Client(params) as client:
            result = await client.call_tool("create_session", {})
            assert result.is_error
            [text] = result.content
            assert isinstance(text, TextContent)
            return text.text

    message = asyncio.run(scenario())
    assert "busy: 1 sessions are running or starting" in message, message
    assert len(_running(one_running)) == 1


def test_e2b_gateway_answers_429(one_running: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CAP.items():
        monkeypatch.setenv(name, value)
    with running_gateway() as gateway:
        with pytest.raises(RateLimitException, match="sessions are running or starting"):
            Sandbox.create()
        raw = httpx.post(
            f"{gateway.url}/v2/sandboxes", json={"templateID": "base"},
            headers={"X-API-KEY": gateway.api_key},
        )  # fmt: skip
    assert raw.status_code == 429 and raw.headers["retry-after"] == "5", raw.text
    assert raw.json()["code"] == 429
    assert len(_running(one_running)) == 1
    assert home().root.name == "test-home"  # the gateway used the test's home
