"""The ``forkpoint`` CLI run as a user runs it, for tests: a subprocess of this venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

FORKPOINT = [sys.executable, "-m", "forkpoint.cli.app"]


def cli(*args: str, code: int = 0, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    """Run ``forkpoint ARGS``; asserts it exits with ``code`` (stderr in the message)."""
    done = subprocess.run(
        [*FORKPOINT, *args],
        capture_output=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=timeout,
    )
    assert done.returncode == code, done.stderr.decode(errors="replace")
    return done


def cli_json(command: str, *args: str) -> Any:
    """``forkpoint COMMAND --json ARGS``, parsed (the flag before ARGS: an ``exec``'s
    guest command after ``--`` must not get it)."""
    return json.loads(cli(command, "--json", *args).stdout)


def remove_sessions(*session_ids: str) -> None:
    """Best-effort cleanup in a test's ``finally``: never raises over the test's error."""
    for session_id in session_ids:
        subprocess.run([*FORKPOINT, "rm", session_id], capture_output=True, timeout=120)
