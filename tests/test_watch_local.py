"""Watching directories (inotify in the agent), against the real agent run locally (the
harness of test_agent_local: the agent is a subprocess on a unix socket)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from forkpoint.agent_client import AgentClient
from forkpoint.agent_client.watch import WatchStream
from forkpoint.errors import InvalidInput, NotFound
from forkpoint.protocol import WatchEvent
from test_agent_local import LocalAgent, guest_root, run

__all__ = ["guest_root"]  # the fixture, shared with test_agent_local

pytestmark = pytest.mark.timeout(60)


async def pending(watch: WatchStream) -> list[tuple[str, str]]:
    """The changes so far, as (type, name), after a flush: no waiting, no sleeping."""
    await watch.flush()
    events: list[WatchEvent] = []
    while watch.queued:
        event = await watch.next()
        if event is None:
            break
        events.append(event)
    return [(e.type, e.name) for e in events]


def test_agent_writes_show_as_envd_reports_them(tmp_path: Path, guest_root: Path) -> None:
    """An upload (temp file renamed into place) is the target created or written; the
    temp file never shows; make_dir, rename and remove are what they are."""
    root = tmp_path / "w"
    root.mkdir()

    async def body(agent: LocalAgent, c: AgentClient) -> None:
        watch = await c.watch_dir(str(root))
        await watch.started()
        await c.write_file(str(root / "a.txt"), b"one")
        assert await pending(watch) == [("create", "a.txt"), ("chmod", "a.txt"), ("write", "a.txt")]
        await c.write_file(str(root / "a.txt"), b"two")
        assert await pending(watch) == [("write", "a.txt")]
        await c.rename(str(root / "a.txt"), str(root / "b.txt"))
        assert await pending(watch) == [("rename", "a.txt"), ("create", "b.txt")]
        await c.make_dir(str(root / "sub"))
        await c.remove(str(root / "b.txt"))
        assert await pending(watch) == [("create", "sub"), ("remove", "b.txt")]
        assert await pending(watch) == []
        await watch.stop()

    run(tmp_path, guest_root, body)


def test_recursive_watch_follows_new_directories(tmp_path: Path, guest_root: Path) -> None:
    root = tmp_path / "r"
    (root / "old").mkdir(parents=True)

    async def body(agent: LocalAgent, c: AgentClient) -> None:
        flat = await c.watch_dir(str(root))
        deep = await c.watch_dir(str(root), recursive=True, entries=True)
        await flat.started()
        await deep.started()
        await c.write_file(str(root / "old" / "f"), b"x")
        await c.make_dir(str(root / "new"))
        await c.write_file(str(root / "new" / "g"), b"yy")
        assert await pending(flat) == [("create", "new")]
        await deep.flush()
        events = []
        while deep.queued and (event := await deep.next()) is not None:
            events.append(event)
        assert [(e.type, e.name) for e in events] == [
            ("create", "old/f"), ("chmod", "old/f"), ("write", "old/f"),
            ("create", "new"),
            ("create", "new/g"), ("chmod", "new/g"), ("write", "new/g"),
        ]  # fmt: skip
        last = events[-1].entry
        assert last is not None and (last.name, last.type, last.size) == ("g", "file", 2)
        assert last.path == str(root / "new" / "g")
        # a command's changes (not the agent's own) come too, as the kernel reports them
        proc = await c.exec(["sh", "-c", f"echo hi > {root}/new/h; chmod 600 {root}/new/h"])
        assert proc.exit_code == 0
        assert await pending(deep) == [("create", "new/h"), ("write", "new/h"), ("chmod", "new/h")]
        await flat.stop()
        await deep.stop()

    run(tmp_path, guest_root, body)


def test_watch_ends_when_its_directory_goes_and_bad_paths_are_errors(
    tmp_path: Path, guest_root: Path
) -> None:
    root = tmp_path / "gone"
    root.mkdir()
    (tmp_path / "file").write_text("x")

    async def body(agent: LocalAgent, c: AgentClient) -> None:
        with pytest.raises(NotFound):
            await (await c.watch_dir(str(tmp_path / "missing"))).started()
        with pytest.raises(InvalidInput, match="not a directory"):
            await (await c.watch_dir(str(tmp_path / "file"))).started()
        watch = await c.watch_dir(str(root))
        await watch.started()
        os.rmdir(root)
        assert await asyncio.wait_for(watch.next(), 10) is None
        assert watch.end().reason == "removed"
        with pytest.raises(NotFound, match="no such watch"):
            await watch.flush()

    run(tmp_path, guest_root, body)
