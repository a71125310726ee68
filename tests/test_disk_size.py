"""``create --disk``: the guest's disk and root filesystem are that size, in forks and
after a rollback to the image's template too; a size below the image's makes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.vm


def _cli(*args: str, code: int = 0) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", *args],
        capture_output=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=300,
    )
    assert done.returncode == code, done.stderr.decode(errors="replace")
    return json.loads(done.stdout) if "--json" in args and code == 0 else done


def _root_fs_mib(session_id: str) -> int:
    df = _cli("exec", session_id, "--json", "--", "df", "-m", "--output=size", "/")
    return int(df["stdout"].split()[-1])


def test_disk_size_reaches_the_guest_filesystem() -> None:
    before = _cli("ls", "--json")
    refused = _cli("create", "--disk", "1G", code=2)
    assert "smaller than image default's disk" in refused.stderr.decode()
    assert _cli("ls", "--json") == before
    s = _cli("create", "--disk", "3G", "--json")
    made = [s["id"]]
    try:
        assert s["disk_mib"] == 3072
        assert 2900 < _root_fs_mib(s["id"]) <= 3072
        checkpoint = _cli("checkpoint", s["id"], "--json")
        (fork,) = _cli("fork", checkpoint["id"], "--json")
        made.append(fork["id"])
        assert fork["disk_mib"] == 3072 and _root_fs_mib(fork["id"]) > 2900
        # The template it was created from has the image's 2 GiB: it grows again.
        _cli("rollback", s["id"], s["parent_checkpoint"])
        assert _root_fs_mib(s["id"]) > 2900
    finally:
        for session_id in made:
            subprocess.run([sys.executable, "-m", "forkpoint.cli.app", "rm", session_id])
