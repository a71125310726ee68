"""How the CLI fails: one line on stderr (JSON on stdout with --json), documented exit codes.

0 ok, 1.. the guest command's own code, 2 bad usage/input, 3 not found, 4 conflict/state,
5 internal. The first tests need no VM; the rest share one session (CPU is scarce).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

UNKNOWN_SESSION = "s-doesnotexist"
UNKNOWN_CHECKPOINT = "c-doesnotexist"


def forkpoint(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", *args],
        input=None if stdin is None else stdin.decode(),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], exit_code: int) -> str:
    assert proc.returncode == exit_code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- without a VM ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("show", UNKNOWN_SESSION),
        ("exec", UNKNOWN_SESSION, "--", "true"),
        ("ps", UNKNOWN_SESSION),
        ("files", "read", UNKNOWN_SESSION, "/etc/hostname"),
        ("checkpoint", UNKNOWN_SESSION),
        ("checkpoints", UNKNOWN_SESSION),
        ("rollback", UNKNOWN_SESSION),
        ("port", UNKNOWN_SESSION, "8000"),
        ("egress", UNKNOWN_SESSION, "--deny-net", "0.0.0.0/0"),
    ],
)
def test_unknown_session_is_exit_3(args: tuple[str, ...]) -> None:
    line = assert_one_line_error(forkpoint(*args), 3)
    assert UNKNOWN_SESSION in line
    assert line.startswith("error:")


@pytest.mark.parametrize(
    "args",
    [("fork", UNKNOWN_CHECKPOINT), ("checkpoint", "rm", UNKNOWN_CHECKPOINT)],
)
def test_unknown_checkpoint_is_exit_3(args: tuple[str, ...]) -> None:
    line = assert_one_line_error(forkpoint(*args), 3)
    assert UNKNOWN_CHECKPOINT in line


def test_json_error_shape() -> None:
    proc = forkpoint("show", UNKNOWN_SESSION, "--json")
    assert_one_line_error(proc, 3)
    error = json.loads(proc.stdout)
    assert set(error) == {"error"}
    assert error["error"]["code"] == "not_found"
    assert UNKNOWN_SESSION in error["error"]["message"]


def test_bad_input_is_exit_2() -> None:
    # Checked before anything boots: port out of range, count out of range.
    assert_one_line_error(forkpoint("create", "--port", "70000"), 2)
    assert_one_line_error(forkpoint("create", "--network", "bogus"), 2)
    proc = forkpoint("create", "--port", "0", "--json")
    assert_one_line_error(proc, 2)
    assert json.loads(proc.stdout)["error"]["code"] == "invalid_input"
    assert_one_line_error(forkpoint("checkpoint", "rm"), 2)
    assert_one_line_error(forkpoint("checkpoint", UNKNOWN_SESSION, "extra"), 2)


def test_usage_errors_are_exit_2() -> None:
    assert forkpoint("exec").returncode == 2
    assert forkpoint("port", UNKNOWN_SESSION, "not-a-number").returncode == 2
    assert forkpoint("no-such-command").returncode == 2


def test_rm_unknown_is_exit_3() -> None:
    line = assert_one_line_error(forkpoint("rm", UNKNOWN_SESSION), 3)
    assert UNKNOWN_SESSION in line


def test_checkpoint_help_explains_both_forms() -> None:
    proc = forkpoint("checkpoint", "--help")
    assert proc.returncode == 0
    assert "checkpoint SESSION" in proc.stdout
    assert "checkpoint rm ID" in proc.stdout


# -- with one shared VM ----------------------------------------------------------------


@pytest.fixture(scope="module")
def session() -> Iterator[str]:
    proc = forkpoint("create", "--name", f"cli-errors-{os.getpid()}", "--json")
    assert proc.returncode == 0, proc.stderr
    session_id = str(json.loads(proc.stdout)["id"])
    try:
        yield session_id
    finally:
        forkpoint("rm", session_id)


@pytest.mark.vm
def test_guest_exit_code_passes_through(session: str) -> None:
    proc = forkpoint("exec", session, "--", "sh", "-c", "echo out; echo err >&2; exit 42")
    assert proc.returncode == 42
    assert proc.stdout == "out\n"
    assert proc.stderr == "err\n"
    proc = forkpoint("exec", session, "--json", "--", "sh", "-c", "echo hi; exit 7")
    assert proc.returncode == 7
    result = json.loads(proc.stdout)
    assert result["exit_code"] == 7
    assert result["stdout"] == "hi\n"
    assert result["stderr"] == ""
    assert result["duration_ms"] >= 0


@pytest.mark.vm
def test_exec_env_and_cwd(session: str) -> None:
    proc = forkpoint(
        "exec", session, "--env", "A=b=c", "--cwd", "/tmp", "--", "sh", "-c", "echo $A; pwd"
    )
    assert (proc.returncode, proc.stdout) == (0, "b=c\n/tmp\n")
    line = assert_one_line_error(forkpoint("exec", session, "--env", "NOEQUALS", "--", "true"), 2)
    assert "KEY=VALUE" in line


@pytest.mark.vm
def test_bad_guest_input(session: str) -> None:
    assert_one_line_error(forkpoint("port", session, "70000"), 2)
    assert_one_line_error(forkpoint("files", "read", session, "/no/such/file"), 3)
    assert_one_line_error(forkpoint("rollback", session, UNKNOWN_CHECKPOINT), 3)
    # Every id is looked up before anything is removed: the known one survives.
    # (Other tests may create sessions concurrently: look at ours only.)
    assert_one_line_error(forkpoint("rm", session, UNKNOWN_SESSION), 3)
    listed = {s["id"]: s for s in json.loads(forkpoint("ls", "--json").stdout)}
    assert listed[session]["state"] == "running"
    assert forkpoint("exec", session, "--", "true").returncode == 0


@pytest.mark.vm
def test_crashed_session_is_exit_4_until_rolled_back(session: str) -> None:
    from forkpoint.runtime import Runtime

    runtime = Runtime.open()
    try:
        pid = runtime.store.get_session(session).qemu_pid
    finally:
        runtime.close()
    assert pid
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)

    line = assert_one_line_error(forkpoint("exec", session, "--", "true"), 4)
    assert "crashed" in line and "rollback" in line
    listed = {s["id"]: s for s in json.loads(forkpoint("ls", "--json").stdout)}
    assert listed[session]["state"] == "crashed"
    assert "crashed" in forkpoint("ls").stdout

    proc = forkpoint("rollback", session, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state"] == "running"
    assert forkpoint("exec", session, "--", "true").returncode == 0
