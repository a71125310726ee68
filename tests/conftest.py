"""Shared test setup: on a failing test, show what the VMs it touched printed."""

from __future__ import annotations

import time
from collections.abc import Generator

import pytest

from forkpoint.config import home


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
