"""E2B's network options on forkpoint's terms: ``allowOut``/``denyOut`` and
``allow_internet_access`` as a session's egress adjustments, ``maskRequestHost`` checked.

E2B lets an allowed destination beat any denied one; forkpoint's policy lets the most
specific CIDR win, a tie going to deny (:mod:`forkpoint.egress`). Two CIDRs are either
nested or disjoint, so the two agree once every denied CIDR lying inside an allowed one is
dropped: what is left of the denies is either disjoint from the allows or wider than them.
Host names (``pypi.org``, ``*.example.com``) are carried as they are: forkpoint's egress
proxy lets an allowed name beat a denied one, as E2B does.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from forkpoint.egress import EgressPolicy, is_host_name, parse_headers, parse_rule
from forkpoint.errors import InvalidInput
from forkpoint.models import MAX_EGRESS_RULES

__all__ = ["ALL_TRAFFIC", "Egress", "egress_of", "headers_of", "host_mask"]

#: E2B's ``ALL_TRAFFIC`` (IPv4 only); denying it denies IPv6 too, as E2B guests have none.
ALL_TRAFFIC = "0.0.0.0/0"
_ALL_V6 = "::/0"
# A host name with an optional port; ``${PORT}`` stands for the port the request is for.
_HOST_MASK = re.compile(r"^([A-Za-z0-9.-]|\$\{PORT\})+(:([0-9]{1,5}|\$\{PORT\}))?$")


@dataclass(frozen=True)
class Egress:
    """A session's egress adjustments, in forkpoint's terms; ``headers``: its injected
    headers (``None``: an update that leaves them as they are)."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    headers: dict[str, dict[str, str]] | None = field(default=None, compare=False)

    @property
    def policy(self) -> EgressPolicy:
        return EgressPolicy.of(self.allow, self.deny, self.headers)

    @property
    def no_internet(self) -> bool:
        """Everything denied, nothing allowed."""
        return not self.allow and ALL_TRAFFIC in self.deny


def egress_of(
    allow_out: Iterable[str] | None,
    deny_out: Iterable[str] | None,
    internet: bool | None,
    rules: object = None,
) -> Egress:
    """What E2B's ``allowOut``, ``denyOut``, ``allow_internet_access`` and ``rules`` ask for.

    :raises InvalidInput: not an address, CIDR or host name, or more than forkpoint keeps.
    """
    allow_rules = {_rule(text, "allowOut") for text in allow_out or ()}
    deny_rules = {_rule(text, "denyOut") for text in deny_out or ()}
    allow = [ipaddress.ip_network(r) for r in allow_rules if not is_host_name(r)]
    deny = [ipaddress.ip_network(r) for r in deny_rules if not is_host_name(r)]
    allow_names = {r for r in allow_rules if is_host_name(r)}
    deny_names = {r for r in deny_rules if is_host_name(r)} - allow_names
    if internet is False:  # E2B: the same as denyOut 0.0.0.0/0
        deny.append(ipaddress.ip_network(ALL_TRAFFIC))
    if ipaddress.ip_network(ALL_TRAFFIC) in deny:
        deny.append(ipaddress.ip_network(_ALL_V6))
    kept = [
        net for net in deny
        if not any(net.version == a.version and net.subnet_of(a) for a in allow)  # type: ignore[arg-type]
    ]  # fmt: skip
    for key, nets, names in (("allowOut", allow, allow_names), ("denyOut", kept, deny_names)):
        if len(set(nets)) + len(names) > MAX_EGRESS_RULES:
            raise InvalidInput(f"{key}: at most {MAX_EGRESS_RULES} entries")
    policy = EgressPolicy.of([*map(str, allow), *allow_names], [*map(str, kept), *deny_names])
    return Egress(policy.allow, policy.deny, headers_of(rules))


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


def headers_of(rules: object) -> dict[str, dict[str, str]] | None:
    """E2B's ``network.rules`` (``{host: [{"transform": {"headers": {name: value}}}, ...]}``)
    as forkpoint's injected headers, a host's transforms applied in order; ``None``: not
    given.

    :raises InvalidInput: not that shape, a transform other than headers, or headers
        forkpoint refuses (:func:`~forkpoint.egress.parse_headers`).
    """
    if rules is None:
        return None
    shape = InvalidInput(
        'network.rules must be {host: [{"transform": {"headers": {name: value}}}]} '
        "(header transforms are the only kind forkpoint carries out)"
    )
    if not isinstance(rules, dict):
        raise shape
    headers: dict[str, dict[str, str]] = {}
    for host, transforms in rules.items():
        if not isinstance(transforms, list):
            raise shape
        fields = headers.setdefault(str(host), {})
        for rule in transforms:
            if not isinstance(rule, dict) or set(rule) - {"transform"}:
                raise shape
            transform = rule.get("transform")
            if transform is None:
                continue
            if not isinstance(transform, dict) or set(transform) - {"headers"}:
                raise shape
            added = transform.get("headers")
            if not isinstance(added, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in added.items()
            ):
                raise shape
            fields.update(added)
    headers = {host: fields for host, fields in headers.items() if fields}
    parse_headers(headers)
    return headers


def _rule(text: str, key: str) -> str:
    try:
        return parse_rule(text)
    except InvalidInput:
        raise InvalidInput(f"{key}: {text!r} is not an IP address, CIDR or host name") from None
