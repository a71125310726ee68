"""The egress policy without a VM: CIDR checks, the spans a policy resolves to, the nftables
transactions that install and remove it, and the refusal to run unfiltered."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forkpoint.egress import EgressPolicy, Verdict
from forkpoint.errors import InternalError, InvalidInput
from forkpoint.requests import CreateSessionRequest, parse
from forkpoint.vm import nftables
from forkpoint.vm.nftables import install_script, policy_map, remove_script, resolvers

UIDS = range(1_900_000_001, 1_900_065_536)
DNS = [ipaddress.ip_address("127.0.0.53"), ipaddress.ip_address("fd00::53")]


def _is_root() -> bool:
    return os.geteuid() == 0


def verdict(policy: EgressPolicy, address: str) -> Verdict | None:
    """What the spans say about ``address`` (None: no span; the kernel checks host-local)."""
    ip = ipaddress.ip_address(address)
    for span in policy.spans(ip.version):
        if int(span.first) <= int(ip) <= int(span.last):
            return span.verdict
    return None


def test_default_policy_refuses_the_network_around_the_host() -> None:
    default = EgressPolicy()
    for blocked in (
        "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "100.64.0.1",
        "169.254.169.254", "127.0.0.1", "0.0.0.0", "224.0.0.251", "255.255.255.255",
        "::1", "fe80::1", "fd12::1", "ff02::1",
    ):  # fmt: skip
        assert verdict(default, blocked) == Verdict.REFUSE, blocked
    for public in ("8.8.8.8", "172.32.0.1", "198.51.100.2", "2001:db8::1"):
        assert verdict(default, public) is None, public


def test_allow_beats_the_defaults_and_the_most_specific_own_cidr_wins() -> None:
    policy = EgressPolicy.of(allow=["10.231.0.2/32", "10.0.0.0/8"], deny=["10.9.0.0/16"])
    assert verdict(policy, "10.231.0.2") == Verdict.ACCEPT
    assert verdict(policy, "10.1.1.1") == Verdict.ACCEPT  # allowed /8 beats the default /8
    assert verdict(policy, "10.9.1.1") == Verdict.REFUSE  # the more specific deny
    assert verdict(policy, "192.168.0.1") == Verdict.REFUSE  # defaults elsewhere untouched
    # an allow-list: deny everything, allow one range
    only = EgressPolicy.of(allow=["203.0.113.0/24"], deny=["0.0.0.0/0"])
    assert verdict(only, "203.0.113.9") == Verdict.ACCEPT
    assert verdict(only, "8.8.8.8") == Verdict.REFUSE
    assert verdict(only, "10.0.0.1") == Verdict.REFUSE
    # the same CIDR allowed and denied: deny
    assert verdict(EgressPolicy.of(allow=["1.2.3.0/24"], deny=["1.2.3.0/24"]), "1.2.3.4") == (
        Verdict.REFUSE
    )


def test_spans_do_not_overlap_and_adjacent_equal_spans_merge() -> None:
    policy = EgressPolicy.of(allow=["10.231.0.2"], deny=["198.51.100.0/24", "198.51.101.0/24"])
    spans = policy.spans(4)
    for before, after in zip(spans, spans[1:], strict=False):
        assert int(before.last) < int(after.first)
    texts = [s.nft() for s in spans]
    assert "10.0.0.0-10.231.0.1 : goto refuse" in texts
    assert "10.231.0.2 : accept" in texts
    assert "198.51.100.0-198.51.101.255 : goto refuse" in texts  # merged


def test_policy_normalises_and_rejects_bad_cidrs() -> None:
    policy = EgressPolicy.of(allow=["10.0.0.1", " 2001:db8::/32", "10.0.0.1/32"])
    assert policy.to_json() == {"allow": ["10.0.0.1/32", "2001:db8::/32"], "deny": []}
    assert EgressPolicy.from_json({}) == EgressPolicy()
    assert EgressPolicy.from_json(policy.to_json()) == policy
    assert EgressPolicy.of(deny=["10.0.0.1/8"]).deny == ("10.0.0.0/8",)  # host bits cleared
    for bad in ("10.0.0.0/33", "exa_mple.com", "-x.com", "*.*.com", "1.2.3.4.5", ""):
        with pytest.raises(InvalidInput, match="invalid egress rule"):
            EgressPolicy.of(deny=[bad])


def test_create_request_checks_cidrs_in_one_line() -> None:
    request = parse(CreateSessionRequest, allow_net=("10.0.0.1",), deny_net=("fd00::/8",))
    assert request.allow_net == ("10.0.0.1/32",) and request.deny_net == ("fd00::/8",)
    # Host bits are cleared: the schema's pattern (all the API fuzzer knows) cannot tell.
    lenient = parse(CreateSessionRequest, deny_net=("10.0.0.1/8",))
    assert lenient.deny_net == ("10.0.0.0/8",)
    with pytest.raises(InvalidInput) as caught:
        parse(CreateSessionRequest, deny_net=("10.0.0.0/33",))
    message = str(caught.value)
    assert "\n" not in message and "deny_net.0" in message
    with pytest.raises(InvalidInput, match="allow_net"):
        parse(CreateSessionRequest, allow_net=tuple(f"10.0.0.{i}" for i in range(65)))


def test_install_script_shape() -> None:
    policy = EgressPolicy.of(allow=["10.231.0.2/32"], deny=["198.51.100.0/24"])
    script = install_script(1_900_000_007, policy, DNS, UIDS)
    lines = script.splitlines()
    t = "inet forkpoint"
    # the skeleton: hook, verdict map by socket owner, fail closed for the session range
    assert f"add rule {t} output meta skuid vmap @sessions" in lines
    # only connection attempts are judged: the forwards' replies pass
    assert lines.index(f"add rule {t} output tcp flags & (syn | ack) != syn accept") < (
        lines.index(f"add rule {t} output meta skuid vmap @sessions")
    )
    assert f"add rule {t} output meta skuid 1900000001-1900065535 goto refuse" in lines
    assert f"add rule {t} refuse meta l4proto tcp reject with tcp reset" in lines
    # the base chain is rewritten (flushed first) in the same transaction: never doubled
    assert lines.index(f"flush chain {t} output") < lines.index(
        f"add rule {t} output meta skuid vmap @sessions"
    )
    assert f"add element {t} resolvers4 {{ 127.0.0.53 }}" in lines
    assert f"add element {t} resolvers6 {{ fd00::53 }}" in lines
    chain = [line for line in lines if line.startswith(f"add rule {t} u1900000007 ")]
    rules = [line.removeprefix(f"add rule {t} u1900000007 ") for line in chain]
    assert rules[0].startswith("ip daddr @resolvers4 ") and rules[0].endswith("dport 53 accept")
    map4, map6 = policy_map(policy, 4), policy_map(policy, 6)
    assert rules[2:4] == [f"ip daddr vmap @{map4}", f"ip6 daddr vmap @{map6}"]
    assert rules[-1] == "fib daddr type local goto refuse"
    # the policy's spans, in a map named by the policy (sessions with the same one share it)
    elements = next(line for line in lines if line.startswith(f"add element {t} {map4} "))
    assert "10.231.0.2 : accept" in elements
    assert "198.51.100.0-198.51.100.255 : goto refuse" in elements
    assert lines.index(f"flush map {t} {map4}") < lines.index(elements)
    assert policy_map(EgressPolicy.of(deny=["198.51.100.0/24"], allow=["10.231.0.2"]), 4) == map4
    assert policy_map(EgressPolicy(), 4) != map4
    assert f"add element {t} sessions {{ 1900000007 : goto u1900000007 }}" in lines
    # no names: the session's NAT chain exists, empty (nothing redirected to a proxy)
    assert lines[-3:] == [
        f"add chain {t} n1900000007",
        f"flush chain {t} n1900000007",
        f"add element {t} nat_sessions {{ 1900000007 : goto n1900000007 }}",
    ]


def test_remove_script_touches_only_its_session() -> None:
    lines = remove_script(1_900_000_007).splitlines()
    assert "delete element inet forkpoint sessions { 1900000007 }" in lines
    assert "delete chain inet forkpoint u1900000007" in lines
    assert not [line for line in lines if " output" in line or "resolvers" in line]


def test_resolvers_from_resolv_conf(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# comment\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\nnameserver bogus\n"
        "search example.com\noptions edns0\n"
    )
    assert [str(a) for a in resolvers(conf)] == ["127.0.0.53", "fe80::1"]
    assert resolvers(tmp_path / "missing") == []


def test_without_nft_a_networked_vm_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(InternalError, match=r"nft not found.*make setup") as caught:
        nftables.install_rules(1_900_000_007, EgressPolicy(), UIDS)
    assert "\n" not in str(caught.value)


def test_a_kernel_refusing_the_rules_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
        error = "Error: Could not process rule: Operation not supported\nadd table inet x\n"
        return subprocess.CompletedProcess(args, 1, "", error)

    monkeypatch.setattr(nftables, "_run", refused)
    with pytest.raises(InternalError) as caught:
        nftables.install_rules(1_900_000_007, EgressPolicy(), UIDS)
    message = str(caught.value)
    assert "Operation not supported" in message and "apt install nftables" in message
    assert "\n" not in message


@pytest.mark.skipif(
    shutil.which("nft") is None or shutil.which("ip") is None or not _is_root(),
    reason="needs root, nft and ip",
)
def test_the_kernel_takes_the_rules_idempotently_in_a_namespace_of_our_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installs, re-installs and removes in a network namespace the test makes (never the
    host's ruleset): a re-install does not double the rules, a removal leaves the others."""
    ns = "fpt-nftunit"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "add", ns], check=True)

    def in_ns(args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", ns, "nft", *args], input=stdin, capture_output=True,
            text=True, check=False,
        )  # fmt: skip

    def nft(*args: str) -> str:
        done = in_ns(list(args), "")
        assert done.returncode == 0, done.stderr
        return done.stdout

    monkeypatch.setattr(nftables, "_run", in_ns)

    try:
        policy = EgressPolicy.of(allow=["10.231.0.2"], deny=["198.51.100.0/24"])
        for _ in range(2):
            nftables.install_rules(1_900_000_007, policy, UIDS)
        nftables.install_rules(1_900_000_008, policy, UIDS)  # shares the policy's maps
        nftables.install_rules(1_900_000_009, EgressPolicy(), UIDS)
        table = nft("list", "table", "inet", "forkpoint")
        assert table.count("meta skuid vmap @sessions") == 1  # never doubled
        assert table.count("fib daddr type local goto refuse") == 3  # one per session chain
        assert table.count(f"map {policy_map(policy, 4)} ") == 1
        assert "1900000007 : goto u1900000007" in table
        nftables.remove_rules(1_900_000_007, policy)  # its maps stay: 8 uses them
        table = nft("list", "table", "inet", "forkpoint")
        assert "u1900000007" not in table and "1900000008 : goto u1900000008" in table
        assert f"map {policy_map(policy, 4)} " in table
        nftables.remove_rules(1_900_000_008, policy)  # the last user: its maps go
        nftables.remove_rules(1_900_000_008, policy)  # gone already: fine
        table = nft("list", "table", "inet", "forkpoint")
        assert policy_map(policy, 4) not in table and "u1900000009" in table
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


@pytest.mark.parametrize(
    "args",
    [("--allow-net", "10.0.0.0/33"), ("--deny-net", "not_a_network")],
)
def test_cli_bad_cidr_is_one_line_exit_2_and_creates_nothing(args: tuple[str, ...]) -> None:
    def forkpoint(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "forkpoint.cli.app", *argv],
            capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=120,
        )  # fmt: skip

    before = forkpoint("ls", "--json").stdout
    for command in (["create"], ["egress", "s-0000000000"]):  # checked before the session
        done = forkpoint(*command, *args)
        assert done.returncode == 2, (done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "CIDR" in lines[0] and args[1] in lines[0], done.stderr
    assert forkpoint("ls", "--json").stdout == before


def test_without_root_nothing_is_installed_and_it_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from forkpoint.runtime.sessions import egress
    from forkpoint.vm.jail import Jail

    def never(*args: object) -> None:
        raise AssertionError("nft must not run without root")

    monkeypatch.setattr(egress, "jails_processes", lambda: False)
    monkeypatch.setattr(egress, "install_rules", never)
    egress._warn_unfiltered.cache_clear()
    with caplog.at_level("WARNING", logger="forkpoint.egress"):
        for _ in range(3):
            egress.install_filter(Jail(1_900_000_007), EgressPolicy())
    warnings = [r.getMessage() for r in caplog.records if r.name == "forkpoint.egress"]
    assert len(warnings) == 1 and "not enforced" in warnings[0] and "root" in warnings[0]
    egress._warn_unfiltered.cache_clear()


def test_e2b_rules_let_an_allow_beat_any_deny() -> None:
    from forkpoint.e2b.network import egress_of

    # a deny inside an allow is dropped; a wider one stays (the allow is more specific)
    rules = egress_of(["8.8.0.0/16", "1.1.1.1"], ["0.0.0.0/0", "8.8.8.8", "1.1.1.1"], None)
    assert rules.allow == ("1.1.1.1/32", "8.8.0.0/16")
    assert rules.deny == ("0.0.0.0/0", "::/0")  # all traffic means IPv6 too
    policy = EgressPolicy.of(rules.allow, rules.deny)
    verdicts = {s.first.exploded: s.verdict for s in policy.spans(4)}
    assert verdicts["8.8.0.0"] == verdicts["1.1.1.1"] == Verdict.ACCEPT
    assert verdicts["0.0.0.0"] == Verdict.REFUSE
    assert egress_of(None, None, False).no_internet
    assert not egress_of(["10.0.0.1"], None, False).no_internet
    assert egress_of(None, ["10.1.2.3/8"], True).deny == ("10.0.0.0/8",)
    named = egress_of(["PyPI.org"], ["0.0.0.0/0", "pypi.org", "evil.org"], None)
    assert named.allow == ("pypi.org",)  # an allowed name beats the same name denied
    assert named.deny == ("0.0.0.0/0", "::/0", "evil.org")
    for bad in (["py_pi.org"], ["10.0.0.0/33"]):
        with pytest.raises(InvalidInput, match="not an IP address, CIDR or host name"):
            egress_of(bad, None, None)
    with pytest.raises(InvalidInput, match="at most"):
        egress_of([f"10.0.{i}.0/24" for i in range(65)], None, None)


def test_e2b_host_mask_is_a_host_and_nothing_more() -> None:
    from forkpoint.e2b.network import host_mask

    assert host_mask("custom-host.example.com:${PORT}") == "custom-host.example.com:${PORT}"
    assert host_mask("${PORT}-app.internal") == "${PORT}-app.internal"
    for bad in ("a.example\r\nX-Evil: 1", "a b", "host:port", ""):
        with pytest.raises(InvalidInput, match="maskRequestHost"):
            host_mask(bad)
