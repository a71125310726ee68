"""E2B's network options on forkpoint's terms: ``allowOut``/``denyOut`` and
``allow_internet_access`` as a session's egress adjustments, ``maskRequestHost`` checked.

E2B lets an allowed destination beat any denied one; forkpoint's policy lets the most
specific CIDR win, a tie going to deny (:mod:`forkpoint.vm.egress`). Two CIDRs are either
nested or disjoint, so the two agree once every denied CIDR lying inside an allowed one is
dropped: what is left of the denies is either disjoint from the allows or wider than them.
Host names (``pypi.org``, ``*.example.com``) are carried as they are: forkpoint's egress
proxy lets an allowed name beat a denied one, as E2B does.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from forkpoint.errors import InvalidInput
from forkpoint.models import MAX_EGRESS_RULES
from forkpoint.vm.egress import EgressPolicy, is_host_name, parse_rule

__all__ = ["ALL_TRAFFIC", "Egress", "egress_of", "host_mask", "refuse_rules"]

#: E2B's ``ALL_TRAFFIC`` (IPv4 only); denying it denies IPv6 too, as E2B guests have none.
ALL_TRAFFIC = "0.0.0.0/0"
_ALL_V6 = "::/0"
# A host name with an optional port; ``${PORT}`` stands for the port the request is for.
_HOST_MASK = re.compile(r"^([A-Za-z0-9.-]|\$\{PORT\})+(:([0-9]{1,5}|\$\{PORT\}))?$")


@dataclass(frozen=True)
class Egress:
    """A session's egress adjustments, in forkpoint's terms."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @property
    def no_internet(self) -> bool:
        """Everything denied, nothing allowed."""
        return not self.allow and ALL_TRAFFIC in self.deny


def egress_of(
    allow_out: Iterable[str] | None, deny_out: Iterable[str] | None, internet: bool | None
) -> Egress:
    """What E2B's ``allowOut``, ``denyOut`` and ``allow_internet_access`` ask for.

    :raises InvalidInput: not an address, CIDR or host name, or more than forkpoint keeps.
    """
    allow_names = {_rule(text, "allowOut") for text in allow_out or ()}
    deny_names = {_rule(text, "denyOut") for text in deny_out or ()}
    allow = [ipaddress.ip_network(r) for r in allow_names if not is_host_name(r)]
    deny = [ipaddress.ip_network(r) for r in deny_names if not is_host_name(r)]
    allow_names = {r for r in allow_names if is_host_name(r)}
    deny_names = {r for r in deny_names if is_host_name(r)} - allow_names
    if internet is False:  # E2B: the same as denyOut 0.0.0.0/0
        deny.append(ipaddress.ip_network(ALL_TRAFFIC))
    if ipaddress.ip_network(ALL_TRAFFIC) in deny:
        deny.append(ipaddress.ip_network(_ALL_V6))
    kept = [
        net for net in deny
        if not any(net.version == a.version and net.subnet_of(a) for a in allow)  # type: ignore[arg-type]
    ]  # fmt: skip
    for field, nets, names in (("allowOut", allow, allow_names), ("denyOut", kept, deny_names)):
        if len(set(nets)) + len(names) > MAX_EGRESS_RULES:
            raise InvalidInput(f"{field}: at most {MAX_EGRESS_RULES} entries")
    policy = EgressPolicy.of([*map(str, allow), *allow_names], [*map(str, kept), *deny_names])
    return Egress(policy.allow, policy.deny)


def host_mask(mask: str | None) -> str | None:
    """``maskRequestHost`` checked: a host name with an optional port, ``${PORT}`` allowed.

    :raises InvalidInput: anything else (a header value must not carry more than a host).
    """
    if mask is None:
        return None
    if len(mask) > 255 or not _HOST_MASK.match(mask):
        raise InvalidInput(
            f"maskRequestHost must be a host name with an optional port (${{PORT}} for "
            f"the requested one), not {mask!r}"
        )
    return mask


def refuse_rules(rules: object) -> None:
    """E2B's per-host header transforms (``network.rules``) are not carried out here.

    :raises InvalidInput: some are given.
    """
    if rules:
        raise InvalidInput(
            "network.rules (header transforms on outbound requests) are not supported by "
            "forkpoint's gateway"
        )


def _rule(text: str, field: str) -> str:
    try:
        return parse_rule(text)
    except InvalidInput:
        raise InvalidInput(f"{field}: {text!r} is not an IP address, CIDR or host name") from None
