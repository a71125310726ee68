"""The egress policy against a real guest, in a little network the test builds itself.

Two network namespaces and a veth pair: ``fpt-guestside`` is "the host" (forkpoint, QEMU,
passt and forkpoint's nftables table live there: the CLI runs under ``ip netns exec``),
``fpt-world`` is the network around it, with listeners on a private address, a metadata
address, another private range, a "public" address (TEST-NET-2) and a DNS resolver on a
private address (``/etc/netns/fpt-guestside/resolv.conf``, which ``ip netns exec`` puts in
place of ``/etc/resolv.conf``). The host side listens on its 127.0.0.1 and on its own
address. No address outside these namespaces is ever touched.

A block is proven twice: the guest's connect failed, and the listener saw nothing. That it
is refused at once is shown on the host side, by connecting as the session's uid: the
guest itself waits for its own timeout, because Debian 12's passt relays the refusal as a
RST without ACK, which a connecting Linux ignores (RFC 793).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from forkpoint.egress import EgressPolicy
from forkpoint.vm.net import DNS, GATEWAY
from forkpoint.vm.nftables import policy_map
from netpair import NetPair
from netpair import in_ns as _in
from netpair import sh as _sh

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft (jailed VMs)"
    ),
]

GUESTSIDE, WORLD = "fpt-guestside", "fpt-world"
HOST_ADDRESS, WORLD_ADDRESS = "198.51.100.1", "198.51.100.2"  # TEST-NET-2: "public"
PRIVATE, METADATA, PRIVATE_192 = "10.231.0.2", "169.254.169.254", "192.168.231.2"
RESOLVER = "10.231.0.53"
PORT = 7000
RESOLV_CONF = Path("/etc/netns") / GUESTSIDE / "resolv.conf"  # NetPair.etc
HOSTS = RESOLV_CONF.with_name("hosts")  # the host's names (the egress proxy resolves them)
WORLD_NAME = "world.test"
RECORDER_ADDRESS, RECORDER_NAME = "198.51.100.4", "api.test"
FORKPOINT = str(Path(sys.executable).with_name("forkpoint"))

# One process per namespace: TCP listeners greet and log whoever connects, UDP ones echo.
LISTENER = r"""
import selectors, socket, sys
sel = selectors.DefaultSelector()
for spec in sys.argv[1:]:
    proto, addr, port = spec.split(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, int(port)))
    if proto == "tcp":
        s.listen(16)
    sel.register(s, selectors.EVENT_READ, spec)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        if key.data.startswith("tcp"):
            conn, peer = key.fileobj.accept()
            conn.sendall(b"hello")
            conn.close()
        else:
            data, peer = key.fileobj.recvfrom(4096)
            key.fileobj.sendto(data, peer)
        print("hit", key.data, flush=True)
"""

# Runs in the guest: every TCP target at once, then a DNS query through passt's forwarder.
PROBE = r"""
import json, socket, sys, threading
out = {}
def connect(target):
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=4) as s:
            out[target] = "open " + s.recv(16).decode()
    except OSError as e:
        out[target] = "blocked " + type(e).__name__
threads = [threading.Thread(target=connect, args=(t,)) for t in json.loads(sys.argv[1])]
for t in threads:
    t.start()
for t in threads:
    t.join()
query = bytes.fromhex("1234010000010000000000000474657374000001 0001".replace(" ", ""))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(8)
try:
    s.sendto(query, (sys.argv[2], 53))
    out["dns"] = "answered" if s.recv(512) == query else "garbled"
except OSError as e:
    out["dns"] = "failed " + type(e).__name__
print(json.dumps(out))
"""


@dataclass
class Listener:
    process: subprocess.Popen[str]

    def hits(self) -> list[str]:
        """Every ``hit <spec>`` line so far (ends the listener)."""
        self.process.terminate()
        out, _ = self.process.communicate(timeout=10)
        return [line.split()[1] for line in out.splitlines() if line.startswith("hit ")]


def _listen(ns: str, *specs: str) -> Listener:
    return _listen_with(ns, LISTENER, *specs)


def _listen_with(ns: str, script: str, *args: str) -> Listener:
    process = subprocess.Popen(
        _in(ns, sys.executable, "-c", script, *args), stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError(f"listener in {ns} did not start")
    return Listener(process)


@dataclass
class Network:
    guestside: Listener
    world: Listener


PAIR = NetPair(GUESTSIDE, WORLD, HOST_ADDRESS, WORLD_ADDRESS)


@pytest.fixture
def network() -> Iterator[Network]:
    listeners: list[Listener] = []
    try:
        PAIR.make(extra=(PRIVATE, METADATA, PRIVATE_192, RESOLVER))
        RESOLV_CONF.write_text(f"nameserver {RESOLVER}\n")
        HOSTS.write_text(
            f"127.0.0.1 localhost\n{WORLD_ADDRESS} {WORLD_NAME} other.test\n"
            f"{RECORDER_ADDRESS} {RECORDER_NAME}\n"
        )
        listeners.append(_listen(GUESTSIDE, f"tcp:127.0.0.1:{PORT}", f"tcp:{HOST_ADDRESS}:{PORT}"))
        tcp = [f"tcp:{a}:{PORT}" for a in (PRIVATE, PRIVATE_192, WORLD_ADDRESS, RESOLVER)]
        tcp.append(f"tcp:{WORLD_ADDRESS}:80")
        listeners.append(_listen(WORLD, *tcp, f"tcp:{METADATA}:80", f"udp:{RESOLVER}:53"))
        yield Network(*listeners)
    finally:
        for listener in listeners:
            if listener.process.returncode is None:
                listener.process.kill()
                listener.process.communicate()
        PAIR.remove()


def _forkpoint(*args: str, timeout: float = 180) -> str:
    done = subprocess.run(
        _in(GUESTSIDE, FORKPOINT, *args), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"forkpoint {' '.join(args)}: {done.stderr or done.stdout}"
    return done.stdout


def _probe(session: str) -> dict[str, object]:
    targets = [f"{a}:{PORT}" for a in (PRIVATE, PRIVATE_192, WORLD_ADDRESS, RESOLVER)]
    targets += [f"{METADATA}:80", f"{HOST_ADDRESS}:{PORT}", f"{GATEWAY}:{PORT}"]
    out = _forkpoint("exec", "--json", session, "--", "python3", "-c", PROBE,
                     json.dumps(targets), DNS)  # fmt: skip
    result: dict[str, object] = json.loads(json.loads(out)["stdout"])
    return result


def _assert_blocked(results: dict[str, object], *targets: str) -> None:
    for target in targets:
        assert str(results[target]).startswith("blocked"), f"guest reached {target}: {results}"


# Connects as the session's uid from "the host", as passt does: refused in milliseconds.
AS_UID = r"""
import os, socket, sys, time
uid = int(sys.argv[1])
os.setgid(uid)
os.setuid(uid)
out = []
for target in sys.argv[2:]:
    host, port = target.rsplit(":", 1)
    started = time.monotonic()
    try:
        with socket.socket() as s:  # no getaddrinfo: nothing to load as that uid
            s.settimeout(5)
            s.connect((host, int(port)))
        result = "open"
    except OSError as e:
        result = type(e).__name__
    out.append(f"{target} {result} {time.monotonic() - started:.3f}")
print("\n".join(out))
"""


def _connect_as(uid: int, *targets: str) -> dict[str, tuple[str, float]]:
    done = _sh(*_in(GUESTSIDE, sys.executable, "-c", AS_UID, str(uid), *targets), check=False)
    assert done.returncode == 0, done.stderr
    rows = (line.split() for line in done.stdout.splitlines())
    return {target: (result, float(seconds)) for target, result, seconds in rows}


def _uid_of(session: str) -> int:
    from forkpoint.runtime import Runtime

    runtime = Runtime.open()
    try:
        uid = runtime.store.get_session(session).uid
    finally:
        runtime.close()
    assert uid is not None
    return uid


def _nft_table() -> str:
    return _sh(*_in(GUESTSIDE, "nft", "list", "table", "inet", "forkpoint")).stdout


def _nft_chain(uid: int) -> str:
    return _sh(*_in(GUESTSIDE, "nft", "list", "chain", "inet", "forkpoint", f"u{uid}")).stdout


def test_default_policy_and_its_adjustments(network: Network) -> None:
    default = json.loads(_forkpoint("create", "--json", "--port", "8000"))
    adjusted = json.loads(
        _forkpoint(
            "create", "--json", "--allow-net", f"{PRIVATE}/32", "--deny-net", "198.51.100.0/24"
        )  # fmt: skip
    )
    forks: list[str] = []
    try:
        assert adjusted["egress"] == {"allow": [f"{PRIVATE}/32"], "deny": ["198.51.100.0/24"]}
        shown = json.loads(_forkpoint("show", "--json", adjusted["id"]))
        assert shown["egress"] == adjusted["egress"]

        plain = _probe(default["id"])
        _assert_blocked(plain, f"{PRIVATE}:{PORT}", f"{PRIVATE_192}:{PORT}",
                        f"{RESOLVER}:{PORT}", f"{METADATA}:80", f"{HOST_ADDRESS}:{PORT}",
                        f"{GATEWAY}:{PORT}")  # fmt: skip
        assert plain[f"{WORLD_ADDRESS}:{PORT}"] == "open hello", plain
        assert plain["dns"] == "answered", plain  # the resolver, on port 53 only
        host_side = _connect_as(_uid_of(default["id"]), f"{PRIVATE}:{PORT}",
                                f"{HOST_ADDRESS}:{PORT}", f"{METADATA}:80")  # fmt: skip
        for target, (result, seconds) in host_side.items():
            assert result == "ConnectionRefusedError" and seconds < 0.5, (target, host_side)

        changed = _probe(adjusted["id"])
        assert changed[f"{PRIVATE}:{PORT}"] == "open hello", changed
        _assert_blocked(changed, f"{WORLD_ADDRESS}:{PORT}", f"{METADATA}:80",
                        f"{PRIVATE_192}:{PORT}", f"{HOST_ADDRESS}:{PORT}")  # fmt: skip
        assert changed["dns"] == "answered", changed

        # a fork gets the policy of the session it was forked from
        checkpoint = json.loads(_forkpoint("checkpoint", "--json", adjusted["id"]))
        fork = json.loads(_forkpoint("fork", "--json", checkpoint["id"]))[0]
        forks.append(fork["id"])
        assert fork["egress"] == adjusted["egress"]
        policy4 = policy_map(EgressPolicy.from_json(adjusted["egress"]), 4)
        assert f"ip daddr vmap @{policy4}" in _nft_chain(_uid_of(fork["id"]))
        listed = _sh(*_in(GUESTSIDE, "nft", "list", "map", "inet", "forkpoint", policy4))
        assert f"{PRIVATE} : accept" in listed.stdout

        # the table gone (a reboot, `nft flush ruleset`): restarting passt brings it back
        _sh(*_in(GUESTSIDE, "nft", "delete", "table", "inet", "forkpoint"))
        _forkpoint("port", default["id"], "8001")
        assert "fib daddr type local" in _nft_chain(_uid_of(default["id"]))

        # the 127.0.0.1 port forward works with the rules in place
        _forkpoint("exec", default["id"], "--", "sh", "-c",
                   "nohup python3 -m http.server 8000 >/dev/null 2>&1 &")  # fmt: skip
        url = default["ports"][0]["url"]
        fetch = "import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1]).status)"
        deadline = time.monotonic() + 60
        while True:
            got = _sh(*_in(GUESTSIDE, sys.executable, "-c", fetch, url), check=False)
            if got.stdout.strip() == "200" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert got.stdout.strip() == "200", got.stderr
    finally:
        _forkpoint("rm", default["id"], adjusted["id"], *forks)
    # what the listeners saw: only what the policies let through
    assert network.guestside.hits() == []
    seen = network.world.hits()
    assert sorted(hit for hit in seen if hit != f"udp:{RESOLVER}:53") == sorted(
        [f"tcp:{WORLD_ADDRESS}:{PORT}", f"tcp:{PRIVATE}:{PORT}"]
    )
    assert seen.count(f"udp:{RESOLVER}:53") >= 2  # the probes' (and the guests' own) DNS
    table = _nft_table()  # removing the sessions removed their rules, nothing else
    assert "goto u" not in table and "meta skuid vmap @sessions" in table
    assert policy_map(EgressPolicy.from_json(adjusted["egress"]), 4) not in table


def test_egress_changes_while_the_guest_runs(network: Network) -> None:
    session = json.loads(_forkpoint("create", "--json"))["id"]
    world, private = f"{WORLD_ADDRESS}:{PORT}", f"{PRIVATE}:{PORT}"
    try:
        uid = _uid_of(session)
        assert _connect_as(uid, world)[world][0] == "open"

        denied = json.loads(_forkpoint("egress", "--json", session, "--deny-net", "0.0.0.0/0",
                                       "--allow-net", f"{PRIVATE}/32"))  # fmt: skip
        assert denied["egress"] == {"allow": [f"{PRIVATE}/32"], "deny": ["0.0.0.0/0"]}
        # in force when the command returns, for the guest's next connection
        probe = _probe(session)
        assert probe[private] == "open hello", probe
        _assert_blocked(probe, world, f"{PRIVATE_192}:{PORT}", f"{HOST_ADDRESS}:{PORT}")
        assert probe["dns"] == "answered", probe  # DNS to the host's resolvers stays
        assert json.loads(_forkpoint("show", "--json", session))["egress"] == denied["egress"]

        # no adjustments: the defaults again, and the first policy's maps are gone
        first = policy_map(EgressPolicy.from_json(denied["egress"]), 4)
        reset = json.loads(_forkpoint("egress", "--json", session))
        assert reset["egress"] == {"allow": [], "deny": []}
        assert first not in _nft_table()
        after = _connect_as(uid, world, private)
        assert after[world][0] == "open" and after[private][0] == "ConnectionRefusedError", after

        # a paused session keeps the change for when it runs again
        _forkpoint("pause", session)
        _forkpoint("egress", session, "--deny-net", f"{WORLD_ADDRESS}/32")
        _forkpoint("resume", session)
        assert _connect_as(_uid_of(session), world)[world][0] == "ConnectionRefusedError"
    finally:
        _forkpoint("rm", session)
    assert network.guestside.hits() == []


# Runs in the namespace: an E2B gateway, and the real e2b SDK asking it for network rules.
E2B_RULES = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from e2b import ALL_TRAFFIC, CommandExitException, Sandbox
from e2b_gateway import running_gateway

world, private, world_name = sys.argv[2], sys.argv[3], sys.argv[5]
CONNECT = "python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], {}), timeout=4)' "
# An HTTP request for a name, at an address: answered only if the greeting comes back.
ASK = (
    "python3 -c 'import socket,sys; s = socket.create_connection((sys.argv[1], 80), timeout=4); "
    "s.sendall(b\"GET / HTTP/1.1\\r\\nHost: \" + sys.argv[2].encode() + b\"\\r\\n\\r\\n\"); "
    "sys.exit(0 if s.recv(5) == b\"hello\" else 1)' "
)

def reaches(sbx, address):
    try:
        sbx.commands.run(CONNECT.format(sys.argv[4]) + address, timeout=60)
        return True
    except CommandExitException:
        return False

def answered(sbx, name):
    try:
        sbx.commands.run(ASK + world + " " + name, timeout=60)
        return True
    except CommandExitException:
        return False

out = {}
with running_gateway("--e2b-timeout", "600"):
    sbx = Sandbox.create(timeout=600, network={"deny_out": [ALL_TRAFFIC], "allow_out": [private]})
    try:
        out["allow-list"] = [reaches(sbx, private), reaches(sbx, world)]
        started = time.monotonic()
        sbx.update_network({"deny_out": [world]})
        out["update_s"] = time.monotonic() - started
        out["deny-one"] = [reaches(sbx, private), reaches(sbx, world)]
        sbx.update_network({})
        out["cleared"] = [reaches(sbx, private), reaches(sbx, world)]
        sbx.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": [world_name]})
        out["by-name"] = [answered(sbx, world_name), answered(sbx, "other.test"),
                          reaches(sbx, world)]
    finally:
        sbx.kill()
    offline = Sandbox.create(timeout=600, allow_internet_access=False)
    try:
        out["offline"] = [reaches(offline, world), offline.get_info().allow_internet_access]
    finally:
        offline.kill()
print(json.dumps(out))
"""


def test_e2b_network_rules_and_update_network(network: Network) -> None:
    done = subprocess.run(
        _in(GUESTSIDE, sys.executable, "-c", E2B_RULES, str(Path(__file__).parent),
            WORLD_ADDRESS, PRIVATE, str(PORT), WORLD_NAME),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["allow-list"] == [True, False], out  # allow beats the deny of everything
    assert out["deny-one"] == [False, False], out  # replaced: the allow is gone too
    assert out["cleared"] == [False, True], out  # E2B's defaults are forkpoint's
    # a name allowed, all else denied: HTTP for that name is answered, for another name
    # at the very same address not, and other ports to that address stay closed
    assert out["by-name"] == [True, False, False], out
    assert out["update_s"] < 1, out
    assert out["offline"] == [False, False], out
    assert network.guestside.hits() == []
    assert network.world.hits().count(f"tcp:{WORLD_ADDRESS}:80") == 1  # only the named one


# A web server in the world that records the Authorization header it was sent, and answers
# without repeating it.
RECORDER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 80))
s.listen(4)
print("ready", flush=True)
while True:
    conn, _ = s.accept()
    conn.settimeout(5)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk:
            break
        head += chunk
    auth = [l for l in head.decode().split("\r\n") if l.lower().startswith("authorization:")]
    print("auth", auth[0].split(":", 1)[1].strip() if auth else "-", flush=True)
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
    conn.close()
"""
# In the guest: an HTTP request for api.test, printing the status line it got back.
FETCH = (
    "import socket, sys; s = socket.create_connection((sys.argv[1], 80), timeout=10); "
    "s.sendall(b'GET / HTTP/1.1\\r\\nHost: api.test\\r\\n\\r\\n'); "
    "print(s.recv(4096).split(b'\\r\\n')[0].decode())"
)


def _holds(path: Path, needle: bytes) -> bool:
    """Whether ``needle`` is anywhere in the file (read in overlapping chunks)."""
    tail = b""
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


def test_an_injected_credential_goes_out_but_never_into_the_guest(
    network: Network, tmp_path: Path
) -> None:
    secret = f"Bearer fp-{os.urandom(12).hex()}"
    (tmp_path / "token").write_text(secret + "\n")
    PAIR.add_world_address(RECORDER_ADDRESS)
    recorder = _listen_with(WORLD, RECORDER, RECORDER_ADDRESS)
    session = json.loads(
        _forkpoint(
            "create",
            "--json",
            "--inject-header",
            f"{RECORDER_NAME}:Authorization=@{tmp_path / 'token'}",
        )  # fmt: skip
    )
    try:
        assert session["egress"]["headers"] == [f"{RECORDER_NAME}: Authorization"]
        assert secret not in _forkpoint("show", "--json", session["id"])
        # asked at another address: the credential still goes to api.test's own only
        out = json.loads(_forkpoint("exec", "--json", session["id"], "--", "python3", "-c",
                                    FETCH, WORLD_ADDRESS))  # fmt: skip
        assert out["stdout"].strip() == "HTTP/1.0 200 OK", out
        # the guest's own files and memory, as a checkpoint holds them: no trace of it
        checkpoint = json.loads(_forkpoint("checkpoint", "--json", session["id"]))
        home = Path(os.environ["FORKPOINT_HOME"])
        stored = [*(home / "checkpoints" / checkpoint["id"]).iterdir(),
                  *(home / "layers").iterdir()]  # fmt: skip
        assert any(p.name == "ram" for p in stored)
        assert not [p for p in stored if p.is_file() and _holds(p, secret.encode())]
    finally:
        _forkpoint("rm", session["id"])
        recorder.process.terminate()
        lines, _ = recorder.process.communicate(timeout=10)
    assert [line for line in lines.splitlines() if line.startswith("auth ")] == [f"auth {secret}"]
