"""Two network namespaces joined by a veth pair, for the egress tests: ``guestside`` plays
the host (forkpoint, its rules, passt or the egress proxy), ``world`` the network around
it. Files under ``/etc/netns/<guestside>/`` (``resolv.conf``, ``hosts``) replace the
host's for whatever runs there under ``ip netns exec``. No address outside the two
namespaces is ever touched.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NetPair", "in_ns", "sh"]


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120)


def in_ns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


@dataclass(frozen=True)
class NetPair:
    guestside: str
    world: str
    host_address: str  # guestside's, in a /24 with world_address, its default route
    world_address: str

    @property
    def etc(self) -> Path:
        """Where files replacing guestside's ``/etc/<name>`` go."""
        return Path("/etc/netns") / self.guestside

    def make(self, extra: Iterable[str] = ()) -> None:
        """Both namespaces, the link, and ``extra`` addresses (/32) on the world's side."""
        self.remove()  # a run killed before its clean-up
        g, w = self.guestside, self.world
        for ns in (g, w):
            sh("ip", "netns", "add", ns)
            sh(*in_ns(ns, "ip", "link", "set", "lo", "up"))
        glink, wlink = f"{g[:11]}0", f"{w[:11]}0"
        sh("ip", "link", "add", glink, "netns", g, "type", "veth", "peer", wlink, "netns", w)
        sh(*in_ns(g, "ip", "addr", "add", f"{self.host_address}/24", "dev", glink))
        sh(*in_ns(g, "ip", "link", "set", glink, "up"))
        sh(*in_ns(g, "ip", "route", "add", "default", "via", self.world_address))
        sh(*in_ns(w, "ip", "addr", "add", f"{self.world_address}/24", "dev", wlink))
        for address in extra:
            self.add_world_address(address)
        sh(*in_ns(w, "ip", "link", "set", wlink, "up"))
        self.etc.mkdir(parents=True, exist_ok=True)

    def add_world_address(self, address: str) -> None:
        sh(*in_ns(self.world, "ip", "addr", "add", f"{address}/32", "dev", f"{self.world[:11]}0"))

    def remove(self) -> None:
        for ns in (self.guestside, self.world):
            sh("ip", "netns", "del", ns, check=False)  # the veth pair goes with them
        shutil.rmtree(self.etc, ignore_errors=True)
