"""Guest networking through passt, one helper process per VM.

QEMU listens on a unix stream socket (``-netdev stream,server=on``); forkpoint connects
to it and hands the connected socket to a fresh ``passt --fd``. passt gives the guest
outbound TCP/UDP, and forwards host ports bound to 127.0.0.1 only. With ``--no-map-gw``
the gateway address is *not* the host's loopback (unlike QEMU's slirp, where 10.0.2.2 is),
so a guest cannot reach services listening on the host's 127.0.0.1.

Changing the forwards means restarting passt: QEMU's stream server accepts the new
connection; only connections through the old passt are cut.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from forkpoint.errors import QemuError
from forkpoint.vm.files import VmFiles
from forkpoint.vm.process import kill_and_wait, spawn_detached

__all__ = ["GATEWAY", "GUEST_ADDRESS", "passt_log", "start_passt", "stop_passt"]

GUEST_ADDRESS = "10.0.2.15"
GATEWAY = "10.0.2.2"
DNS = "10.0.2.3"
_CONNECT_TIMEOUT_S = 10.0


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
    return files.dir / f"passt-{files.name}.log"


def start_passt(files: VmFiles, forwards: Iterable[tuple[int, int]]) -> int:
    """Start passt for ``files``' VM; returns its pid.

    ``forwards``: ``(host_port, guest_port)`` pairs, bound on 127.0.0.1 only.
    """
    sock = _connect(files.net_socket)
    try:
        argv = [
            _passt(), "--foreground", "--quiet", "--fd", str(sock.fileno()),
            "--no-map-gw", "--ipv4-only",
            "--address", GUEST_ADDRESS, "--netmask", "24", "--gateway", GATEWAY,
            "--dns", DNS, "--dns-forward", DNS, "--no-dhcp-search",
            "--log-file", str(passt_log(files)),
        ]  # fmt: skip
        for host, guest in sorted(forwards):
            argv += ["--tcp-ports", f"127.0.0.1/{host}:{guest}"]  # loopback only, always
        pid = spawn_detached(argv, files.qemu_log, (sock.fileno(),))
    finally:
        sock.close()
    return pid


def stop_passt(files: VmFiles, pid: int | None) -> None:
    kill_and_wait(pid, files.name)
