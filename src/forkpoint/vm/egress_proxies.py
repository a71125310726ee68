"""Starting, updating and stopping the egress proxy of a session uid (:mod:`.egress_proxy`).

A uid has a proxy while its policy names hosts. Its files are under
``/run/forkpoint/egress/<uid>/`` (like the nftables rules they go with, uids are unique
across homes and gone after a reboot): ``policy.json`` (replaced atomically: the proxy
reads it again at its next connection), ``pid``, ``port`` and ``log``. forkpoint binds the
proxy's 127.0.0.1 socket itself and hands it over, so the port is known before the proxy
has started and the rules redirecting to it can be installed at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

from forkpoint.egress import EgressPolicy
from forkpoint.vm.process import spawn_detached

__all__ = ["PROXIES", "proxy_for", "proxy_uids", "stop_proxy"]

PROXIES = Path("/run/forkpoint/egress")
_MODULE = "forkpoint.vm.egress_proxy"


def proxy_for(uid: int, policy: EgressPolicy) -> int | None:
    """The port of ``uid``'s proxy serving ``policy`` (started if it is not running), or
    ``None`` when ``policy`` names no host (a proxy that ran is stopped). Blocking."""
    if not policy.needs_proxy:
        stop_proxy(uid)
        return None
    directory = PROXIES / str(uid)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    staged = directory / "policy.json.new"
    staged.write_text(json.dumps(policy.to_json()))
    staged.replace(directory / "policy.json")
    running = _running(directory)
    if running is not None:
        return running
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        fd = listener.fileno()
        argv = [sys.executable, "-m", _MODULE, str(directory / "policy.json"), str(fd)]
        pid = spawn_detached(argv, directory / "log", pass_fds=(fd,))
        port: int = listener.getsockname()[1]
    (directory / "port").write_text(str(port))
    (directory / "pid").write_text(str(pid))
    return port


def stop_proxy(uid: int) -> None:
    """Stop ``uid``'s proxy, if it has one, and remove its files (blocking)."""
    directory = PROXIES / str(uid)
    pid = _pid(directory)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for name in ("policy.json", "policy.json.new", "pid", "port", "log"):
        (directory / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()


def proxy_uids(uids: range) -> list[int]:
    """The uids of ``uids`` that have a running proxy."""
    try:
        found = [int(d.name) for d in PROXIES.iterdir() if d.name.isdigit()]
    except OSError:
        return []
    return sorted(uid for uid in found if uid in uids and _pid(PROXIES / str(uid)) is not None)


def _pid(directory: Path) -> int | None:
    """The proxy's pid if that process is still this uid's proxy (not a reused pid)."""
    try:
        pid = int((directory / "pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if str(directory / "policy.json").encode() in argv else None


def _running(directory: Path) -> int | None:
    if _pid(directory) is None:
        return None
    try:
        return int((directory / "port").read_text())
    except (OSError, ValueError):
        return None
