"""A session's egress filter: installed before its passt starts (create, fork, rollback,
a port forward's passt restart), replaced live by :mod:`.egress_rules`, removed
with the session. See :mod:`forkpoint.vm.nftables`. A policy that names hosts comes with
its egress proxy (:mod:`forkpoint.vm.egress_proxies`), started and stopped with the rules.

The filter matches the session's own uid, so it exists only when VMs are jailed (forkpoint
runs as root); without root passt runs as the user who runs forkpoint, whose own traffic no
per-uid rule may touch: that is said once per process, and guests connect unfiltered.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from forkpoint.egress import EgressPolicy
from forkpoint.errors import InternalError
from forkpoint.models import SESSION_UIDS
from forkpoint.store import SessionRecord
from forkpoint.vm.egress_proxies import proxy_for, stop_proxy
from forkpoint.vm.jail import Jail, jails_processes
from forkpoint.vm.nftables import install_rules, remove_rules

__all__ = ["install_filter", "policy_of", "remove_filter"]

_log = logging.getLogger("forkpoint.egress")


def policy_of(record: SessionRecord) -> EgressPolicy:
    return EgressPolicy.from_json(record.egress)


def install_filter(jail: Jail, policy: EgressPolicy) -> None:
    """Install the egress rules of ``jail``'s uid (blocking); call before passt starts.

    :raises InternalError: nftables is missing or refused them (the VM must not start).
    """
    if not jails_processes():
        _warn_unfiltered()
        return
    # Every session uid of every home: one with no rules of its own is refused everything.
    install_rules(jail.uid, policy, SESSION_UIDS, proxy_for(jail.uid, policy))


def remove_filter(record: SessionRecord) -> None:
    """Remove the session's rules (blocking); best effort: a session is removed anyway."""
    if record.uid is None or not jails_processes():
        return
    with contextlib.suppress(InternalError):
        remove_rules(record.uid, policy_of(record))
    stop_proxy(record.uid)


@functools.cache
def _warn_unfiltered() -> None:
    _log.warning(
        "egress policy not enforced: forkpoint runs without root, so guests connect as "
        "your own user, unfiltered (see docs/architecture.md, 'Egress')"
    )
