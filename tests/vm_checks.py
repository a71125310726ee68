"""Checks the tests of real VMs share: what a forwarded port answers, and what the
invariant checker finds that it did not before."""

from __future__ import annotations

import socket
import time

from forkpoint.runtime import Runtime
from forkpoint.runtime.housekeeping.invariants import check_home


def read_port(port: int, timeout_s: float = 90.0) -> bytes:
    """What the guest's listener sends on the forwarded host ``port`` (Python needs
    seconds to start under TCG)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(b"hello\n")  # a request, then its answer (as HTTP)
                data = conn.recv(100)
                if data:
                    return data
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing answered on 127.0.0.1:{port}")
        time.sleep(0.3)


def new_problems(rt: Runtime, before: list[str]) -> list[str]:
    """What the invariant checker finds now and did not before the test (a killed earlier
    run can leave orphans in a reused test home: sweeping them is gc's job, tested apart)."""
    return sorted(set(check_home(rt.home, rt.store)) - set(before))
