"""Host ports for forwarded guest ports: chosen free on 127.0.0.1, unique in the home.

A forward is served by the session's passt; adding one restarts passt with the new list
(QEMU's stream server accepts the new connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable, Iterator

from forkpoint.config import Home
from forkpoint.errors import InternalError
from forkpoint.runtime.sessions.egress import install_filter, policy_of
from forkpoint.runtime.sessions.machines import jail_of
from forkpoint.store import SessionRecord, Store, global_lock
from forkpoint.vm import VmFiles
from forkpoint.vm.cgroups import join_cgroups_of
from forkpoint.vm.net import start_passt, stop_passt, wait_passt_ready

__all__ = ["HostPorts", "choosing_ports"]

_ATTEMPTS = 100


class HostPorts:
    """Allocates host ports (across processes: the home's ``ports`` lock) and restarts a
    session's network helper with its forwards."""

    def __init__(self, home: Home, store: Store) -> None:
        self.home = home
        self.store = store
        # Forks in this process queue here instead of polling the inter-process lock.
        self._lock = asyncio.Lock()

    async def allocate(self, session_id: str, guest_port: int) -> int:
        """A free host port, recorded as forwarding to ``guest_port`` of the session.

        :raises InternalError: no free port found.
        """
        async with self._lock:
            return await asyncio.to_thread(self._allocate, session_id, guest_port)

    def _allocate(self, session_id: str, guest_port: int) -> int:
        with choosing_ports(self.home, self.store) as pick:
            port = pick()
            self.store.add_port(session_id, guest_port, port)
            return port

    def adopt(self, session_id: str, forwards: Iterable[tuple[int, int]]) -> None:
        """Record the ``(host, guest)`` forwards a warm VM's passt already serves as the
        session's (their host ports were reserved for it, see :mod:`.warm`)."""
        with self.store.transaction():
            for host, guest in forwards:
                self.store.add_port(session_id, guest, host)

    def keep_or_move(self, session_id: str) -> dict[int, int]:
        """Before a session's VM starts again (rollback; ``recover`` after a host restart):
        keep each host port that is still free, move one something else took since to a
        new free port (passt could not bind it, and the session would not start). Returns
        ``{old: new}`` for the ports moved (blocking)."""
        with choosing_ports(self.home, self.store) as pick:
            record = self.store.get_session(session_id)
            if all(_bindable(p.host_port) for p in record.ports):
                return {}
            moved: dict[int, int] = {}
            with self.store.transaction():
                self.store.remove_ports(record.id)
                for p in record.ports:
                    host = p.host_port
                    if not _bindable(host):
                        host = moved[p.host_port] = pick()
                    self.store.add_port(record.id, p.guest_port, host)
            return moved

    def restart_network(self, files: VmFiles, session_id: str) -> None:
        """Restart the session's passt with all its recorded forwards (blocking)."""
        record: SessionRecord = self.store.get_session(session_id)
        # Before the old passt stops: no rules (no nft) must not cost the session its network.
        install_filter(jail_of(record), policy_of(record))  # the table may be gone (reboot)
        for pid in record.aux_pids:
            stop_passt(files, pid)
        forwards = [(p.host_port, p.guest_port) for p in record.ports]
        pid = start_passt(files, forwards, jail_of(record))
        if record.qemu_pid:
            join_cgroups_of(record.qemu_pid, pid)  # the session's cgroup, beside its QEMU
        self.store.update_session(record.id, aux_pids=[pid])
        wait_passt_ready(files, pid)


@contextlib.contextmanager
def choosing_ports(home: Home, store: Store) -> Iterator[Callable[[], int]]:
    """The home's ``ports`` lock, held while the block runs, and a picker of host ports
    free now and allocated to nobody (a session's forward or a warm VM's reservation)
    nor picked before in the block. Record what it picks before the block ends.

    :raises InternalError: (the picker) no free port found.
    """
    with global_lock(home, "ports"):
        taken: set[int] | None = None  # read on the first pick: most blocks pick none

        def pick() -> int:
            nonlocal taken
            if taken is None:
                taken = store.allocated_host_ports()
            port = _free_host_port(taken)
            taken.add(port)
            return port

        yield pick


def _free_host_port(taken: set[int]) -> int:
    """A port free on 127.0.0.1 now (the kernel's pick) and not in ``taken`` (see
    :func:`choosing_ports`).

    :raises InternalError: none found.
    """
    for _ in range(_ATTEMPTS):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in taken:
            return port
    raise InternalError("no free host port found on 127.0.0.1")


def _bindable(port: int) -> bool:
    """True if nothing listens on (or holds) ``127.0.0.1:port``."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
