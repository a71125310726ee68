"""E2B through the gateway, with the real ``e2b`` SDK as the client: "E2B create → first
command result" from a warm VM of the ``base`` template (the number public sandbox
benchmarks publish as time to interactive) and "E2B fork x3".

The gateway runs in this event loop on loopback ports; the SDK is ``AsyncSandbox``. The
``e2b`` package is a development dependency: without it these rows are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import time
from collections.abc import Callable
from typing import Any

from forkpoint.e2b import GatewayConfig, TokenFile, run_gateway
from forkpoint.images.recipe import E2B_BASE_IMAGE
from forkpoint.runtime import Runtime

from .stats import Summary, summarize

__all__ = ["measure_e2b"]


async def measure_e2b(
    runtime: Runtime, reps: int, log: Callable[[str], None]
) -> dict[str, Summary]:
    """``{"create_first_command": …, "fork3": …}`` (empty when ``e2b`` is not installed)."""
    if importlib.util.find_spec("e2b") is None:
        log("e2b: the `e2b` package is not installed (pip install 'forkpoint[dev]'); skipped")
        return {}
    from e2b import AsyncSandbox

    from forkpoint.server import bind_tcp

    api, proxy = bind_tcp("127.0.0.1", 0), bind_tcp("127.0.0.1", 0)
    token = TokenFile(runtime.home.token)
    if not token():
        from forkpoint.server import write_token

        write_token(token.path)
    config = GatewayConfig(domain=f"localhost:{proxy.getsockname()[1]}", default_timeout_s=600)
    stop = asyncio.Event()
    gateway = asyncio.create_task(run_gateway(runtime, config, api, [proxy], token, stop=stop))
    url = f"http://127.0.0.1:{api.getsockname()[1]}"
    opts: dict[str, Any] = {"api_key": token(), "api_url": url, "sandbox_url": url}
    saved = os.environ.get("E2B_DOMAIN")
    os.environ["E2B_DOMAIN"] = config.domain
    created: list[Any] = []
    try:
        first: list[float] = []
        for _ in range(reps):
            # From a warm VM, as a server with FORKPOINT_WARM_VMS keeps one: started
            # beforehand, untimed (the `create` row does the same).
            await runtime.fill_warm(
                image=E2B_BASE_IMAGE, memory_mib=config.memory_mib, cpus=config.cpus, count=1
            )
            await asyncio.sleep(0.2)  # the filler's own CPU is done
            started = time.perf_counter()
            sbx = await AsyncSandbox.create(**opts)
            created.append(sbx)
            await sbx.commands.run("true")
            first.append((time.perf_counter() - started) * 1000)
            await sbx.kill()
            created.remove(sbx)
        out = {"create_first_command": summarize(first)}
        parent = await AsyncSandbox.create(**opts)
        created.append(parent)
        forks: list[float] = []
        for _ in range(reps):
            started = time.perf_counter()
            results = await parent.fork(count=3)
            forks.append((time.perf_counter() - started) * 1000)
            for fork in results:
                if isinstance(fork, AsyncSandbox):
                    await fork.kill()
        out["fork3"] = summarize(forks)
        for name, summary in out.items():
            log(f"e2b {name}: p50 {summary['p50_ms']:.0f} ms, p95 {summary['p95_ms']:.0f} ms")
        return out
    finally:
        for sbx in created:
            with contextlib.suppress(Exception):
                await sbx.kill()
        if saved is None:
            os.environ.pop("E2B_DOMAIN", None)
        else:
            os.environ["E2B_DOMAIN"] = saved
        stop.set()
        await gateway
