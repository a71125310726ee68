"""E2B through the gateway, with the real ``e2b`` SDK as the client: "E2B create → first
command result" from a warm VM of the ``base`` template (the number public sandbox
benchmarks publish as time to interactive), "create → first ``run_code`` result" from a
warm VM of ``code-interpreter-v1`` (with ``e2b-code-interpreter``), "create → the start
command of a template built from code answers" and "E2B fork x3".

The gateway runs in this event loop on loopback ports; the SDK is ``AsyncSandbox``. The
``e2b`` packages are development dependencies: without them these rows are skipped, as
is the code-interpreter row when its image was not built.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from forkpoint.e2b import GatewayConfig, TokenFile, run_gateway
from forkpoint.errors import NotFound
from forkpoint.images import get_image
from forkpoint.images.recipe import CODE_INTERPRETER_IMAGE, E2B_BASE_IMAGE
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
    config = GatewayConfig(
        domain=f"localhost:{proxy.getsockname()[1]}", default_timeout_s=600,
        template_builds=True,
    )  # fmt: skip
    stop = asyncio.Event()
    gateway = asyncio.create_task(run_gateway(runtime, config, api, [proxy], token, stop=stop))
    url = f"http://127.0.0.1:{api.getsockname()[1]}"
    opts: dict[str, Any] = {"api_key": token(), "api_url": url, "sandbox_url": url}
    saved = os.environ.get("E2B_DOMAIN")
    os.environ["E2B_DOMAIN"] = config.domain
    created: list[Any] = []

    async def first_result(
        image: str, sandbox: Any, first: Callable[[Any], Awaitable[object]]
    ) -> Summary:
        """create → ``first(sandbox)`` answered, each from a warm VM of ``image`` (as a
        server with FORKPOINT_WARM_VMS keeps one: started beforehand, untimed, as the
        `create` row does)."""
        samples: list[float] = []
        for _ in range(reps):
            await runtime.fill_warm(
                image=image, memory_mib=config.memory_mib, cpus=config.cpus, count=1
            )
            await asyncio.sleep(0.2)  # the filler's own CPU is done
            started = time.perf_counter()
            sbx = await sandbox.create(**opts)
            created.append(sbx)
            await first(sbx)
            samples.append((time.perf_counter() - started) * 1000)
            await sbx.kill()
            created.remove(sbx)
        return summarize(samples)

    try:
        out = {
            "create_first_command": await first_result(
                E2B_BASE_IMAGE, AsyncSandbox, lambda sbx: sbx.commands.run("true")
            )
        }
        out["create_template_from_code"] = await _template_from_code(opts, reps, created)
        if (interpreter := _code_interpreter(log)) is not None:
            out["create_first_run_code"] = await first_result(
                CODE_INTERPRETER_IMAGE, interpreter, lambda sbx: sbx.run_code("1")
            )
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


async def _template_from_code(opts: dict[str, Any], reps: int, created: list[Any]) -> Summary:
    """create → the template's start command answers, for a template built from code with
    the SDK (built once, untimed: an unchanged template is a cache hit after the first
    run): its server runs in the template's checkpoint, so the sandbox serves at once."""
    from e2b import AsyncSandbox, AsyncTemplate, wait_for_port

    template = (
        AsyncTemplate()
        .from_template(E2B_BASE_IMAGE)
        .set_workdir("/home/user/site")
        .run_cmd("echo '<h1>built from code</h1>' > index.html")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    await AsyncTemplate.build(template, "bench-from-code", **opts)
    samples: list[float] = []
    for _ in range(reps):
        started = time.perf_counter()
        sbx = await AsyncSandbox.create("bench-from-code", **opts)
        created.append(sbx)
        await sbx.commands.run("curl -sf http://127.0.0.1:8000/ -o /dev/null")
        samples.append((time.perf_counter() - started) * 1000)
        await sbx.kill()
        created.remove(sbx)
    return summarize(samples)


def _code_interpreter(log: Callable[[str], None]) -> Any:
    """``e2b_code_interpreter.AsyncSandbox``, or None (with why) if it cannot run here."""
    if importlib.util.find_spec("e2b_code_interpreter") is None:
        log("e2b: `e2b-code-interpreter` is not installed; its row is skipped")
        return None
    try:
        get_image(CODE_INTERPRETER_IMAGE)
    except NotFound:
        log(f"e2b: no {CODE_INTERPRETER_IMAGE} image (`forkpoint image build "
            f"{CODE_INTERPRETER_IMAGE}`); its row is skipped")  # fmt: skip
        return None
    from e2b_code_interpreter import AsyncSandbox

    return AsyncSandbox
