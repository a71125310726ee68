"""Guest networking through passt, one helper process per VM.

QEMU listens on a unix stream socket (``-netdev stream,server=on``); forkpoint connects
to it and hands the connected socket to a fresh ``passt --fd``. passt gives the guest
outbound TCP/UDP, and forwards host ports bound to 127.0.0.1 only. With ``--no-map-gw``
the gateway address is *not* the host's loopback (unlike QEMU's slirp, where 10.0.2.2 is),
so a guest cannot reach services listening on the host's 127.0.0.1.

Changing the forwards means restarting passt: QEMU's stream server accepts the new
connection; only connections through the old passt are cut.

The guest's resolver is ``DNS`` (its ``/etc/resolv.conf``); passt forwards what it sends
there to the host's first ``nameserver``. Not ``--dns``: given that, the passt of Debian 12
reads no ``/etc/resolv.conf`` and forwards the queries to the host's own port 53 instead.

A passt that cannot start (a forward's port taken, no user namespace allowed, ...) exits
at once; :func:`wait_passt_ready` turns that into an error carrying passt's own last log
line instead of forwards that silently never answer. passt's log is under ``/tmp``, not
``$FORKPOINT_HOME``: Debian's AppArmor profile for passt lets it write only under
``/tmp`` and home directories, and a passt that cannot open its log file exits.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from forkpoint.errors import QemuError
from forkpoint.polling import poll_until, poll_until_sync
from forkpoint.vm.files import VmFiles
from forkpoint.vm.jail import Jail
from forkpoint.vm.logcap import PASST_LOG_BYTES
from forkpoint.vm.process import exit_status, kill_and_wait, spawn_detached

__all__ = [
    "GATEWAY",
    "GUEST_ADDRESS",
    "passt_log",
    "passt_ready",
    "remove_passt_log",
    "start_passt",
    "stop_passt",
    "wait_passt_ready",
]

GUEST_ADDRESS = "10.0.2.15"
GATEWAY = "10.0.2.2"
DNS = "10.0.2.3"
_CONNECT_TIMEOUT_S = 10.0
# passt is ready in ≈ 50 ms, but a 2-core host starting 100 VMs at once made 2 of them
# wait more than 4 s (bench). A passt that cannot start exits at once instead: only a
# slow start ever waits this long.
_READY_TIMEOUT_S = 30.0
_READY_MAX_POLL_S = 0.005  # checks every 2 ms at first, backing off to this
# Not $TMPDIR: the AppArmor profile names /tmp itself.
_LOG_ROOT = Path("/tmp")
_TIMESTAMP = re.compile(r"^\d+\.\d+:\s*")


def _passt() -> str:
    found = shutil.which("passt")
    if not found:
        raise QemuError("passt not found: install Debian's passt (make setup)")
    return found


def _connect(net_socket: Path) -> socket.socket:
    deadline = time.monotonic() + _CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(net_socket))
            return sock
        except OSError as error:
            sock.close()
            if time.monotonic() > deadline:
                raise QemuError(f"cannot connect to the VM's network socket: {error}") from None
            time.sleep(0.002)


def passt_log(files: VmFiles) -> Path:
    # The VM's unique name in the path also marks passt's argv as belonging to this VM.
    return _LOG_ROOT / f"forkpoint-passt-{os.getuid()}" / f"{files.name}.log"


def _log_dir(files: VmFiles) -> Path:
    """The per-user log directory, made private; refused if someone else owns it."""
    directory = passt_log(files).parent
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise QemuError(f"{directory} is not a private directory of this user: remove it")
    return directory


def remove_passt_log(files: VmFiles) -> None:
    passt_log(files).unlink(missing_ok=True)


def start_passt(files: VmFiles, forwards: Iterable[tuple[int, int]], jail: Jail) -> int:
    """Start passt for ``files``' VM, as ``jail``'s uid; returns its pid.

    ``forwards``: ``(host_port, guest_port)`` pairs, bound on 127.0.0.1 only.
    """
    _log_dir(files)
    sock = _connect(files.net_socket)
    try:
        argv = [
            _passt(), "--foreground", "--quiet", "--fd", str(sock.fileno()),
            "--no-map-gw", "--ipv4-only",
            "--address", GUEST_ADDRESS, "--netmask", "24", "--gateway", GATEWAY,
            "--dns-forward", DNS, "--no-dhcp-search",
            "--log-file", str(passt_log(files)), "--log-size", str(PASST_LOG_BYTES),
            *jail.passt_args(),
        ]  # fmt: skip
        for host, guest in sorted(forwards):
            argv += ["--tcp-ports", f"127.0.0.1/{host}:{guest}"]  # loopback only, always
        pid = spawn_detached(argv, files.qemu_log, (sock.fileno(),))
    finally:
        sock.close()
    return pid


def stop_passt(files: VmFiles, pid: int | None) -> None:
    kill_and_wait(pid, files.name)


def wait_passt_ready(files: VmFiles, pid: int, timeout_s: float = _READY_TIMEOUT_S) -> None:
    """Return once passt serves; raise with passt's own reason if it exited instead.

    passt confines itself with seccomp as the last step before it serves (after binding
    the forwards and entering its namespaces), so ``Seccomp: 2`` in its status is ready.
    :raises QemuError: passt exited, or was not ready within ``timeout_s`` (then killed).
    """
    poll_until_sync(
        lambda: _ready(files, pid),
        timeout_s=timeout_s,
        timed_out=lambda: _not_started(files, pid, timeout_s),
        max_interval_s=_READY_MAX_POLL_S,
    )


async def passt_ready(files: VmFiles, pid: int, timeout_s: float = _READY_TIMEOUT_S) -> None:
    """:func:`wait_passt_ready` on the event loop: a fan-out's hundred waits hold no
    worker thread between checks (each check, one read of ``/proc``, takes one briefly)."""

    async def check() -> bool | None:
        return await asyncio.to_thread(_ready, files, pid)

    await poll_until(
        check,
        timeout_s=timeout_s,
        timed_out=lambda: _not_started(files, pid, timeout_s),
        max_interval_s=_READY_MAX_POLL_S,
    )


def _ready(files: VmFiles, pid: int) -> bool | None:
    """True once passt serves, None while it starts. :raises QemuError: it exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        status = ""
    if "\nSeccomp:\t2" in status and "\nState:\tZ" not in status:
        return True
    if not status or "\nState:\tZ" in status:
        how = exit_status(pid)  # reaps it
        raise QemuError(f"{files.name}: passt exited at start-up ({how}): {_reason(files)}")
    return None


def _not_started(files: VmFiles, pid: int, timeout_s: float) -> QemuError:
    stop_passt(files, pid)
    return QemuError(f"{files.name}: passt did not start within {timeout_s:g} s: {_reason(files)}")


def _reason(files: VmFiles) -> str:
    """passt's last log line (its errors say what failed), else the last line of QEMU's
    log, where passt's own output goes (e.g. when it cannot open its log file)."""
    for path in (passt_log(files), files.qemu_log):
        try:
            lines = path.read_text(errors="replace").split("\n")
        except OSError:
            continue
        last = next((line for line in reversed(lines) if line.strip()), None)
        if last:  # "0.0492: ERROR:   Failed to bind ..." -> "ERROR: Failed to bind ..."
            return " ".join(_TIMESTAMP.sub("", last).split())
    return "it logged nothing"
