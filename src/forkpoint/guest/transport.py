"""Byte channels the agent serves on: the virtio-serial port, or a unix socket for tests.

Both give ``recv()`` (blocks; raises Disconnected when the current host connection ended,
then the next call waits for a new one) and ``send()`` (returns False instead of raising
when the host is gone, so a response to a vanished host is simply dropped).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from typing import Final, Protocol

__all__ = [
    "Disconnected",
    "Transport",
    "TransportClosed",
    "UnixClientTransport",
    "VirtioPortTransport",
    "find_virtio_port",
]

READ_BYTES: Final = 64 * 1024
IDLE_POLL_S: Final = 0.05  # the test transport's reconnect interval
# With no host connected the port reports POLLHUP on every poll, but the driver wakes its
# wait queue only when a host connects or data comes: edge-triggered epoll sleeps until
# then. The timeout is a safety net; at 50 ms (the seed's polling) an idle guest woke its
# agent 20 times a second, most of an idle VM's CPU under TCG (docs: "The VM").
HOST_WAIT_S: Final = 1.0
_SYSFS_PORTS: Final = "/sys/class/virtio-ports"


class Disconnected(Exception):
    """The host side of the channel went away (the agent keeps serving)."""


class TransportClosed(Exception):
    """The channel cannot be used any more (the agent should exit)."""


class Transport(Protocol):
    def recv(self) -> bytes: ...

    def send(self, data: bytes) -> bool: ...

    def close(self) -> None: ...


def find_virtio_port(name: str = "agent", *, timeout: float = 30.0) -> str:
    """Return ``/dev/vportNpM`` of the virtio-serial port called ``name``.

    Waits up to ``timeout`` seconds for the driver and devtmpfs node. Raises
    FileNotFoundError if it never appears.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            entries = sorted(os.listdir(_SYSFS_PORTS))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            try:
                with open(os.path.join(_SYSFS_PORTS, entry, "name")) as f:
                    port_name = f.read().strip()
            except OSError:
                continue
            dev = f"/dev/{entry}"
            if port_name == name and os.path.exists(dev):
                return dev
        if time.monotonic() > deadline:
            raise FileNotFoundError(f"no virtio-serial port named {name!r} under {_SYSFS_PORTS}")
        time.sleep(0.05)


class VirtioPortTransport:
    """The guest end of QEMU's ``virtserialport`` (host end: a chardev socket server).

    With no host client connected, ``read`` returns 0 and ``poll`` reports POLLHUP; the
    port stays usable and data flows again once a host connects (also after a VM
    restore). Waiting uses edge-triggered epoll, which the driver wakes on data and on
    host connect/disconnect (see ``HOST_WAIT_S``).
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._ep = select.epoll()
        self._ep.register(self._fd, select.EPOLLIN | select.EPOLLET)
        self._connected = False

    def recv(self) -> bytes:
        while True:
            data: bytes | None
            try:
                data = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                data = None  # a host is connected, nothing to read yet
            except OSError:
                data = b""
            if data:
                self._connected = True
                return data
            if data is None:
                self._connected = True
                self._ep.poll(HOST_WAIT_S)
                continue
            if self._connected:  # the host connection just ended
                self._connected = False
                raise Disconnected
            self._ep.poll(HOST_WAIT_S)

    def send(self, data: bytes) -> bool:
        view = memoryview(data)
        poller: select.poll | None = None
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                # Full, or no host: the driver blocks writes while the host is away.
                if poller is None:
                    poller = select.poll()
                    poller.register(self._fd, select.POLLOUT)
                for _, revents in poller.poll(1000):
                    if revents & (select.POLLHUP | select.POLLERR):
                        return False
                continue
            except OSError:  # ENODEV, EIO, EPIPE: the host is gone
                return False
            view = view[n:]
        return True

    def close(self) -> None:
        self._ep.close()
        os.close(self._fd)


class UnixClientTransport:
    """Test transport: connect to a unix socket a host-side test listens on.

    When the peer closes, ``recv`` raises Disconnected and the next ``recv`` reconnects
    (as a host reconnecting to QEMU's chardev would). Raises TransportClosed when no
    connection succeeds within ``reconnect_timeout`` seconds.
    """

    def __init__(self, path: str, *, reconnect_timeout: float = 10.0) -> None:
        self._path = path
        self._timeout = reconnect_timeout
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self._timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self._path)
            except OSError as e:
                sock.close()
                if time.monotonic() > deadline:
                    raise TransportClosed(f"cannot connect to {self._path}: {e}") from None
                time.sleep(IDLE_POLL_S)
                continue
            with self._send_lock:
                self._sock = sock
            return sock

    def recv(self) -> bytes:
        sock = self._sock or self._connect()
        try:
            data = sock.recv(READ_BYTES)
        except OSError:
            data = b""
        if data:
            return data
        try:  # wake a sender blocked on this socket before closing it
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._send_lock:
            self._sock = None
            sock.close()
        raise Disconnected

    def send(self, data: bytes) -> bool:
        with self._send_lock:
            if self._sock is None:
                return False
            try:
                self._sock.sendall(data)
            except OSError:  # the peer went away: drop, the reader notices and resets
                return False
            return True

    def close(self) -> None:
        with self._send_lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
