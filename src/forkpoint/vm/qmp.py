"""A thin QMP session on top of the official ``qemu.qmp`` client.

Adds what every caller needs: connecting while QEMU is still starting, deadlines, and
errors that carry QEMU's own message and the tail of its log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from qemu.qmp import ConnectError, EventListener, ExecuteError, QMPClient, QMPError

from forkpoint.errors import QemuError
from forkpoint.polling import poll_until

__all__ = ["Qmp"]

# qemu.qmp logs every hiccup at WARNING; our own errors already say what went wrong.
logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)


class Qmp:
    """One connected QMP monitor. Use :meth:`connect`, then :meth:`run`, then :meth:`close`."""

    def __init__(self, client: QMPClient, describe: str) -> None:
        self._client = client
        self._describe = describe

    @classmethod
    async def connect(
        cls,
        socket: Path,
        timeout_s: float,
        describe: str = "QEMU",
        alive: Callable[[], bool] = lambda: True,
    ) -> Qmp:
        """Connect to ``socket``, retrying while QEMU creates it (and ``alive()`` holds).

        :raises QemuError: QEMU died, or no connection within ``timeout_s`` seconds.
        """
        last_error: Exception | str = "no socket yet"

        async def attempt() -> Qmp | None:
            nonlocal last_error
            # a cheap check first: many VMs may be starting at once
            if await asyncio.to_thread(socket.exists):
                client = QMPClient(describe)
                try:
                    await client.connect(str(socket))
                    return cls(client, describe)
                except (ConnectError, OSError) as failure:
                    last_error = failure
            if not alive():
                raise QemuError(f"{describe}: QEMU exited during start-up")
            return None

        return await poll_until(
            attempt,
            timeout_s=timeout_s,
            timed_out=lambda: QemuError(
                f"{describe}: QMP socket did not answer within {timeout_s:g} s: {last_error}"
            ),
        )

    async def run(self, command: str, **arguments: Any) -> Any:
        """Execute ``command``; QEMU's error becomes a QemuError naming the command."""
        try:
            return await self._client.execute(command, arguments or None)
        except ExecuteError as error:
            desc = error.error.error.desc
            raise QemuError(f"{self._describe}: {command} failed: {desc}") from error
        except (QMPError, OSError, EOFError) as error:
            raise QemuError(
                f"{self._describe}: {command}: QMP connection lost ({error})"
            ) from error

    async def run_until_event(
        self, event: str, action: Callable[[], Awaitable[None]], timeout_s: float
    ) -> None:
        """Run ``action`` and wait until QEMU emits ``event`` (listening from before it).

        :raises QemuError: no such event within ``timeout_s`` seconds.
        """
        listener = EventListener((event,))
        with self._client.listen(listener):
            await action()
            try:
                await asyncio.wait_for(listener.get(), timeout_s)
            except TimeoutError:
                raise QemuError(f"{self._describe}: no {event} within {timeout_s:g} s") from None

    def send_fd(self, fd: int) -> None:
        self._client.send_fd_scm(fd)

    async def close(self) -> None:
        try:
            await self._client.disconnect()
        except (QMPError, OSError, EOFError):
            pass  # QEMU already gone: nothing left to close
