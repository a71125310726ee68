"""The forkpoint SDK: an async core and a blocking twin generated from it.

::

    from forkpoint.sdk import AsyncSandbox, Sandbox

    sb = await AsyncSandbox.create(ports=[8000])              # embedded (in-process)
    sb = await AsyncSandbox.create(base_url="unix:/path/forkpoint.sock")  # via `forkpoint serve`
    await sb.files.write("/app/index.html", "<h1>hi</h1>")
    await sb.commands.run("python3 -m http.server 8000", background=True, cwd="/app")
    ck = await sb.checkpoint("served")
    forks = await ck.fork(3)                # list[AsyncSandbox | ForkpointError]
    await sb.rollback(ck)
    await sb.kill()

    with Sandbox.create() as sb:            # the same surface, blocking
        print(sb.commands.run("uname -a").stdout)

Errors are the :mod:`forkpoint.errors` classes in both modes.
"""

from forkpoint.errors import ForkpointError
from forkpoint.sdk._async import (
    AsyncCheckpoint,
    AsyncCommands,
    AsyncFiles,
    AsyncPorts,
    AsyncSandbox,
    BackgroundProcess,
    CommandResult,
    FileEntry,
    Process,
)
from forkpoint.sdk._backend import error_from_payload
from forkpoint.sdk._sync import Checkpoint, Commands, Files, Ports, Sandbox, SyncTwin

__all__ = [
    "AsyncCheckpoint",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncPorts",
    "AsyncSandbox",
    "BackgroundProcess",
    "Checkpoint",
    "CommandResult",
    "Commands",
    "FileEntry",
    "Files",
    "ForkpointError",
    "Ports",
    "Process",
    "Sandbox",
    "SyncTwin",
    "error_from_payload",
]
