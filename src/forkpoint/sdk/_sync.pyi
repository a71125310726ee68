# Generated from _async.py by `python -m forkpoint.sdk._stubgen`: do not edit.
# The types of the blocking twin that _sync.py builds at import time.
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, overload

from forkpoint.errors import ForkpointError
from forkpoint.models import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY_MIB,
    BackgroundProcess,
    CheckpointTransfer,
    CommandResult,
    Event,
    FileCheck,
    FileEntry,
    FileEvent,
    GuestRestore,
    HistoryStep,
    HostStatus,
    ImageInfo,
    Metric,
    Network,
    Process,
    Session,
    StateDiff,
    VolumeEntry,
)
from forkpoint.models import Checkpoint as CheckpointInfo
from forkpoint.models import Volume as VolumeInfo
from forkpoint.runtime import Runtime

class SyncTwin: ...

class Commands(SyncTwin):
    @overload
    def run(
        self,
        cmd: str | Sequence[str],
        background: Literal[False] = ...,
        *,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        timeout: float | None = ...,
        stdin: bytes | str | None = ...,
    ) -> CommandResult: ...
    @overload
    def run(
        self,
        cmd: str | Sequence[str],
        background: Literal[True],
        *,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        timeout: float | None = ...,
        stdin: bytes | str | None = ...,
    ) -> BackgroundProcess: ...
    def ps(self) -> list[Process]: ...
    def kill(self, pid: int, signal: int | str = "TERM") -> None: ...

class Files(SyncTwin):
    def read(self, path: str) -> bytes: ...
    def read_text(self, path: str, encoding: str = "utf-8") -> str: ...
    def write(
        self,
        path: str,
        data: bytes | str,
        mode: int = 420,
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> None: ...
    def list(self, path: str) -> list[FileEntry]: ...
    def remove(self, path: str) -> None: ...
    def watch(self, path: str, *, recursive: bool = False, entries: bool = False) -> Watcher: ...

class Watcher(SyncTwin):
    @property
    def id(self) -> str: ...
    def events(self, wait: float = 0.0) -> list[FileEvent]: ...
    def stop(self) -> None: ...

class Terminal(SyncTwin):
    @property
    def pid(self) -> int: ...
    @property
    def exit_code(self) -> int | None: ...
    def send(self, data: bytes | str) -> None: ...
    def resize(self, cols: int, rows: int) -> None: ...
    def read(self) -> bytes | None: ...
    def wait(self, on_output: Callable[[bytes], object] | None = None) -> int: ...
    def kill(self) -> None: ...
    def disconnect(self) -> None: ...

class Terminals(SyncTwin):
    def open(
        self,
        cols: int = 80,
        rows: int = 24,
        *,
        command: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> Terminal: ...
    def connect(self, pid: int) -> Terminal: ...

class Ports(SyncTwin):
    def forward(self, guest_port: int) -> str: ...
    def url(self, guest_port: int) -> str | None: ...

class Sandbox(SyncTwin):
    commands: Commands
    files: Files
    ports: Ports
    terminals: Terminals

    @classmethod
    def create(
        cls,
        image: str = "default",
        *,
        memory_mib: int = DEFAULT_MEMORY_MIB,
        cpus: int = DEFAULT_CPUS,
        name: str | None = None,
        ports: Sequence[int] = (),
        network: Network | str = Network.USER,
        allow_net: Sequence[str] = (),
        deny_net: Sequence[str] = (),
        inject_headers: Mapping[str, Mapping[str, str]] | None = None,
        timeout: float | None = None,
        disk_mib: int | None = None,
        history: bool = False,
        history_keep: int = 20,
        on_expiry: str = "remove",
        volumes: Mapping[str, str] | None = None,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> Sandbox: ...
    @classmethod
    def connect(
        cls,
        session: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> Sandbox: ...
    @classmethod
    def list_sessions(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[Session]: ...
    @classmethod
    def host_status(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> HostStatus: ...
    @classmethod
    def list_images(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[ImageInfo]: ...
    @classmethod
    def build_image(
        cls,
        name: str,
        *,
        packages: Sequence[str] = (),
        dockerfile: str | None = None,
        files: Mapping[str, bytes] | None = None,
        start: bool = True,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> ImageInfo: ...
    @classmethod
    def remove_image(
        cls,
        name: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[str]: ...
    @classmethod
    def events(
        cls,
        after: int = 0,
        *,
        session: str | None = None,
        wait: float = 0.0,
        limit: int = 100,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[Event]: ...
    @classmethod
    def recover(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[Sandbox | ForkpointError]: ...
    @property
    def id(self) -> str: ...
    @property
    def info(self) -> Session: ...
    def refresh(self) -> Session: ...
    def checkpoint(self, name: str | None = None) -> Checkpoint: ...
    def rollback(self, checkpoint: Checkpoint | str | None = None) -> None: ...
    def set_timeout(
        self, seconds: float | None, on_expiry: str | None = None, keep_memory: bool | None = None
    ) -> None: ...
    def set_egress(
        self,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
        inject_headers: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None: ...
    def pause(self, keep_memory: bool = True) -> None: ...
    def resume(self) -> None: ...
    def rollback_preview(
        self, checkpoint: Checkpoint | str | None = None, *, patch: bool = False
    ) -> StateDiff: ...
    def diff(
        self,
        since: Checkpoint | str | None = None,
        *,
        patch: bool = False,
        include_tmp: bool = False,
        exclude: Sequence[str] = (),
    ) -> StateDiff: ...
    def metrics(
        self, start: datetime | None = None, end: datetime | None = None
    ) -> list[Metric]: ...
    def restore_status(self) -> GuestRestore: ...
    def history(self) -> list[HistoryStep]: ...
    def undo(self, steps: int = 1) -> None: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Sandbox: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

class Checkpoint(SyncTwin):
    @classmethod
    def get(
        cls,
        checkpoint: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> Checkpoint: ...
    @property
    def id(self) -> str: ...
    @property
    def info(self) -> CheckpointInfo: ...
    def fork(self, count: int = 1, *, spread: bool = False) -> list[Sandbox | ForkpointError]: ...
    def verify(self) -> list[FileCheck]: ...
    def push(self, to: str) -> CheckpointTransfer: ...
    @classmethod
    def pull(
        cls,
        ref: str,
        source: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> Checkpoint: ...
    def remove(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Checkpoint: ...
    def __exit__(self, *exc: Any) -> None: ...

class Volume(SyncTwin):
    @classmethod
    def create(
        cls,
        name: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> Volume: ...
    @classmethod
    def get(
        cls,
        volume: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> Volume: ...
    @classmethod
    def list_volumes(
        cls,
        *,
        base_url: str | None = None,
        token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[VolumeInfo]: ...
    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def info(self) -> VolumeInfo: ...
    def write(
        self,
        path: str,
        data: str | bytes,
        *,
        force: bool = False,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> VolumeEntry: ...
    def read(self, path: str) -> bytes: ...
    def list_dir(self, path: str = "/", depth: int = 1) -> list[VolumeEntry]: ...
    def stat(self, path: str) -> VolumeEntry: ...
    def exists(self, path: str) -> bool: ...
    def make_dir(
        self,
        path: str,
        *,
        force: bool = False,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> VolumeEntry: ...
    def set_metadata(
        self, path: str, *, mode: int | None = None, uid: int | None = None, gid: int | None = None
    ) -> VolumeEntry: ...
    def remove(self, path: str) -> None: ...
    def destroy(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Volume: ...
    def __exit__(self, *exc: Any) -> None: ...

__all__ = [
    "Checkpoint",
    "Commands",
    "Files",
    "Ports",
    "Sandbox",
    "SyncTwin",
    "Terminal",
    "Terminals",
    "Volume",
    "Watcher",
]
