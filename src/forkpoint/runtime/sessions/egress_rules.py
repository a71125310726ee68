"""Changing a session's egress adjustments while it lives (E2B's ``update_network``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from forkpoint.egress import EgressPolicy
from forkpoint.errors import Conflict, InternalError
from forkpoint.models import Network, Session, SessionState
from forkpoint.runtime.context import RuntimeContext
from forkpoint.runtime.sessions.egress import install_filter, policy_of
from forkpoint.store import session_lock_async
from forkpoint.vm.jail import Jail, jails_processes
from forkpoint.vm.nftables import forget_policy

__all__ = ["EgressRules"]


class EgressRules:
    def __init__(self, context: RuntimeContext) -> None:
        self.context = context

    async def injected_headers(self, session: str) -> dict[str, dict[str, str]]:
        """The headers the session's egress proxy sets, by host (not shown in a
        :class:`Session`: they are credentials). :raises NotFound:"""
        record = await asyncio.to_thread(self.context.store.get_session, session)
        headers: dict[str, dict[str, str]] = record.egress.get("headers", {})
        return headers  # as EgressPolicy.to_json keeps them

    async def set_egress(
        self,
        session: str,
        allow_net: Sequence[str] = (),
        deny_net: Sequence[str] = (),
        inject_headers: Mapping[str, Mapping[str, str]] | None = None,
    ) -> Session:
        """Replace the session's egress adjustments and injected headers (empty: the
        defaults). A running guest is held to them at once, for every connection it opens
        from then on (one already open stays open); a stopped or paused one when it runs
        again.

        :raises NotFound: :raises InvalidInput: a malformed CIDR or too many;
        :raises Conflict: the session has no network (``--network none``).
        """
        from forkpoint.requests import EgressRequest, parse

        request = parse(
            EgressRequest, allow_net=tuple(allow_net), deny_net=tuple(deny_net),
            inject_headers=dict(inject_headers or {}),
        )  # fmt: skip
        policy = EgressPolicy.of(request.allow_net, request.deny_net, request.inject_headers)
        record = await asyncio.to_thread(self.context.store.get_session, session)
        async with session_lock_async(self.context.home, record.id):
            record = await asyncio.to_thread(self.context.store.get_session, record.id)
            if record.network == Network.NONE:
                raise Conflict(f"session {record.id} has no network: no egress to adjust")
            before = policy_of(record)
            if record.state == SessionState.RUNNING and record.uid is not None:
                await asyncio.to_thread(install_filter, Jail(record.uid), policy)
            record = await asyncio.to_thread(
                self.context.store.update_session, record.id, egress=policy.to_json()
            )
            if before != policy and jails_processes():
                with contextlib.suppress(InternalError):  # only tidying: maps no chain uses
                    await asyncio.to_thread(forget_policy, before)
        return await asyncio.to_thread(self.context.queries.session_of, record)
