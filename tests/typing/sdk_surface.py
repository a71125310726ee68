"""Type-checked, never run: what mypy must see of the SDK (``make lint`` checks it).

``# type: ignore[...]`` marks code that must NOT type-check: mypy --strict reports an
ignore that is not needed, so if the SDK's types ever went loose (``Any``), this fails.
"""

from __future__ import annotations

from typing import assert_type

from forkpoint.errors import ForkpointError
from forkpoint.sdk import (
    AsyncSandbox,
    BackgroundProcess,
    Checkpoint,
    CheckpointInfo,
    CommandResult,
    FileEntry,
    Sandbox,
    SessionInfo,
)


def blocking() -> None:
    sb = Sandbox.create(ports=[8000])
    assert_type(sb, Sandbox)
    assert_type(sb.info, SessionInfo)
    assert_type(sb.commands.run("true"), CommandResult)
    assert_type(sb.commands.run("sleep 9", background=True), BackgroundProcess)
    assert_type(sb.files.list("/"), list[FileEntry])
    assert_type(sb.files.read("/etc/hostname"), bytes)
    ck = sb.checkpoint("x")
    assert_type(ck, Checkpoint)
    assert_type(ck.info, CheckpointInfo)
    assert_type(ck.fork(3), list[Sandbox | ForkpointError])
    with Sandbox.connect(sb.id) as again:
        assert_type(again, Sandbox)
    sb.commands.runn("true")  # type: ignore[attr-defined]
    sb.files.write("/x", 42)  # type: ignore[arg-type]
    Sandbox.create(memory=512)  # type: ignore[call-arg]


async def non_blocking() -> None:
    sb = await AsyncSandbox.create()
    assert_type(sb, AsyncSandbox)
    assert_type(await sb.commands.run(["ls"]), CommandResult)
    forks = await (await sb.checkpoint()).fork(2)
    assert_type(forks, list[AsyncSandbox | ForkpointError])
    await sb.commands.runn("true")  # type: ignore[attr-defined]
