"""Egress rules naming hosts: parsing, the names an HTTP request or a TLS ClientHello carries,
and the egress proxy with the kernel's redirect, without a VM.

The proxy test builds two network namespaces joined by a veth pair: ``fpt-names-g`` is "the
host" (forkpoint's rules, the proxy, connections made as a session uid, as passt makes
them), ``fpt-names-w`` the network around it, whose listeners log who reached them. Host
names resolve through ``/etc/netns/fpt-names-g/hosts`` (put in place of ``/etc/hosts`` by
``ip netns exec``). No address outside these namespaces is ever touched.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkpoint.egress import EgressPolicy, Verdict
from forkpoint.errors import InvalidInput
from forkpoint.requests import CreateSessionRequest, parse
from forkpoint.vm.egress_proxies import stop_proxy
from forkpoint.vm.nftables import install_script, remove_script
from forkpoint.vm.sniff import host_of_http, server_name, with_headers
from netpair import NetPair
from netpair import in_ns as _in

UIDS = range(1_900_000_001, 1_900_065_536)


def client_hello(name: str | None) -> bytes:
    """The ClientHello Python's TLS client sends first (SNI ``name``)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def test_names_and_addresses_in_one_policy() -> None:
    policy = EgressPolicy.of(
        allow=["PyPI.org.", "10.1.0.0/16", "*.pythonhosted.org"], deny=["0.0.0.0/0", "evil.org"]
    )
    assert policy.allow == ("10.1.0.0/16", "*.pythonhosted.org", "pypi.org")
    assert policy.needs_proxy and not EgressPolicy.of(allow=["10.0.0.0/8"]).needs_proxy
    assert EgressPolicy.from_json(policy.to_json()) == policy
    assert policy.host_verdict("pypi.org") == Verdict.ACCEPT
    assert policy.host_verdict("files.pythonhosted.org") == Verdict.ACCEPT
    assert policy.host_verdict("a.b.pythonhosted.org") == Verdict.ACCEPT  # any depth
    assert policy.host_verdict("pythonhosted.org") is None  # not the name itself (E2B's rule)
    assert policy.host_verdict("notpythonhosted.org") is None
    assert policy.host_verdict("evil.org") == Verdict.REFUSE
    assert policy.host_verdict("sub.pypi.org") is None  # no wildcard: that name only
    both = EgressPolicy.of(allow=["x.org"], deny=["x.org"])
    assert both.host_verdict("x.org") == Verdict.ACCEPT  # allow beats deny, as for CIDRs
    import ipaddress

    assert policy.address_verdict(ipaddress.ip_address("10.1.2.3")) == Verdict.ACCEPT
    assert policy.address_verdict(ipaddress.ip_address("8.8.8.8")) == Verdict.REFUSE
    assert EgressPolicy().address_verdict(ipaddress.ip_address("8.8.8.8")) == Verdict.ACCEPT
    # only CIDRs become the kernel's spans
    assert [s.nft() for s in policy.spans(4)][0].startswith("0.0.0.0-")


def test_requests_take_names_and_refuse_what_is_neither_in_one_line() -> None:
    request = parse(CreateSessionRequest, allow_net=("pypi.org", "10.0.0.1"))
    assert request.allow_net == ("pypi.org", "10.0.0.1/32")
    with pytest.raises(InvalidInput) as caught:
        parse(CreateSessionRequest, deny_net=("bad_name.org",))
    assert "\n" not in str(caught.value) and "not a CIDR, an address or a host name" in str(
        caught.value
    )


def test_injected_headers_are_checked_matched_like_e2b_and_never_shown() -> None:
    secret = "Bearer s3cret-token"
    policy = EgressPolicy.of(
        allow=["api.example.com"],
        headers={
            "API.example.com": {"Authorization": secret},
            "*.example.com": {"X-Wild": "1"},
            "*.eu.example.com": {"X-Region": "eu"},
        },
    )
    assert policy.needs_proxy and EgressPolicy.of(headers={"a.org": {"A": "b"}}).needs_proxy
    assert policy.headers_for("api.example.com") == {"Authorization": secret}  # exact first
    assert policy.headers_for("x.eu.example.com") == {"X-Region": "eu"}  # longest suffix
    assert policy.headers_for("x.example.com") == {"X-Wild": "1"}  # never merged
    assert policy.headers_for("example.com") == {} == policy.headers_for("other.org")
    assert EgressPolicy.from_json(policy.to_json()) == policy  # the store keeps the values
    spaced = EgressPolicy.of(headers={"a.org": {" X-Key ": " v \r\n"}})  # OWS: dropped
    assert spaced.headers_for("a.org") == {"X-Key": "v"}
    assert not EgressPolicy.of(allow=["a.org"]).host_verdict("a.org\n")
    shown = json.dumps(policy.shown())
    assert "s3cret" not in shown and "api.example.com: Authorization" in shown
    for bad, words in (
        ({"bad_host": {"A": "b"}}, "not a host name"),
        ({"a.org": {"Bad Name": "b"}}, "not a header name"),
        ({"a.org": {"Auth\norization": "b"}}, "not a header name"),
        ({"a.org": {"A": "b\r\nX-Evil: 1"}}, "one line"),
        ({"a.org": {}}, "1 to 16 headers"),
    ):
        with pytest.raises(InvalidInput, match=words):
            EgressPolicy.of(headers=bad)
    with pytest.raises(InvalidInput) as caught:
        parse(CreateSessionRequest, inject_headers={"a.org": {"A": "b\nc"}})
    assert "\n" not in str(caught.value) and "inject_headers" in str(caught.value)


def test_cli_and_e2b_spell_headers_their_own_way(tmp_path: Path) -> None:
    from forkpoint.cli.options import inject_headers_of
    from forkpoint.e2b.network import egress_of, headers_of

    (tmp_path / "token").write_text("Bearer from-a-file\n")
    assert inject_headers_of(
        ["api.example.com:Authorization=Bearer x=y", f"api.example.com:X-Key=@{tmp_path}/token"]
    ) == {"api.example.com": {"Authorization": "Bearer x=y", "X-Key": "Bearer from-a-file"}}
    for bad in ("no-colon", "host:no-equals", f"h.org:A=@{tmp_path}/missing"):
        with pytest.raises(InvalidInput, match="--inject-header"):
            inject_headers_of([bad])
    rules = {"api.example.com": [{"transform": {"headers": {"A": "1"}}},
                                 {"transform": {"headers": {"B": "2", "A": "3"}}}]}  # fmt: skip
    assert headers_of(rules) == {"api.example.com": {"A": "3", "B": "2"}}
    assert headers_of(None) is None  # an update without rules keeps the session's
    assert egress_of(None, None, None, rules).policy.headers_for("api.example.com") == {
        "A": "3", "B": "2"
    }  # fmt: skip
    malformed: list[object] = [
        {"a.org": {"transform": {}}}, {"a.org": [{"transform": {"body": "x"}}]},
        {"a.org": [{"transform": {"headers": {"A": 1}}}]}, ["a.org"],
    ]  # fmt: skip
    for bad_rules in malformed:
        with pytest.raises(InvalidInput, match="network.rules"):
            headers_of(bad_rules)


def test_the_name_a_connection_asks_for() -> None:
    assert server_name(client_hello("files.pythonhosted.org")) == "files.pythonhosted.org"
    assert server_name(client_hello(None)) is None
    hello = client_hello("pypi.org")
    for cut in range(0, len(hello), 7):  # never an exception on a partial or broken hello
        assert server_name(hello[:cut]) in (None, "pypi.org")
    assert server_name(b"\x16\x03\x01\xff\xff\x01" + b"\xff" * 64) is None
    request = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nHOST: PyPI.org:8080\r\n\r\nbody"
    assert host_of_http(request) == "pypi.org"
    assert host_of_http(b"GET / HTTP/1.1\r\nHost: pypi.org\r\n") is None  # head incomplete
    assert host_of_http(b"GET / HTTP/1.0\r\n\r\n") is None
    assert host_of_http(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n") is None
    injected = with_headers(request + b"", {"Authorization": "Bearer s3cret"})
    assert injected.startswith(b"GET / HTTP/1.1\r\n") and injected.endswith(b"\r\n\r\nbody")
    assert b"Authorization: Bearer s3cret\r\n" in injected
    assert b"Connection: close\r\n" in injected


def test_rules_redirect_only_a_policy_naming_hosts() -> None:
    named = install_script(1_900_000_007, EgressPolicy.of(allow=["pypi.org"]), [], UIDS, 41234)
    assert "meta nfproto ipv4 tcp dport 80 redirect to :41234" in named
    assert "meta nfproto ipv4 tcp dport 443 redirect to :41234" in named
    assert "ip daddr 127.0.0.1 tcp dport 41234 ct status dnat accept" in named
    assert "meta nfproto ipv6 tcp dport { 80, 443 } goto refuse" in named
    plain = install_script(1_900_000_007, EgressPolicy(), [], UIDS)
    assert "redirect" not in plain and "add chain inet forkpoint n1900000007" in plain
    assert "delete chain inet forkpoint n1900000007" in remove_script(1_900_000_007)


# --- the proxy, with the kernel, in namespaces of the test's own --------------------------

GUESTSIDE, WORLD = "fpt-names-g", "fpt-names-w"
HOST, NAMED, OTHER, PRIVATE = "198.51.100.1", "198.51.100.2", "198.51.100.3", "10.231.0.2"
HOSTS = Path("/etc/netns") / GUESTSIDE / "hosts"
UID = 1_900_000_031

# Listeners in the world: each TCP connection gets back what it sent first, and is logged.
LISTENER = r"""
import selectors, socket, sys
sel = selectors.DefaultSelector()
for spec in sys.argv[1:]:
    addr, port = spec.split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, int(port)))
    s.listen(16)
    sel.register(s, selectors.EVENT_READ, spec)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        conn, _ = key.fileobj.accept()
        conn.settimeout(2)
        try:
            got = conn.recv(4096)
        except OSError:
            got = b""
        conn.sendall(b"echo " + got)
        conn.close()
        print("hit", key.data, flush=True)
"""

# "The host": installs uid UID's rules for each policy in turn, then connects as UID.
SCENARIO = r"""
import json, os, socket, ssl, sys
from forkpoint.models import SESSION_UIDS
from forkpoint.egress import EgressPolicy
from forkpoint.vm.egress_proxies import PROXIES, proxy_for, stop_proxy
from forkpoint.vm.nftables import install_rules, remove_rules

uid, steps = int(sys.argv[1]), json.loads(sys.argv[2])

def hello(name):
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=name)
    try:
        client.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()

def payload(target):
    address, port, kind, name = target
    return hello(name) if kind == "tls" else f"GET / HTTP/1.1\r\nHost: {name}\r\n\r\n".encode()

def attempt(target, payload):
    address, port, kind, name = target
    try:
        with socket.socket() as s:  # no getaddrinfo: nothing to load as that uid
            s.settimeout(5)
            s.connect((address, port))
            s.sendall(payload)
            got = b""
            while chunk := s.recv(4096):
                got += chunk
            if not got.startswith(b"echo"):
                return "closed"
            return "open+secret" if b"Authorization: Bearer s3cret\r\n" in got else "open"
    except OSError as e:
        return type(e).__name__

results = []
for step in steps:
    policy = EgressPolicy.of(step["allow"], step["deny"], step.get("headers"))
    install_rules(uid, policy, SESSION_UIDS, proxy_for(uid, policy))
    payloads = [payload(t) for t in step["targets"]]
    read, write = os.pipe()
    if os.fork() == 0:
        os.setgid(uid)
        os.setuid(uid)
        got = [attempt(t, p) for t, p in zip(step["targets"], payloads)]
        os.write(write, json.dumps(got).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        results.append(json.loads(pipe.read()))
    os.wait()
    results.append(sorted(os.listdir(PROXIES / str(uid))) if (PROXIES / str(uid)).exists() else [])
    if step.get("headers"):  # straight to the proxy, not redirected: it has no destination
        port = int((PROXIES / str(uid) / "port").read_text())
        results.append(attempt(["127.0.0.1", port, "http", "named.test"], payload(
            ["198.51.100.2", 80, "http", "named.test"])))
remove_rules(uid, policy)
stop_proxy(uid)
print(json.dumps(results))
"""


PAIR = NetPair(GUESTSIDE, WORLD, HOST, NAMED)


def _teardown() -> None:
    stop_proxy(UID)  # one a killed run left behind serves a namespace that is gone
    PAIR.remove()


@pytest.fixture
def world() -> Iterator[subprocess.Popen[str]]:
    _teardown()
    listener: subprocess.Popen[str] | None = None
    try:
        PAIR.make(extra=(OTHER, PRIVATE))
        HOSTS.write_text(
            f"{NAMED} named.test\n{OTHER} other.test denied.test\n{PRIVATE} private.test\n"
            f"{HOST} myself.test\n127.0.0.1 localhost loopback.test\n"
        )
        specs = [f"{a}:{p}" for a in (NAMED, OTHER, PRIVATE) for p in (80, 443, 7000)]
        listener = subprocess.Popen(
            _in(WORLD, sys.executable, "-c", LISTENER, *specs), stdout=subprocess.PIPE, text=True
        )
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        yield listener
    finally:
        if listener is not None and listener.returncode is None:
            listener.kill()
            listener.communicate()
        _teardown()


def _hits(listener: subprocess.Popen[str]) -> list[str]:
    listener.terminate()
    out, _ = listener.communicate(timeout=10)
    return [line.split()[1] for line in out.splitlines() if line.startswith("hit ")]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None,
    reason="needs root, nft and ip",
)
def test_the_proxy_judges_each_connection_by_the_name_it_asks_for(
    world: subprocess.Popen[str],
) -> None:
    allow_list = {
        "allow": ["named.test", "*.wild.test", "loopback.test", "myself.test"],
        "deny": ["0.0.0.0/0"],
        "targets": [
            [NAMED, 80, "http", "named.test"],  # allowed by name
            [OTHER, 80, "http", "named.test"],  # its name's own address is used: NAMED
            [NAMED, 443, "tls", "named.test"],  # TLS: the SNI
            [OTHER, 443, "tls", "other.test"],  # no rule names it: its address is denied
            [OTHER, 80, "http", "other.test"],
            [NAMED, 443, "tls", "loopback.test"],  # allowed, but the host's loopback: never
            [NAMED, 80, "http", "myself.test"],  # nor the host's own address
            [NAMED, 7000, "http", "named.test"],  # not HTTP's port: the addresses decide
        ],
    }
    deny_list = {  # changed while the proxy runs: the next connection follows it
        "allow": [],
        "deny": ["denied.test"],
        "targets": [
            [OTHER, 80, "http", "denied.test"],
            [OTHER, 443, "tls", "denied.test"],
            [OTHER, 80, "http", "other.test"],  # no name rule: the address is allowed
            [PRIVATE, 80, "http", "private.test"],  # the default denies still hold
        ],
    }
    credentials = {  # set on plain HTTP to the named host only; TLS passes untouched
        "allow": [],
        "deny": [],
        "headers": {"named.test": {"Authorization": "Bearer s3cret"}},
        "targets": [
            [NAMED, 80, "http", "named.test"],
            [NAMED, 443, "tls", "named.test"],
            [OTHER, 80, "http", "other.test"],
            [OTHER, 80, "http", "named.test"],  # its credentials go to its address only
        ],
    }
    addresses_only = {"allow": [], "deny": [], "targets": [[OTHER, 80, "http", "x.test"]]}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run(
        _in(GUESTSIDE, sys.executable, "-c", SCENARIO, str(UID),
            json.dumps([allow_list, deny_list, credentials, addresses_only])),
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, files, second, files_again, injected, _, direct, third, no_files = json.loads(
        done.stdout
    )
    assert first == ["open", "open", "open", "closed", "closed", "closed", "closed",
                     "ConnectionRefusedError"], first  # fmt: skip
    assert files == ["log", "pid", "policy.json", "port"] == files_again
    assert second == ["closed", "closed", "open", "closed"], second
    assert injected == ["open+secret", "open", "open", "open+secret"], injected
    assert direct == "closed"  # a host process cannot borrow the proxy (or its credentials)
    assert third == ["open"] and no_files == []  # no names: no proxy, the kernel alone
    hits = _hits(world)
    assert sorted(hits) == sorted(
        [f"{NAMED}:80", f"{NAMED}:80", f"{NAMED}:443", f"{OTHER}:80", f"{OTHER}:80"]
        + [f"{NAMED}:80", f"{NAMED}:443", f"{OTHER}:80", f"{NAMED}:80"]
    ), hits
    assert not (Path("/run/forkpoint/egress") / str(UID)).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the proxies' directory is root's")
def test_a_proxy_no_session_holds_breaks_the_home_invariants(tmp_path: Path) -> None:
    from forkpoint.config import Home
    from forkpoint.runtime.housekeeping.invariants import check_home
    from forkpoint.store import Store
    from forkpoint.store.db import session_uids
    from forkpoint.vm.egress_proxies import proxy_for

    home = Home(tmp_path).ensure()
    store = Store.open(home)
    uid = session_uids(home.root)[7]
    try:
        assert proxy_for(uid, EgressPolicy.of(allow=["pypi.org"])) is not None
        problems = check_home(home, store)
        assert problems == [f"the egress proxy of uid {uid} belongs to no session"], problems
        stop_proxy(uid)
        assert check_home(home, store) == []
    finally:
        stop_proxy(uid)
        store.close()


def test_the_proxy_waits_only_for_what_can_name_a_host() -> None:
    from forkpoint.vm.egress_proxy import _said_enough

    hello = client_hello("pypi.org")
    assert not _said_enough(hello[:3]) and not _said_enough(hello[:-1]) and _said_enough(hello)
    assert not _said_enough(b"GE") and not _said_enough(b"GET / HTTP/1.1\r\nHost: a")
    assert _said_enough(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert _said_enough(b"SSH-2.0-OpenSSH_9.2\r\n")  # not HTTP or TLS: nothing to wait for
