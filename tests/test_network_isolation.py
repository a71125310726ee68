"""Security baseline: forwards bind 127.0.0.1 only, and a guest cannot reach the host's
loopback (the API, other sessions' forwards, any local service) by any route."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from forkpoint.errors import Conflict
from forkpoint.runtime import Runtime
from forkpoint.vm.net import GATEWAY

pytestmark = pytest.mark.vm

PROBE = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((host, port), timeout=3)
    print("CONNECTED", s.recv(64).decode(errors="replace"))
except OSError as e:
    print("REFUSED", type(e).__name__, e)
"""


@pytest.fixture
def loopback_service() -> Iterator[int]:
    """A host service on 127.0.0.1 that greets whoever connects."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"host-loopback-secret")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    server.close()


@contextlib.contextmanager
def blackholed(address: str) -> Iterator[None]:
    """Keep probes of the gateway address on this machine: a SYN that passt would send to
    the real network for it is dropped by the host's routing instead."""
    added = (
        subprocess.run(
            ["ip", "route", "add", "blackhole", f"{address}/32"], capture_output=True, check=False
        ).returncode
        == 0
    )
    try:
        yield
    finally:
        if added:
            subprocess.run(["ip", "route", "del", "blackhole", f"{address}/32"], check=False)


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True)
    return [line.split()[3].split("/")[0] for line in out.stdout.splitlines()]


@pytest.mark.smoke
def test_guest_cannot_reach_host_loopback_and_forwards_are_loopback_only(
    loopback_service: int,
) -> None:
    async def scenario() -> None:
        rt = Runtime.open()
        session = await rt.create(ports=[8000])
        other = await rt.create(ports=[8000])
        try:
            await rt.spawn(other.id, ["python3", "-m", "http.server", "8000"], cwd="/")
            targets = [(GATEWAY, loopback_service), ("127.0.0.1", loopback_service)]
            targets += [(a, loopback_service) for a in _host_addresses() if a != "127.0.0.1"]
            # another session's forward lives on the host's loopback too
            targets.append((GATEWAY, other.ports[0].host_port))
            with blackholed(GATEWAY):
                for host, port in targets:
                    result = await rt.exec(
                        session.id, ["python3", "-c", PROBE, host, str(port)], timeout=60
                    )
                    out = result.stdout
                    assert out.startswith("REFUSED"), f"guest reached {host}:{port}: {out}"
            # every socket passt listens on is bound to 127.0.0.1
            for sid in (session.id, other.id):
                for pid in rt.store.get_session(sid).aux_pids:
                    listening = _listening_addresses(pid)
                    assert listening, f"passt {pid} listens nowhere"
                    assert all(addr == "127.0.0.1" for addr in listening), listening
        finally:
            await rt.remove(session.id)
            await rt.remove(other.id)
            rt.close()

    asyncio.run(scenario())


def _listening_addresses(pid: int) -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," in line:
            local = line.split()[3]
            found.append(local.rsplit(":", 1)[0].strip("[]"))
    return found


def test_network_none_has_no_outbound_and_no_forwards() -> None:
    async def scenario() -> None:
        rt = Runtime.open()
        session = await rt.create(network="none")
        try:
            assert rt.store.get_session(session.id).aux_pids == ()  # no passt at all
            result = await rt.exec(session.id, ["python3", "-c", PROBE, GATEWAY, "53"], timeout=60)
            assert result.stdout.startswith("REFUSED"), result.stdout
            with pytest.raises(Conflict, match="no network"):
                await rt.forward_port(session.id, 8000)
        finally:
            await rt.remove(session.id)
            rt.close()

    asyncio.run(scenario())
