"""One agent connection per session, shared by everything this process does with it.

The agent protocol multiplexes requests by id, so a long ``exec`` and a ``read_file`` on
one session can share a connection. QEMU's chardev socket serves one client at a time,
though: the connection is held under an inter-process lock, and closed as soon as its
last user is done, so another process (a CLI next to a server) gets its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field

from forkpoint.agent_client import AgentClient

__all__ = ["AgentPool"]


@dataclass
class _Slot:
    """The shared connection to one session's agent and who is using it."""

    connecting: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    client: AgentClient | None = None
    generation: int = -1
    _held: AsyncExitStack | None = None

    def usable_for(self, generation: int) -> AgentClient | None:
        """The connection, unless it broke or the VM was restored since it was made."""
        if self.client is None or self.client.closed or generation > self.generation:
            return None
        return self.client

    async def open(
        self,
        lock: AbstractAsyncContextManager[None],
        generation: int,
        connect: Callable[[], Awaitable[AgentClient]],
    ) -> AgentClient:
        await self.close()
        held = AsyncExitStack()
        await held.enter_async_context(lock)
        try:
            client = await connect()
        except BaseException:
            await held.aclose()
            raise
        held.push_async_callback(client.close)  # closed before the lock is released
        self._held, self.client, self.generation = held, client, generation
        return client

    async def close(self) -> None:
        held, self._held, self.client = self._held, None, None
        if held is not None:
            await held.aclose()


class AgentPool:
    """Agent connections of one process, one per session at a time.

    ``lock(session_id)`` is the inter-process lock held while a connection is open.
    """

    def __init__(self, lock: Callable[[str], AbstractAsyncContextManager[None]]) -> None:
        self._lock = lock
        self._slots: dict[str, _Slot] = {}

    @contextlib.asynccontextmanager
    async def use(
        self,
        session_id: str,
        generation: int,
        connect: Callable[[], Awaitable[AgentClient]],
    ) -> AsyncIterator[AgentClient]:
        """The session's connection; ``connect()`` makes one when there is none yet, the
        last one broke, or it predates ``generation`` (the VM was restored since).

        Requests of all users run concurrently over it. A restore ends the old VM, so
        requests still running on its connection fail with ``AgentError`` as before.
        """
        slot = self._slots.setdefault(session_id, _Slot())
        slot.users += 1
        try:
            async with slot.connecting:
                client = slot.usable_for(generation) or await slot.open(
                    self._lock(session_id), generation, connect
                )
            yield client
        finally:
            slot.users -= 1
            if slot.users == 0:
                del self._slots[session_id]
                # Shielded: a cancelled last user must still hang up and release the lock.
                await asyncio.shield(slot.close())

    def connected(self) -> list[str]:
        """Sessions with an open connection now."""
        return [sid for sid, slot in self._slots.items() if slot.client is not None]
