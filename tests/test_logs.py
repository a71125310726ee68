"""Capped logs: a guest printing forever leaves at most the caps on the host's disk."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cli_run import cli, cli_json, remove_sessions
from forkpoint.config import home
from forkpoint.vm.console import SERIAL_RING_BYTES
from forkpoint.vm.logcap import LOG_CAP_BYTES, trim_log

_MARKER = b"[forkpoint: "


def test_trim_keeps_the_newest_half_while_a_writer_appends(tmp_path: Path) -> None:
    log = tmp_path / "qemu.log"
    writer = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # as QEMU's stderr
    try:
        lines = [f"line {i:07d}\n".encode() for i in range(300_000)]  # 3.6 MB
        os.write(writer, b"".join(lines))
        assert not trim_log(log, cap=4 << 20)  # under the cap: untouched
        assert trim_log(log, cap=1 << 20)
        os.write(writer, b"after the trim\n")
        data = log.read_bytes()
    finally:
        os.close(writer)
    assert len(data) <= (1 << 19) + 100
    first, _, rest = data.partition(b"\n")
    assert first.startswith(_MARKER) and first.endswith(b"older bytes dropped]")
    assert rest.startswith(b"line ") and rest.endswith(lines[-1] + b"after the trim\n")
    assert not trim_log(tmp_path / "missing.log")


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


@pytest.mark.vm
def test_a_guest_flooding_its_console_stays_under_the_cap() -> None:
    session = cli_json("create")["id"]
    directory = home().sessions / session
    try:
        flood = f'n=0; while :; do n=$((n+1)); echo "flood $n {"x" * 80}"; done > /dev/ttyS0'
        cli("exec", session, "--background", "--", "sh", "-c", flood)
        sizes: list[int] = []
        printed = 0
        deadline = time.monotonic() + 180
        # At least 20 s, and until the guest printed twice the cap (slower under load).
        while len(sizes) < 5 or printed <= 2 * LOG_CAP_BYTES:
            assert time.monotonic() < deadline, f"the guest printed only {printed} bytes"
            time.sleep(4)
            # The console is a ring inside QEMU: nothing reaches the host's disk ...
            assert _size(directory / "serial.log") <= LOG_CAP_BYTES
            # ... until forkpoint drains it, and then at most the cap.
            tail = cli("console", session, "--bytes", "4096").stdout
            sizes.append(_size(directory / "serial.log"))
            if lines := [n for n in tail.split(b"\n") if n.startswith(b"flood ")]:
                printed = int(lines[-1].split()[1]) * 88  # each line is longer than 88 bytes
        assert max(sizes) <= LOG_CAP_BYTES + SERIAL_RING_BYTES // 2
        usage = sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())
        assert usage <= 2 * LOG_CAP_BYTES, f"the session's files use {usage} bytes"
        print(f"guest printed {printed} bytes in {4 * len(sizes)} s; serial.log sizes {sizes}")
    finally:
        remove_sessions(session)
