"""Where the gateway keeps its own rows: its sandboxes' (tokens, metadata, template) and
its template builds'. On one host both are in the runtime's store, a sandbox's row beside
its session (and gone with it); on a cluster the sandboxes' are in the cluster's store,
so a sandbox revived on another node keeps them (``forkpoint.cli.e2b.gateway_tables``
chooses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from forkpoint.store import Store
from forkpoint.store.e2b import E2bSandboxRecord, E2bStore

__all__ = ["GatewayTables", "SandboxRecords"]


class SandboxRecords(Protocol):
    def insert(self, record: E2bSandboxRecord) -> E2bSandboxRecord: ...

    def get(self, session_id: str) -> E2bSandboxRecord:
        """:raises NotFound:"""
        ...

    def list(self) -> list[E2bSandboxRecord]: ...

    def delete(self, session_id: str) -> None: ...


@dataclass(frozen=True)
class GatewayTables:
    sandboxes: SandboxRecords
    templates: Store  # the E2B template builds' tables

    @classmethod
    def beside(cls, store: Store) -> GatewayTables:
        """One host's: in the runtime's own store."""
        return cls(E2bStore(store), store)
