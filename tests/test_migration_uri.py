"""Which QMP commands a restore and a full-state save send, per QEMU version.

A fake QMP server (a real unix socket speaking the protocol, answering like QEMU) records
the commands and the descriptors passed to it; the real QEMU paths are covered by the
engine tests on whatever QEMU the host has.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from forkpoint.vm import Machine, QemuBuild, VmFiles
from forkpoint.vm.qmp import Qmp

DEBIAN_12 = "7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"
UBUNTU_24 = "8.2.2 (Debian 1:8.2.2+ds-0ubuntu1)"
DEBIAN_13 = "10.0.2 (Debian 1:10.0.2+ds-2)"
_FDSET = 3  # what the fake answers add-fd with: the URI must use QEMU's number


class FakeQemuMonitor:
    """Answers QMP on ``path`` like a QEMU whose migrations complete at once."""

    def __init__(self, path: Path, state: str) -> None:
        self.state = state  # QEMU's run state
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.fd_modes: list[int] = []  # O_ACCMODE of each descriptor passed to us
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _reply(self, command: str) -> Any:
        # Loads and saves complete at once.
        moves = {"stop": "paused", "cont": "running", "migrate-incoming": "paused"}
        self.state = moves.get(command, self.state)
        return {
            "query-status": {"status": self.state, "running": self.state == "running"},
            "query-migrate": {"status": "completed"},
            "add-fd": {"fdset-id": _FDSET, "fd": 42},
        }.get(command, {})

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        with conn:
            greeting = {"QMP": {"version": {"qemu": {"major": 0, "minor": 0, "micro": 0},
                                            "package": ""}, "capabilities": []}}  # fmt: skip
            conn.sendall(json.dumps(greeting).encode() + b"\r\n")
            buffer = ""
            decoder = json.JSONDecoder()
            while True:
                data, fds, _, _ = socket.recv_fds(conn, 65536, 4)
                if not data:
                    return
                for fd in fds:
                    self.fd_modes.append(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE)
                    os.close(fd)
                buffer += data.decode()
                while buffer.strip():
                    try:
                        message, end = decoder.raw_decode(buffer.lstrip())
                    except json.JSONDecodeError:
                        break  # the rest of this message is still on its way
                    buffer = buffer.lstrip()[end:]
                    command = message["execute"]
                    if command != "qmp_capabilities":
                        self.commands.append((command, message.get("arguments", {})))
                    answer = {"return": self._reply(command), "id": message.get("id")}
                    conn.sendall(json.dumps(answer).encode() + b"\r\n")

    def close(self) -> None:
        self._server.close()
        self._thread.join(timeout=5)


def run_on_fake_qemu(
    tmp_path: Path, version: str, state: str, action: Callable[[Machine], Awaitable[object]]
) -> FakeQemuMonitor:
    """Run ``action`` on a Machine whose monitor is the fake (in run ``state``)."""
    monitor = FakeQemuMonitor(tmp_path / "qmp.sock", state)
    build = QemuBuild(binary=Path("/nonexistent/qemu"), version=version, digest="0" * 16)

    async def scenario() -> None:
        qmp = await Qmp.connect(tmp_path / "qmp.sock", 5.0, "fake")
        machine = Machine(VmFiles(tmp_path, "fake-vm"), os.getpid(), qmp, build)
        try:
            await action(machine)
        finally:
            await machine.close()

    try:
        asyncio.run(scenario())
    finally:
        monitor.close()
    return monitor


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (DEBIAN_12, [("getfd", {"fdname": "incoming"}),
                     ("migrate-incoming", {"uri": "fd:incoming"})]),
        (UBUNTU_24, [("add-fd", {}),
                     ("migrate-incoming", {"uri": f"file:/dev/fdset/{_FDSET}"}),
                     ("remove-fd", {"fdset-id": _FDSET})]),
        (DEBIAN_13, [("add-fd", {}),
                     ("migrate-incoming", {"uri": f"file:/dev/fdset/{_FDSET}",
                                           "exit-on-error": False}),
                     ("remove-fd", {"fdset-id": _FDSET})]),
    ],
)  # fmt: skip
def test_restore_loads_through_file_uri_from_qemu_8_2_and_fd_before(
    tmp_path: Path, version: str, expected: list[tuple[str, dict[str, Any]]]
) -> None:
    state = tmp_path / "state"
    state.write_bytes(b"QEVM")
    monitor = run_on_fake_qemu(
        tmp_path, version, "inmigrate", lambda vm: vm.restore(state, run=False)
    )
    assert monitor.commands[: len(expected)] == expected
    assert monitor.fd_modes == [os.O_RDONLY]  # an fd set matches the mode QEMU opens with


@pytest.mark.parametrize(
    ("version", "uri", "fd_commands"),
    [
        (DEBIAN_12, "fd:ckpt", [("getfd", {"fdname": "ckpt"})]),
        (DEBIAN_13, f"file:/dev/fdset/{_FDSET}", [("add-fd", {})]),
    ],
)
def test_full_state_save_writes_through_file_uri_on_new_qemu(
    tmp_path: Path, version: str, uri: str, fd_commands: list[tuple[str, dict[str, Any]]]
) -> None:
    monitor = run_on_fake_qemu(
        tmp_path, version, "running", lambda vm: vm.save_state(tmp_path / "saved")
    )
    names = [name for name, _ in monitor.commands]
    assert names[names.index("stop") + 1 : names.index("migrate")] == [
        name for name, _ in fd_commands
    ]
    assert ("migrate", {"uri": uri}) in monitor.commands
    assert monitor.fd_modes == [os.O_WRONLY]
    assert names[-1] == "cont"
    if version == DEBIAN_13:  # the fd set is released once the save completed
        assert names.index("remove-fd") > names.index("query-migrate")
