"""Working inside a running session's guest: commands, files, processes and tunnels,
each over the session's shared agent connection (:class:`.link.GuestLink`). What changes
the guest (exec, spawn, a write, rename or removal) is first recorded as a history step
when the session keeps a history."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import IO, Protocol

from forkpoint.agent_client import OutputCallback
from forkpoint.agent_client.tunnel import TunnelReader, TunnelWriter
from forkpoint.models import (
    BackgroundProcess,
    CommandResult,
    FileEntry,
    FileStat,
    GuestRestore,
    OutputEncoding,
    Process,
    ProcessEvent,
    PtySize,
    TrackedProcess,
)
from forkpoint.runtime.guest import processes
from forkpoint.runtime.guest.link import GuestLink
from forkpoint.runtime.guest.watch import DirWatch, watch_dir

__all__ = ["Guest", "StepRecorder"]


class StepRecorder(Protocol):
    async def record(self, session: str, label: str | Sequence[str]) -> None:
        """Before a step: a labelled checkpoint if the session keeps a history."""


class Guest:
    def __init__(self, link: GuestLink, steps: StepRecorder) -> None:
        self.link = link
        self.steps = steps

    async def exec(
        self,
        session: str,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        output_encoding: OutputEncoding = "text",
        user: str | None = None,
    ) -> CommandResult:
        """Run a command in the guest to completion (exit code passed through, not raised).

        Output streams to ``on_stdout``/``on_stderr`` as it comes (they run on the shared
        connection's reader: keep them quick), and is returned as ``output_encoding``
        (UTF-8 text, or base64 for the exact bytes). ``user``: the guest user to run as
        (None: the image's ``USER``, else root).
        :raises CommandTimeout: past ``timeout`` seconds (the command is killed).
        """
        await self.steps.record(session, command)
        async with self.link.agent(session) as agent:
            r = await agent.exec(
                command, cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                on_stdout=on_stdout, on_stderr=on_stderr, user=user,
            )  # fmt: skip
        return CommandResult.of(
            exit_code=r.exit_code, signal=r.signal, stdout=r.stdout, stderr=r.stderr,
            truncated=r.truncated, duration_ms=r.duration_ms, pid=r.pid, encoding=output_encoding,
        )  # fmt: skip

    async def spawn(
        self,
        session: str,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> BackgroundProcess:
        """Start a detached background process; it survives checkpoints, forks, rollbacks."""
        await self.steps.record(session, command)
        async with self.link.agent(session) as agent:
            return await agent.spawn(command, cwd=cwd, env=env)

    async def read_file(self, session: str, path: str) -> bytes:
        async with self.link.agent(session) as agent:
            return await agent.read_file(path)

    async def read_file_to(self, session: str, path: str, dest: IO[bytes]) -> int:
        """Stream a guest file into ``dest`` (bounded memory); returns bytes written."""
        async with self.link.agent(session) as agent:
            return await agent.read_file_to(path, dest)

    async def write_file(
        self,
        session: str,
        path: str,
        data: bytes | IO[bytes],
        mode: int = 0o644,
        *,
        user: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Write a guest file (parents created; streamed when ``data`` is a file).
        ``user``: the file and the parents it creates belong to that guest user.
        ``metadata``: kept on the file (``stat``/``list_files`` return it) until it is
        written again. :raises InvalidInput: a bad key or value."""
        await self.steps.record(session, f"write {path}")
        async with self.link.agent(session) as agent:
            await agent.write_file(path, data, mode=mode, user=user, metadata=metadata)

    async def list_files(self, session: str, path: str, *, depth: int = 1) -> list[FileEntry]:
        """Entries sorted by path; ``depth`` 2 adds the subdirectories' entries, ..."""
        async with self.link.agent(session) as agent:
            return await agent.list_dir(path, depth=depth)

    async def stat(self, session: str, path: str, *, follow_symlinks: bool = True) -> FileStat:
        """Type, size, mode, mtime, owner and group (ids and names), symlink target.
        :raises NotFound:"""
        async with self.link.agent(session) as agent:
            return await agent.stat(path, follow_symlinks=follow_symlinks)

    async def make_dir(self, session: str, path: str, user: str | None = None) -> bool:
        """``mkdir -p``; what it creates belongs to ``user``. False if it existed.
        :raises InvalidInput: a file is in the way; :raises NotFound: no such user."""
        async with self.link.agent(session) as agent:
            return await agent.make_dir(path, user=user)

    async def rename(self, session: str, src: str, dst: str, user: str | None = None) -> None:
        """Move ``src`` to ``dst`` (with ``user``: only where that user may write).
        :raises NotFound: :raises InvalidInput:"""
        await self.steps.record(session, f"rename {src} {dst}")
        async with self.link.agent(session) as agent:
            await agent.rename(src, dst, user=user)

    async def remove_file(self, session: str, path: str) -> None:
        await self.steps.record(session, f"remove {path}")
        async with self.link.agent(session) as agent:
            await agent.remove(path)

    def watch_dir(
        self, session: str, path: str, *, recursive: bool = False, entries: bool = False
    ) -> contextlib.AbstractAsyncContextManager[DirWatch]:
        """Watch directory ``path`` while the block runs: iterate the watch for each
        change (create, write, remove, rename, chmod; ``name`` relative to ``path``) as it
        happens, or call ``pending()`` for those made so far. ``recursive``: also in its
        subdirectories; ``entries``: each event carries the path's entry.
        :raises NotFound: no such directory (on enter). :raises InvalidInput: a file."""
        return watch_dir(self.link.agent(session), path, recursive, entries)

    async def ps(self, session: str) -> list[Process]:
        async with self.link.agent(session) as agent:
            return await agent.ps()

    async def restore_status(self, session: str) -> GuestRestore:
        """What the session's guest made of its latest restore: its generation, the event,
        the processes it told and its restore hooks' results (``guest/restore.py``)."""
        async with self.link.agent(session) as agent:
            return await agent.restore_status()

    async def kill_process(self, session: str, pid: int, signal: int | str = "TERM") -> None:
        async with self.link.agent(session) as agent:
            await agent.kill(pid, signal)

    # -- processes the agent owns (E2B's envd model; see guest/processes.py) ---------

    def start_process(
        self,
        session: str,
        cmd: str,
        args: Sequence[str] = (),
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        stdin: bool = False,
        tag: str | None = None,
        timeout: float | None = None,
        pty: PtySize | None = None,
    ) -> AsyncIterator[ProcessEvent]:
        """Start ``cmd args`` in the guest: events ``start`` (the pid, first), then
        ``stdout``/``stderr`` as produced, then ``end``.

        Closing the iterator early does not kill it (``attach_process`` resumes).
        ``timeout`` (s; None/0: none) bounds its life, attached or not: its process group
        is killed. ``user``: run as that guest user (HOME, USER, groups; cwd defaults to
        its home); None: root. ``stdin``: keep stdin open for ``send_stdin``. ``pty``: on
        a pseudo-terminal of that size, its controlling terminal: its output comes as
        ``pty`` events, ``send_stdin`` types into it, ``resize_process`` resizes it.
        :raises NotFound: no such command, cwd or user (from the first ``__anext__``).
        """
        return processes.process_events(
            self.link.agent(session),
            lambda agent: agent.start_process(
                [cmd, *args],
                cwd=cwd,
                env=env,
                user=user,
                stdin=stdin,
                tag=tag,
                timeout=timeout,
                pty=pty,
            ),
        )

    def attach_process(self, session: str, pid: int) -> AsyncIterator[ProcessEvent]:
        """Re-attach: ``start``, then new output and ``end`` (at once if it has ended).
        :raises NotFound: no process ``pid`` was started with ``start_process``."""
        return processes.process_events(
            self.link.agent(session), lambda agent: agent.attach_process(pid)
        )

    async def send_stdin(self, session: str, pid: int, data: bytes) -> None:
        """:raises NotFound: :raises Conflict: started without stdin, or it was closed."""
        async with self.link.agent(session) as agent:
            await agent.send_stdin(pid, data)

    async def close_stdin(self, session: str, pid: int) -> None:
        """:raises NotFound: :raises Conflict: started without stdin."""
        async with self.link.agent(session) as agent:
            await agent.close_stdin(pid)

    async def resize_process(self, session: str, pid: int, size: PtySize) -> None:
        """Set the window size of a ``start_process`` process's PTY.
        :raises NotFound: :raises Conflict: it has no PTY, or it has ended."""
        async with self.link.agent(session) as agent:
            await agent.resize_process(pid, size)

    async def signal_process(self, session: str, pid: int, signal: int | str) -> None:
        """Signal the process group of a ``start_process`` process (number or "KILL").
        :raises NotFound: unknown, or it has ended."""
        async with self.link.agent(session) as agent:
            await agent.signal_process(pid, signal)

    async def list_processes(self, session: str) -> list[TrackedProcess]:
        """``start_process`` processes: running ones, then recently ended ones."""
        async with self.link.agent(session) as agent:
            infos = await agent.list_processes()
        return [processes.tracked_process(i) for i in infos]

    def tcp_tunnel(
        self, session: str, guest_port: int
    ) -> contextlib.AbstractAsyncContextManager[tuple[TunnelReader, TunnelWriter]]:
        """A byte stream to ``127.0.0.1:guest_port`` inside the guest, over the agent
        channel (any port, no forward, no passt restart), flow-controlled both ways.
        :raises NotFound: nothing listens on that guest port (on enter)."""
        return processes.tcp_tunnel(self.link, session, guest_port)
