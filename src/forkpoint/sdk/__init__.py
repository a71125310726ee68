"""The forkpoint SDK: an async core and a blocking twin derived from it.

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

Both modes speak the REST API: embedded mode runs that API in-process. Values are
:mod:`forkpoint.models` (re-exported here); errors are :mod:`forkpoint.errors` classes.
"""

from forkpoint.errors import ForkpointError
from forkpoint.models import (
    BackgroundProcess,
    CommandResult,
    FileCheck,
    FileEntry,
    FileEvent,
    Process,
    VolumeEntry,
)
from forkpoint.models import Checkpoint as CheckpointInfo
from forkpoint.models import Session as SessionInfo
from forkpoint.models import Volume as VolumeInfo
from forkpoint.sdk._async import (
    AsyncCheckpoint,
    AsyncCommands,
    AsyncFiles,
    AsyncPorts,
    AsyncSandbox,
    AsyncTerminal,
    AsyncTerminals,
    AsyncWatcher,
)
from forkpoint.sdk._sync import (
    Checkpoint,
    Commands,
    Files,
    Ports,
    Sandbox,
    Terminal,
    Terminals,
    Volume,
    Watcher,
)
from forkpoint.sdk._volume import AsyncVolume

__all__ = [
    "AsyncCheckpoint",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncPorts",
    "AsyncSandbox",
    "AsyncTerminal",
    "AsyncTerminals",
    "AsyncVolume",
    "AsyncWatcher",
    "BackgroundProcess",
    "Checkpoint",
    "CheckpointInfo",
    "CommandResult",
    "Commands",
    "FileEntry",
    "FileEvent",
    "FileCheck",
    "Files",
    "ForkpointError",
    "Ports",
    "Process",
    "Sandbox",
    "SessionInfo",
    "Terminal",
    "Terminals",
    "Volume",
    "VolumeEntry",
    "VolumeInfo",
    "Watcher",
]
