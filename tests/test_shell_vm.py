"""``forkpoint shell``: an interactive terminal into a session, driven from a terminal of
the test's own (a PTY whose controlling process is the CLI): the guest's terminal has
the local size, follows a local resize, and the CLI exits with the program's code."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import termios
import time

import pytest

from cli_run import FORKPOINT, cli, cli_json, remove_sessions

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _read_until(fd: int, needle: bytes, timeout_s: float = 120) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout_s
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} in {seen!r}"
        if select.select([fd], [], [], left)[0]:
            seen += os.read(fd, 4096)
    return seen


def test_shell_is_a_terminal_of_the_local_size_that_follows_a_resize() -> None:
    session = cli_json("create")["id"]
    master, terminal = os.openpty()
    proc: subprocess.Popen[bytes] | None = None
    try:
        _set_size(terminal, 100, 30)
        proc = subprocess.Popen(
            [*FORKPOINT, "shell", session, "--", "/bin/sh"],
            stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # SIGWINCH reaches it
            env={**os.environ, "TERM": "xterm"},
        )  # fmt: skip
        os.close(terminal)
        _read_until(master, b"# ")  # a shell taking its terminal may flush what was typed ahead
        os.write(master, b"stty size; echo $TERM; echo $((6*7))x\n")
        seen = _read_until(master, b"42x")  # the echo of the line shows $((6*7))
        assert b"30 100" in seen and b"xterm" in seen
        _set_size(master, 120, 40)
        time.sleep(0.5)  # the CLI passes the resize on (SIGWINCH, then the agent)
        os.write(master, b"stty size; echo $((7*7))y\n")
        assert b"40 120" in _read_until(master, b"49y")
        os.write(master, b"exit 7\n")
        assert proc.wait(timeout=120) == 7
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        remove_sessions(session)
    # Without a terminal: one line, exit 2, nothing started.
    refused = cli("shell", session, code=2)
    assert b"needs a terminal" in refused.stderr
