"""A checkpoint fetched from the node that holds it, not through the store.

A checkpoint taken with ``FORKPOINT_CLUSTER_PUSH=0`` is on its node only. A fork or a
rollback on another node fetches it from there: the holder writes the checkpoint and its
lineage into one archive, once (the format of ``forkpoint checkpoint export``), and the
fetching node's pull reads that archive as an object store over actor calls
(:class:`NodeObjects`) — only the objects it lacks, in chunks, each verified as any
pull's. A pushed checkpoint comes from the store instead: its push was paid when it was
taken, and ``forkpoint bench --cluster`` measures both paths side by side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from forkpoint.errors import ForkpointError, InternalError, InvalidInput
from forkpoint.runtime.checkpoints.portable.objects import TransferCounter, check_size

__all__ = ["NodeObjects"]

_CHUNK = 8 << 20  # bytes per actor call
_ANSWER_WITHIN_S = 120.0  # a chunk; a holder silent longer is treated as gone
_EXPORT_WITHIN_S = 1800.0  # writing a whole lineage


class NodeObjects:
    """The holder's export of ``checkpoint`` as a read-only object store, for a pull on
    this node (:meth:`of` asks for the export, :meth:`release` says it is done).
    Blocking: a pull runs in a thread."""

    def __init__(self, holder: Any, checkpoint: str, name: str) -> None:
        self.holder = holder  # its daemon's actor handle
        self.checkpoint = checkpoint
        self.name = name
        self.counter = TransferCounter()

    @classmethod
    def of(cls, node: str, checkpoint: str) -> NodeObjects:
        """Node ``node``'s export of ``checkpoint``, made there if need be (it may take a
        while: the lineage is written once). :raises NodeLost: no daemon runs there."""
        import ray

        from forkpoint.cluster.connection import NodeLost, daemon_name

        try:
            holder = ray.get_actor(daemon_name(node))
        except ValueError:
            raise NodeLost(f"node {node[:12]}, which holds {checkpoint}, is gone") from None
        objects = cls(holder, checkpoint, node[:12])
        objects._ask("export", timeout_s=_EXPORT_WITHIN_S)
        return objects

    def release(self) -> None:
        """This node has what it needed: the holder may delete its archive."""
        with contextlib.suppress(ForkpointError):
            self._ask("export_drop")

    def describe(self) -> str:
        return f"node {self.name}'s export of {self.checkpoint}"

    def has(self, key: str) -> bool:
        return bool(self._ask("export_has", key))

    def put_file(self, key: str, path: Path) -> None:
        raise InvalidInput(f"{self.describe()} is read-only")

    def put_bytes(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        raise InvalidInput(f"{self.describe()} is read-only")

    def get_bytes(self, key: str) -> bytes:
        data = b"".join(self._chunks(key))
        self.counter.received(key, len(data))
        return data

    def get_file(self, key: str, dest: Path, max_bytes: int | None = None) -> None:
        size = 0
        with dest.open("wb") as out:
            for chunk in self._chunks(key):
                size += len(chunk)
                check_size(key, size, max_bytes)
                out.write(chunk)
        self.counter.received(key, size)

    def _chunks(self, key: str) -> Iterator[bytes]:
        offset = 0
        while True:
            chunk: bytes = self._ask("export_read", key, offset, _CHUNK)
            if chunk:
                yield chunk
            if len(chunk) < _CHUNK:
                return
            offset += len(chunk)

    def _ask(self, method: str, *args: Any, timeout_s: float = _ANSWER_WITHIN_S) -> Any:
        """The holder's ``method``; its errors as forkpoint's, a silence as one too."""
        import ray

        from forkpoint.cluster.connection import daemon_errors

        try:
            with daemon_errors(lambda: self.name, f"{method} of {self.checkpoint}"):
                answer = getattr(self.holder, method).remote(self.checkpoint, *args)
                return ray.get(answer, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise InternalError(
                f"node {self.name} did not answer {method} for {self.checkpoint} "
                f"within {timeout_s:.0f} s"
            ) from None
