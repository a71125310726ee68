"""Capped logs: a guest printing forever must not fill the host's disk.

A session's serial console goes to a ring buffer inside QEMU (``-chardev ringbuf``), not to
a file: QEMU's ``file`` chardev has no size limit, and a jailed QEMU cannot reopen a file
by path to rotate it. The ring keeps the last :data:`SERIAL_RING_BYTES` the guest printed;
forkpoint drains it over QMP (``ringbuf-read``) into ``serial.log`` when it wants the
console — for an error report, or ``forkpoint console`` — and keeps that file under
:data:`~.logcap.LOG_CAP_BYTES` by dropping its oldest half. What a session prints costs the host
nothing until then, and never more than the cap. The price: a guest whose QEMU exits by
itself (a kernel panic, a reboot) takes its last ring contents with it.

An image's template boot (our own image, bounded by a timeout) keeps a plain file
(``console_file``), so a boot that panics still leaves its console to read.

QEMU's own log (its and passt's standard error, opened ``O_APPEND``) is trimmed the same
way by :func:`~.logcap.trim_log` whenever forkpoint looks after the session (every CLI call, the
server's reaper): unlike the console it is not guest output, though a guest can provoke
device errors into it. passt's own log caps itself (``--log-size``).
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

from forkpoint.errors import QemuError
from forkpoint.vm.files import VmFiles
from forkpoint.vm.logcap import LOG_CAP_BYTES, trim_log
from forkpoint.vm.qmp import Qmp

__all__ = ["SERIAL_RING_BYTES", "chardev", "drain_console", "read_tail"]

SERIAL_RING_BYTES = 256 << 10  # a power of two (QEMU's rule); QEMU memory, per VM
_CHARDEV_ID = "ser0"


def chardev(files: VmFiles, *, ring: bool) -> str:
    """The ``-chardev`` of the serial console (the device side, ``-serial chardev:ser0``,
    is the same either way: the backend is not part of the saved device state)."""
    if ring:
        return f"ringbuf,id={_CHARDEV_ID},size={SERIAL_RING_BYTES}"
    return f"file,id={_CHARDEV_ID},path={files.serial_log},append=on"


async def drain_console(qmp: Qmp, files: VmFiles) -> None:
    """Move what the ring holds into ``serial.log`` (then capped). A VM whose console is a
    file has nothing to drain (QEMU says the device is no ring buffer)."""
    try:
        data = await qmp.run(
            "ringbuf-read", device=_CHARDEV_ID, size=SERIAL_RING_BYTES, format="base64"
        )
    except QemuError:
        return
    if data:
        await asyncio.to_thread(_append, files.serial_log, base64.b64decode(data))


def _append(log: Path, data: bytes) -> None:
    with log.open("ab") as out:
        out.write(data)
    trim_log(log, LOG_CAP_BYTES)


def read_tail(files: VmFiles, max_bytes: int) -> str:
    """The last ``max_bytes`` of ``serial.log`` as text ("" if there is none)."""
    try:
        with files.serial_log.open("rb") as log:
            size = log.seek(0, 2)
            log.seek(max(0, size - max_bytes))
            return log.read().decode(errors="replace")
    except OSError:
        return ""
