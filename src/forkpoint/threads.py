"""The threads forkpoint's blocking calls (``asyncio.to_thread``) run on.

asyncio's default pool has ``cpu_count + 4`` threads: 6 on a 2-core host. A fork x100
makes hundreds of short blocking calls (copying a layer, starting QEMU and passt,
``nft``, the store), many of them waiting on a child process or a lock rather than
using a core, and queued behind 6 threads the fan-out waited on the queue: measured,
fork x100 took 9.5 s with the default pool and 7.0 s with 48 threads (docs: "Fan-out").
Threads are started only as calls need them, so a small operation starts a few.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

__all__ = ["WORKERS", "use_fan_out_pool"]

WORKERS = 64


def use_fan_out_pool() -> None:
    """Make the running loop's default executor one of ``WORKERS`` threads."""
    pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="forkpoint")
    asyncio.get_running_loop().set_default_executor(pool)
