"""Where a guest may connect: the default egress policy, a session's adjustments, and the
address ranges they resolve to.

By default a guest reaches the internet but not the network around the host: link-local
(incl. cloud metadata services), private and carrier-grade NAT ranges, multicast, and the
host's own addresses (those are matched by the kernel, :mod:`forkpoint.vm.nftables`). A
session's ``allow`` and ``deny`` CIDRs are layered on top: *any* of the session's own CIDRs
beats the defaults (so ``allow 10.1.2.0/24`` opens that part of 10/8, and ``deny 0.0.0.0/0``
with a few ``allow``\\ s is an allow-list); among the session's own, the most specific wins,
and a tie goes to deny.

An entry may also be a host name (``pypi.org``; ``*.pythonhosted.org``: every name under it,
at any depth, not the name itself — E2B's rule). Names cannot be judged by address: a
guest's plain-HTTP (port 80) and TLS (port 443) connections then go through the session's
egress proxy (:mod:`forkpoint.vm.egress_proxy`), which reads the name the guest asked for
(the ``Host`` header, the TLS SNI) at each connection. A named host is allowed or denied
whatever its address (an allowed name beats a denied one, as an allowed CIDR beats a denied
one); a connection whose name no entry names is judged by its address, as the kernel judges
every other connection.

``headers`` are the operator's credentials for named hosts: the proxy sets them on the
guest's plain-HTTP requests to a matching host (the exact name first, else the longest
matching ``*.`` suffix; one rule set, never merged — E2B's rule). They live on the host
only: the guest never sees them, and :meth:`EgressPolicy.shown` leaves their values out.
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
    "HEADER_NAME_REGEX",
    "HOST_NAME_REGEX",
    "MAX_HEADERS_PER_HOST",
    "MAX_HEADER_HOSTS",
    "MAX_HEADER_VALUE",
    "is_host_name",
    "parse_cidr",
    "parse_headers",
    "parse_rule",
]

Headers = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # ((host, ((name, value), ...)), ...)

MAX_HEADER_HOSTS = 64
MAX_HEADERS_PER_HOST = 16
MAX_HEADER_VALUE = 8192
#: An HTTP field name (RFC 9110's token), as the request schema states it too.
HEADER_NAME_REGEX = r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}"
_HEADER_NAME = re.compile(HEADER_NAME_REGEX)

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
HOST_NAME_REGEX = rf"(\*\.)?({_LABEL}\.)*[a-z]([a-z0-9-]{{0,61}}[a-z0-9])?"
_HOST_NAME = re.compile(HOST_NAME_REGEX)


def is_host_name(text: str) -> bool:
    """Whether ``text`` is a host-name rule (``pypi.org``, ``*.example.com``)."""
    return len(text) <= 253 and _HOST_NAME.fullmatch(text) is not None  # "a.org\n" is not


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


def parse_headers(headers: Mapping[str, Mapping[str, str]]) -> Headers:
    """``{host: {name: value}}`` checked and normalised (hosts lower-case, sorted).

    :raises InvalidInput: a host that is not a host name, a header name that is not an HTTP
        field name, a value with a line break, or more than forkpoint keeps.
    """
    if len(headers) > MAX_HEADER_HOSTS:
        raise InvalidInput(f"headers: at most {MAX_HEADER_HOSTS} hosts")
    rules: dict[str, tuple[tuple[str, str], ...]] = {}
    for host, fields in headers.items():
        name = host.strip().lower().rstrip(".")
        if not is_host_name(name):
            raise InvalidInput(f"headers: {host!r} is not a host name")
        if not fields or len(fields) > MAX_HEADERS_PER_HOST:
            raise InvalidInput(f"headers for {name}: 1 to {MAX_HEADERS_PER_HOST} headers")
        # Surrounding whitespace means nothing in HTTP (RFC 9110's OWS): dropped, not refused.
        cleaned = {field.strip(): value.strip() for field, value in fields.items()}
        for field, value in cleaned.items():
            if not _HEADER_NAME.fullmatch(field):
                raise InvalidInput(f"headers for {name}: {field!r} is not a header name")
            if len(value) > MAX_HEADER_VALUE or any(c in value for c in "\r\n\0"):
                raise InvalidInput(
                    f"headers for {name}: the value of {field} must be one line of at most "
                    f"{MAX_HEADER_VALUE} characters"
                )
        rules[name] = tuple(sorted(cleaned.items()))
    return tuple(sorted(rules.items()))


@dataclass(frozen=True)
class EgressPolicy:
    """A session's adjustments to :data:`DEFAULT_DENY`: normalised CIDRs and host names,
    sorted (CIDRs first), and headers to set on requests to named hosts."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    headers: Headers = ()

    @classmethod
    def of(
        cls,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        headers: Mapping[str, Mapping[str, str]] | None = None,
    ) -> EgressPolicy:
        """:raises InvalidInput: an entry is neither a CIDR nor a host name; bad headers."""
        return cls(_normalised(allow), _normalised(deny), parse_headers(headers or {}))

    @property
    def needs_proxy(self) -> bool:
        """Whether some entry is a host name, or headers are set (connections then pass the
        egress proxy)."""
        return bool(self.headers) or any(is_host_name(r) for r in (*self.allow, *self.deny))

    def headers_for(self, name: str) -> dict[str, str]:
        """The headers for requests to ``name``: its exact rule, else the longest ``*.``
        rule matching it; ``{}``: none."""
        name = name.lower().rstrip(".")
        matching = [(host, fields) for host, fields in self.headers if _names(host, name)]
        if not matching:
            return {}
        best = max(matching, key=lambda rule: (not rule[0].startswith("*."), len(rule[0])))
        return dict(best[1])

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
        """From the store's ``{"allow": [...], "deny": [...], "headers": {host: {name:
        value}}}`` (``{}``: the default)."""
        return cls.of(data.get("allow", ()), data.get("deny", ()), data.get("headers"))

    def to_json(self) -> dict[str, Any]:
        """What the store keeps (header values included: never show this to a client)."""
        data: dict[str, Any] = {"allow": list(self.allow), "deny": list(self.deny)}
        if self.headers:
            data["headers"] = {host: dict(fields) for host, fields in self.headers}
        return data

    def shown(self) -> dict[str, list[str]]:
        """What a client sees: the entries, and ``host: header name`` for each header set
        (never a value)."""
        data = {"allow": list(self.allow), "deny": list(self.deny)}
        if self.headers:
            data["headers"] = [f"{host}: {f}" for host, fields in self.headers for f, _ in fields]
        return data

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
        return name.endswith(rule[1:])  # any depth under it, not the name itself
    return name == rule


def _normalised(rules: Iterable[str]) -> tuple[str, ...]:
    if isinstance(rules, str):  # one entry, not its characters
        rules = [rules]
    parsed = {parse_rule(r) for r in rules}
    names = sorted(r for r in parsed if is_host_name(r))
    nets = [parse_cidr(r) for r in parsed if not is_host_name(r)]
    nets.sort(key=lambda n: (n.version, n))
    return (*(str(n) for n in nets), *names)
