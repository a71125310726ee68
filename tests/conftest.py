"""Shared test setup.

Tests run in their own ``$FORKPOINT_HOME`` (``<home>/test-home``), so a test run never
touches a user's sessions; it shares the real home's image and download caches, so the
guest image is built once. On a failing VM test, the QEMU log and serial console of the
VMs it touched are shown.

pytest's temporary directories (``tmp_path``; RAM files, disk images, 100 MiB transfers:
about 1 GB a run) live in ``<test-home>/pytest-tmp``, not in ``/tmp`` (RAM-backed on
Debian 13), and are removed when the run passes; a failed run keeps them to look at.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import Generator
from pathlib import Path

import pytest

from forkpoint.config import home


def _use_test_home() -> None:
    real = home().ensure()
    test_root = real.root / "test-home"
    test_root.mkdir(exist_ok=True)
    for shared in ("images", "cache"):
        link = test_root / shared
        if not link.is_symlink():
            link.symlink_to(real.root / shared)
    os.environ["FORKPOINT_HOME"] = str(test_root)
    _discard_if_foreign(test_root)


def _discard_if_foreign(test_root: Path) -> None:
    """The test home is scratch space: if a newer forkpoint left its database there (a
    schema this code refuses), throw it away with everything it described, VMs included."""
    from forkpoint.store.schema import SCHEMA_VERSION
    from forkpoint.vm.process import kill_and_wait, pids_with_arg

    db = test_root / "forkpoint.db"
    if not db.exists():
        return
    with contextlib.closing(sqlite3.connect(db)) as conn:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version <= SCHEMA_VERSION:
        return
    for pid, arg in pids_with_arg(lambda arg: str(test_root) in arg):
        kill_and_wait(pid, arg)
    for name in ("sessions", "checkpoints", "layers", "locks"):
        shutil.rmtree(test_root / name, ignore_errors=True)
    for suffix in ("", "-wal", "-shm"):
        (test_root / f"forkpoint.db{suffix}").unlink(missing_ok=True)


_use_test_home()


def _recent_vm_logs(since: float) -> str:
    sessions = home().sessions
    if not sessions.is_dir():
        return ""
    parts = []
    for directory in sorted(sessions.iterdir()):
        for name in ("qemu.log", "serial.log"):
            path = directory / name
            try:
                if path.stat().st_mtime < since:
                    continue
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            tail = [line for line in lines if line.strip()][-30:]
            if not tail:
                continue
            parts.append(f"--- {directory.name}/{name} ---\n" + "\n".join(tail))
    return "\n".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("vm") is not None:
        logs = _recent_vm_logs(since=time.time() - report.duration - 5)
        if logs:
            report.sections.append(("QEMU log and serial console", logs))


def _remove_all_test_sessions() -> None:
    """Idle TCG guests still burn CPU: never let a failed test's VMs slow the rest. And
    the checkpoints tests made (not the templates, the cache that keeps runs fast): a
    test home reused run after run would otherwise grow by gigabytes each time."""
    import asyncio

    from forkpoint.errors import ForkpointError
    from forkpoint.models import CheckpointKind
    from forkpoint.runtime import Runtime

    if not home().db.exists():
        return
    rt = Runtime.open()
    try:
        rt.warm.drain()
        for leftover in rt.list_sessions():
            try:
                asyncio.run(rt.remove(leftover.id))
            except ForkpointError:
                pass
        for _ in range(20):  # children before parents: a checkpoint in use is kept
            made = [c for c in rt.list_checkpoints() if c.kind == CheckpointKind.USER]
            removed = 0
            for checkpoint in made:
                try:
                    asyncio.run(rt.remove_checkpoint(checkpoint.id))
                    removed += 1
                except ForkpointError:
                    pass
            if not removed:
                break
    finally:
        rt.close()


_OWN_BASETEMP = home().root / "pytest-tmp"


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path plugin reads the option
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None:
        config.option.basetemp = str(_OWN_BASETEMP)  # pytest empties it at the start


def pytest_sessionstart(session: pytest.Session) -> None:
    _remove_all_test_sessions()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _remove_all_test_sessions()
    if exitstatus == pytest.ExitCode.OK and session.config.option.basetemp == str(_OWN_BASETEMP):
        shutil.rmtree(_OWN_BASETEMP, ignore_errors=True)
