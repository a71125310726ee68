"""Where a guest may connect: the default egress policy, a session's adjustments, and the
address ranges they resolve to.

By default a guest reaches the internet but not the network around the host: link-local
(incl. cloud metadata services), private and carrier-grade NAT ranges, multicast, and the
host's own addresses (those are matched by the kernel, :mod:`.nftables`). A session's
``allow`` and ``deny`` CIDRs are layered on top: *any* of the session's own CIDRs beats the
defaults (so ``allow 10.1.2.0/24`` opens that part of 10/8, and ``deny 0.0.0.0/0`` with a
few ``allow``\\ s is an allow-list); among the session's own, the most specific wins, and a
tie goes to deny.

An entry may also be a host name (``pypi.org``, ``*.pythonhosted.org``: the name and every
name under it). Names cannot be judged by address: a guest's plain-HTTP (port 80) and TLS
(port 443) connections then go through the session's egress proxy (:mod:`.egress_proxy`),
which reads the name the guest asked for (the ``Host`` header, the TLS SNI) at each
connection. A named host is allowed or denied whatever its address (an allowed name beats
a denied one, as an allowed CIDR beats a denied one); a connection whose name no entry
names is judged by its address, as the kernel judges every other connection.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from forkpoint.errors import InvalidInput

__all__ = [
    "DEFAULT_DENY",
    "EgressPolicy",
    "Span",
    "Verdict",
    "is_host_name",
    "parse_cidr",
    "parse_rule",
]

Net = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_DENY: tuple[Net, ...] = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "0.0.0.0/8",  # "this network": 0.0.0.0 reaches the host itself
        "10.0.0.0/8",
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, incl. 169.254.169.254 (metadata services)
        "172.16.0.0/12",
        "192.168.0.0/16",
        "224.0.0.0/4",  # multicast: services on the host's LAN (mDNS, SSDP)
        "255.255.255.255/32",
        "::/128",
        "::1/128",
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "ff00::/8",  # multicast
    )
)


class Verdict(StrEnum):
    ACCEPT = "accept"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Span:
    """Addresses ``first``..``last`` (inclusive) of one IP version, and their verdict."""

    first: ipaddress.IPv4Address | ipaddress.IPv6Address
    last: ipaddress.IPv4Address | ipaddress.IPv6Address
    verdict: Verdict

    def nft(self) -> str:
        """The element as nftables writes it: ``10.0.0.0-10.255.255.255 : goto refuse``."""
        key = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{key} : {'accept' if self.verdict == Verdict.ACCEPT else 'goto refuse'}"


def parse_cidr(text: str) -> Net:
    """``text`` as a network (a bare address is a /32 or /128).

    :raises InvalidInput: not a CIDR, or host bits set (``10.0.0.1/8``).
    """
    try:
        return ipaddress.ip_network(text.strip())
    except ValueError as error:
        raise InvalidInput(f"invalid CIDR {text!r}: {error}") from None


# A DNS name (labels of letters, digits and hyphens), optionally ``*.`` for every name under
# it; its last label starts with a letter, so no address is ever taken for a name.
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"^(\*\.)?({_LABEL}\.)*[a-z]([a-z0-9-]{{0,61}}[a-z0-9])?$")


def is_host_name(text: str) -> bool:
    """Whether ``text`` is a host-name rule (``pypi.org``, ``*.example.com``)."""
    return len(text) <= 253 and _HOST_NAME.match(text) is not None


def parse_rule(text: str) -> str:
    """An egress entry normalised: a CIDR (host bits cleared) or a lower-case host name.

    :raises InvalidInput: neither.
    """
    cleaned = text.strip().lower().rstrip(".")
    if is_host_name(cleaned):
        return cleaned
    try:
        return str(ipaddress.ip_network(cleaned, strict=False))
    except ValueError:
        raise InvalidInput(
            f"invalid egress rule {text!r}: not a CIDR, an address or a host name"
        ) from None


@dataclass(frozen=True)
class EgressPolicy:
    """A session's adjustments to :data:`DEFAULT_DENY`: normalised CIDRs and host names,
    sorted (CIDRs first)."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @classmethod
    def of(cls, allow: Iterable[str] = (), deny: Iterable[str] = ()) -> EgressPolicy:
        """:raises InvalidInput: an entry is neither a CIDR nor a host name."""
        return cls(_normalised(allow), _normalised(deny))

    @property
    def names_hosts(self) -> bool:
        """Whether some entry is a host name (connections then pass the egress proxy)."""
        return any(is_host_name(rule) for rule in (*self.allow, *self.deny))

    def host_verdict(self, name: str) -> Verdict | None:
        """What the host-name entries say of ``name`` (allow beats deny); ``None``: none
        names it, its address decides."""
        name = name.lower().rstrip(".")
        for rules, verdict in ((self.allow, Verdict.ACCEPT), (self.deny, Verdict.REFUSE)):
            if any(_names(rule, name) for rule in rules if is_host_name(rule)):
                return verdict
        return None

    def address_verdict(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Verdict:
        """What the CIDR entries and the defaults say of ``address`` (the kernel's rules;
        the host's own addresses, which only the kernel knows, are not judged here)."""
        for span in self.spans(address.version):
            if int(span.first) <= int(address) <= int(span.last):
                return span.verdict
        return Verdict.ACCEPT

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EgressPolicy:
        """From the store's ``{"allow": [...], "deny": [...]}`` (``{}``: the default)."""
        return cls.of(data.get("allow", ()), data.get("deny", ()))

    def to_json(self) -> dict[str, list[str]]:
        return {"allow": list(self.allow), "deny": list(self.deny)}

    def spans(self, version: int) -> list[Span]:
        """The address space of IP ``version`` cut into spans with a verdict; addresses in
        no span match no CIDR (the kernel then refuses only the host's own)."""
        own = [(parse_cidr(c), Verdict.ACCEPT) for c in self.allow if not is_host_name(c)]
        own += [(parse_cidr(c), Verdict.REFUSE) for c in self.deny if not is_host_name(c)]
        own = [(net, v) for net, v in own if net.version == version]
        defaults = [net for net in DEFAULT_DENY if net.version == version]
        cuts = sorted(
            {int(n.network_address) for n, _ in own}
            | {int(n.broadcast_address) + 1 for n, _ in own}
            | {int(n.network_address) for n in defaults}
            | {int(n.broadcast_address) + 1 for n in defaults}
        )
        spans: list[tuple[int, int, Verdict]] = []
        for start, end in zip(cuts, cuts[1:], strict=False):
            verdict = _verdict_at(start, own, defaults)
            if verdict is None:
                continue
            if spans and spans[-1][1] == start - 1 and spans[-1][2] == verdict:
                spans[-1] = (spans[-1][0], end - 1, verdict)  # merge with the one before
            else:
                spans.append((start, end - 1, verdict))
        address = ipaddress.IPv4Address if version == 4 else ipaddress.IPv6Address
        return [Span(address(a), address(b), v) for a, b, v in spans]


def _verdict_at(
    address: int, own: list[tuple[Net, Verdict]], defaults: list[Net]
) -> Verdict | None:
    """The session's most specific CIDR holding ``address`` decides (deny on a tie), else
    the defaults."""
    best: tuple[int, bool] | None = None  # (prefix length, is deny): max wins
    for net, verdict in own:
        if int(net.network_address) <= address <= int(net.broadcast_address):
            key = (net.prefixlen, verdict == Verdict.REFUSE)
            best = key if best is None else max(best, key)
    if best is not None:
        return Verdict.REFUSE if best[1] else Verdict.ACCEPT
    if any(int(n.network_address) <= address <= int(n.broadcast_address) for n in defaults):
        return Verdict.REFUSE
    return None


def _names(rule: str, name: str) -> bool:
    if rule.startswith("*."):
        return name == rule[2:] or name.endswith(rule[1:])
    return name == rule


def _normalised(rules: Iterable[str]) -> tuple[str, ...]:
    if isinstance(rules, str):  # one entry, not its characters
        rules = [rules]
    parsed = {parse_rule(r) for r in rules}
    names = sorted(r for r in parsed if is_host_name(r))
    nets = [parse_cidr(r) for r in parsed if not is_host_name(r)]
    nets.sort(key=lambda n: (n.version, n))
    return (*(str(n) for n in nets), *names)
