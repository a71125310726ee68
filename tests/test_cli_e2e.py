"""The flagship story through the CLI, exactly as a user types it (real QEMU).

create → write the app → start a web server → checkpoint → fork ×3 (each serves at once,
same server PID) → on the parent kill the server and delete the app → rollback → the
same URL serves the same page again from the same, restored, PID.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest

pytestmark = pytest.mark.vm

SERVER_START_S = 90.0  # python's http.server needs 10-20 s to start under TCG


def forkpoint(*args: str, stdin: bytes | None = None, check: bool = True) -> Any:
    """Run ``forkpoint ARGS`` as a user would; returns the parsed --json output."""
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", *args],
        input=stdin,
        capture_output=True,
        env=env,
        timeout=300,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"forkpoint {' '.join(args)} exited {proc.returncode}\n"
            f"stdout: {proc.stdout.decode(errors='replace')}\n"
            f"stderr: {proc.stderr.decode(errors='replace')}"
        )
    assert not check or b"Traceback" not in proc.stderr
    return json.loads(proc.stdout) if "--json" in args and proc.stdout.strip() else proc


def get(url: str, timeout: float = 5.0) -> bytes | None:
    """The body at ``url``, or None if nothing answers."""
    try:
        with urllib.request.urlopen(url + "/index.html", timeout=timeout) as response:
            return bytes(response.read())
    except (OSError, http.client.HTTPException):
        return None


def wait_for(url: str, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = get(url)
        if body is not None:
            return body
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer within {timeout_s} s")


def wait_gone(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if get(url, timeout=2.0) is None:
            return
        time.sleep(0.5)
    pytest.fail(f"{url} still answers after {timeout_s} s")


def server_pids(session_id: str) -> list[int]:
    processes = forkpoint("ps", session_id, "--json")
    assert all(set(p) == {"pid", "ppid", "cmd"} for p in processes)
    return [p["pid"] for p in processes if "http.server" in p["cmd"]]


@pytest.mark.smoke
def test_checkpoint_fork_rollback_story() -> None:
    sessions: list[str] = []
    checkpoint_id: str | None = None
    page = f"<h1>forkpoint e2e {time.time_ns()}</h1>\n".encode()
    try:
        # 1. create a session with port 8000 forwarded, put the app in, start a server.
        parent = forkpoint("create", "--port", "8000", "--json")
        sessions.append(parent["id"])
        assert parent["state"] == "running"
        assert [p["guest_port"] for p in parent["ports"]] == [8000]
        url = parent["ports"][0]["url"]
        assert url.startswith("http://127.0.0.1:")

        forkpoint("files", "write", parent["id"], "/app/index.html", stdin=page)
        listing = forkpoint("files", "ls", parent["id"], "/app", "--json")
        assert [e["name"] for e in listing] == ["index.html"]
        read_back = forkpoint("files", "read", parent["id"], "/app/index.html")
        assert read_back.stdout == page

        spawned = forkpoint(
            "exec", parent["id"], "--background", "--cwd", "/app", "--json",
            "--", "python3", "-m", "http.server", "8000",
        )  # fmt: skip
        assert set(spawned) == {"pid", "log_path"}
        assert wait_for(url, SERVER_START_S) == page
        (server_pid,) = server_pids(parent["id"])
        assert server_pid == spawned["pid"]

        # 2. checkpoint, then fork three ways: each serves at once, same server PID.
        checkpoint = forkpoint("checkpoint", parent["id"], "--name", "served", "--json")
        checkpoint_id = checkpoint["id"]
        assert checkpoint["session_id"] == parent["id"]
        assert checkpoint["name"] == "served"
        assert checkpoint["duration_ms"] > 0
        listed = forkpoint("checkpoints", parent["id"], "--json")
        assert checkpoint_id in [c["id"] for c in listed]

        forks = forkpoint("fork", checkpoint_id, "--count", "3", "--json")
        assert len(forks) == 3
        assert all("error" not in f for f in forks), forks
        sessions.extend(f["id"] for f in forks)
        fork_urls = [f["ports"][0]["url"] for f in forks]
        assert len({url, *fork_urls}) == 4  # every fork has its own host port
        for fork, fork_url in zip(forks, fork_urls, strict=True):
            assert fork["parent_checkpoint"] == checkpoint_id
            assert wait_for(fork_url, 30) == page
            assert server_pids(fork["id"]) == [server_pid]

        # 3. on the parent: kill the server, delete the app; the forward stops answering.
        forkpoint("exec", parent["id"], "--", "kill", str(server_pid))
        forkpoint("files", "rm", parent["id"], "/app")
        wait_gone(url, 30)
        assert server_pids(parent["id"]) == []

        # 4. rollback: same id, same URL, the page is back, served by the same PID.
        rolled = forkpoint("rollback", parent["id"], "--json")
        assert rolled["id"] == parent["id"]
        assert rolled["ports"] == parent["ports"]
        assert rolled["state"] == "running"
        assert wait_for(url, 30) == page
        assert server_pids(parent["id"]) == [server_pid]

        # The forks were untouched by the parent's kill and rollback.
        for fork_url in fork_urls:
            assert get(fork_url) == page
    finally:
        if sessions:
            forkpoint("rm", *sessions, check=False)
        if checkpoint_id:
            forkpoint("checkpoint", "rm", checkpoint_id, check=False)
    remaining = {s["id"] for s in forkpoint("ls", "--json")}
    assert not remaining & set(sessions)
