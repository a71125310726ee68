"""The cluster on Ray, for real: a head and three nodes in their own network namespaces
(own address, home and jail), a real S3 server, the real ``ray`` and the CLI as a user
runs it (``tests/cluster_net.py``). ``make cluster-test`` runs this file alone.

One scenario, as the issue tells it: create → checkpoint → fork ×6 spread two per node,
every fork alive at the same PID and answering through the client's tunnel; Ray holding
seven reservations; node 2 powered off → its sessions ``lost``, the others untouched;
``recover`` revives them on nodes 1 and 3 at the same PIDs; node 2 back (refused without
the token) drops what was revived elsewhere; all removed → no reservation, no VM, every
home consistent.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from cluster_net import ClusterNet
from forkpoint.config import Home, home
from forkpoint.errors import ForkpointError
from forkpoint.runtime.housekeeping.invariants import check_home
from forkpoint.sdk import Checkpoint, Sandbox
from forkpoint.store import Store
from forkpoint.vm import qemu_build

pytestmark = [pytest.mark.vm, pytest.mark.timeout(420)]

_SERVER = "python3 -m http.server 8000"
_LOST_WITHIN_S = 20.0
_FORKPOINT = Path(sys.executable).with_name("forkpoint")


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterNet]:
    net = ClusterNet(home().ensure().root / "cluster")
    net.remove_files()
    try:
        net.start()
        yield net
    finally:
        net.stop()
    net.remove_files()


def _ray_reserves(net: ClusterNet, slots: float) -> None:
    """``ray status`` comes to show ``slots`` VM slots reserved (Ray's autoscaler reports
    what it last polled: seconds behind)."""
    deadline = time.monotonic() + 30
    while (seen := _reserved_slots(net)) != slots:
        assert time.monotonic() < deadline, f"ray status shows {seen} slots reserved, not {slots}"
        time.sleep(1)


def _holds(net: ClusterNet, bundles: int) -> None:
    """forkpoint holds ``bundles`` reservations, as ``cluster status`` reads Ray's
    placement groups back (at once, where ``ray status`` lags its autoscaler's poll)."""
    deadline = time.monotonic() + 30
    while (held := net.json("cluster", "status")["reservations"]) != bundles:
        assert time.monotonic() < deadline, f"{held} reservations held, not {bundles}"
        time.sleep(1)


def _reserved_slots(net: ClusterNet) -> float:
    """The VM slots Ray says forkpoint holds (``ray status``: ``0.0/18.0 forkpoint_vm
    (0.0 used of 7.0 reserved in placement groups)``; no line: none reserved)."""
    status = net.ray_status()
    found = re.search(r"forkpoint_vm \(.*?([\d.]+) reserved in placement groups", status)
    if found:
        return float(found.group(1))
    assert re.search(r"/[\d.]+ forkpoint_vm\s*$", status, re.M), status  # none reserved
    return 0.0


def _serves(net: ClusterNet, session: str, pid: int) -> None:
    """``session`` runs the server at ``pid`` and answers through the client's tunnel."""
    comm = net.cli("exec", session, "--", "cat", f"/proc/{pid}/cmdline").stdout
    assert "http.server" in comm, (session, pid, comm)
    tunnel = net.popen("port", session, "8000", "--json")
    try:
        assert tunnel.stdout is not None
        printed = ""
        while not printed.endswith("}\n"):  # its JSON, printed once it listens
            line = tunnel.stdout.readline()
            assert line, f"the tunnel ended: {printed}"
            printed += line
        page = net.head("curl", "-sf", "-m", "20", json.loads(printed)["url"]).stdout
        assert "Directory listing" in page
    finally:
        tunnel.kill()
        tunnel.communicate()


def _by_node(sessions: list[dict[str, Any]]) -> Counter[str]:
    return Counter(s["node"] for s in sessions)


def _start_server(net: ClusterNet, session: str) -> int:
    """The server started in ``session`` and listening (before a checkpoint takes it:
    under load it may take seconds to bind); its pid."""
    started = net.cli("exec", session, "-b", "--", *_SERVER.split()).stdout
    probe = "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8000\")'"
    wait = f"for i in $(seq 120); do {probe} 2>/dev/null && exit 0; sleep 0.5; done"
    net.cli("exec", session, "--", "sh", "-c", wait + "; exit 1")
    return int(started.split()[2])  # "started pid N (log: …)"


def test_sessions_are_placed_by_ray_and_outlive_their_node(cluster: ClusterNet) -> None:
    net = cluster
    source = net.json("create", "--port", "8000", "--memory", "256")
    pid = _start_server(net, source["id"])
    checkpoint = net.json("checkpoint", source["id"], "--name", "ready")

    # A lifetime ends on its node, as on one host; the cluster then forgets the session
    # and gives its reservation back.
    expiring = net.json("create", "--memory", "256", "--timeout", "3")
    deadline = time.monotonic() + 60
    while expiring["id"] in {s["id"] for s in net.json("ls")}:
        assert time.monotonic() < deadline, "a session outlived its --timeout"
        time.sleep(1)

    forks = net.json("fork", "ready", "--count", "6", "--spread")
    assert all("id" in f for f in forks), forks
    assert _by_node(forks) == {"n1": 2, "n2": 2, "n3": 2}
    _ray_reserves(net, 7.0)
    status = net.json("cluster", "status")
    assert status["reservations"] == 7
    nodes = {n["name"]: n for n in status["nodes"] if n["daemon"]}
    assert sorted(nodes) == ["n1", "n2", "n3"]
    assert {n["qemu"] for n in nodes.values()} == {qemu_build().digest}  # forks go there only
    assert sum(n["slots_reserved"] for n in nodes.values()) == 7
    for fork in forks:
        assert fork["parent_checkpoint"] == checkpoint["id"]
        _serves(net, fork["id"], pid)

    # Node 2 goes away: its sessions are lost within seconds, the others run on.
    everyone = {s["id"]: s for s in net.json("ls")}
    on_n2 = {i for i, s in everyone.items() if s["node"] == "n2"}
    assert len(on_n2) >= 2
    net.power_off("n2")
    deadline = time.monotonic() + _LOST_WITHIN_S
    while True:
        now = {s["id"]: s for s in net.json("ls")}
        if all(now[i]["state"] == "lost" for i in on_n2):
            break
        assert time.monotonic() < deadline, f"not lost within {_LOST_WITHIN_S} s: {now}"
        time.sleep(1)
    untouched = [i for i in now if i not in on_n2]
    assert all(now[i]["state"] == "running" and now[i]["node"] != "n2" for i in untouched)
    failed = net.cli("exec", sorted(on_n2)[0], "--", "true", check=False)
    assert failed.returncode == 4 and "recover" in failed.stderr, failed.stderr

    recovered = net.json("recover")
    assert sorted(s["id"] for s in recovered) == sorted(on_n2), recovered
    assert {s["node"] for s in recovered} <= {"n1", "n3"}
    for session in recovered:
        _serves(net, session["id"], pid)
    assert all(s["state"] == "running" for s in net.json("ls"))

    # Node 2 back: without the token Ray refuses it; with it, it drops what was revived
    # elsewhere while it was away (its VMs died with it, its home still lists them).
    refused = net.cli("ls", check=False, RAY_AUTH_TOKEN="not-the-token")
    assert refused.returncode != 0 and "cannot join the Ray cluster" in refused.stderr
    joined = net.join("n2")
    assert set(joined["removed_stale"]) == on_n2

    net.cli("rm", *everyone)
    net.cli("checkpoint", "rm", "ready")
    assert net.json("ls") == []
    _ray_reserves(net, 0.0)
    assert net.json("cluster", "status")["reservations"] == 0
    for node in net.nodes:
        assert net.vms(node) == [], node
        node_home = Home(net.home(node))
        store = Store.open(node_home)
        try:
            assert check_home(node_home, store) == [], node
            assert store.list_sessions() == [], node
        finally:
            store.close()


def test_rest_sdk_and_mcp_serve_the_cluster(cluster: ClusterNet) -> None:
    """``forkpoint serve`` and ``forkpoint mcp`` with ``FORKPOINT_CLUSTER`` set serve the
    cluster: the SDK and the real MCP client place sessions through Ray as the CLI does,
    and an operation the cluster does not offer yet answers one clear error."""
    net = cluster
    socket = net.root / "client" / "api.sock"
    server = net.popen("serve", "--socket", str(socket))
    made: list[Sandbox] = []
    checkpoint: Checkpoint | None = None
    try:
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, "forkpoint serve never listened"
            time.sleep(0.2)
        url = f"unix:{socket}"
        source = Sandbox.create(memory_mib=256, base_url=url)
        made.append(source)
        assert source.info.node in net.nodes
        assert source.commands.run("echo placed").stdout == "placed\n"
        checkpoint = source.checkpoint("doors")
        forks = checkpoint.fork(2)
        assert all(isinstance(f, Sandbox) for f in forks), forks
        made += [f for f in forks if isinstance(f, Sandbox)]
        # Listed once, though the forks' nodes hold copies of it (pulled to fork there).
        assert [c["id"] for c in net.json("checkpoints")] == [checkpoint.id]
        assert [c["name"] for c in net.json("checkpoints", source.id)] == ["doors"]
        listed = {s.id: s for s in Sandbox.list_sessions(base_url=url)}
        assert set(listed) == {m.id for m in made}
        assert all(s.node in net.nodes and s.state == "running" for s in listed.values())
        # A session's other operations run on its node as they are: files, a rollback
        # (the record then revives the state rolled back to), processes.
        source.files.write("/root/after", "written after the checkpoint")
        assert source.files.read_text("/root/after") == "written after the checkpoint"
        source.rollback(checkpoint)
        assert "after" not in {e.name for e in source.files.list("/root")}
        assert source.info.node in net.nodes and source.info.state == "running"
        assert 1 in {p.pid for p in source.commands.ps()}
        # A terminal: its output streams back from the node as it comes, input goes there.
        terminal = source.terminals.open(command=["sh", "-c", "read line; echo got-$line"])
        terminal.send("cluster\n")
        shown = b""
        while (chunk := terminal.read()) is not None:
            shown += chunk
        assert b"got-cluster" in shown and terminal.wait() == 0, shown
        with pytest.raises(ForkpointError, match="diff forks is not available on a cluster yet"):
            source.diff()

        async def through_mcp() -> list[str]:
            params = StdioServerParameters(
                command="ip", args=["netns", "exec", net.ns("head"), str(_FORKPOINT), "mcp"],
                env=net.env(),
            )  # fmt: skip
            async with Client(params) as client:
                result = await client.call_tool("list_sessions", {})
                assert not result.is_error, result.content
                ran = await client.call_tool(
                    "exec", {"session": made[1].id, "command": "echo from-mcp"}
                )
                assert not ran.is_error and "from-mcp" in str(ran.structured_content)
                sessions = (result.structured_content or {})["sessions"]
                return [str(s["id"]) for s in sessions]

        assert sorted(asyncio.run(through_mcp())) == sorted(m.id for m in made)
    finally:
        for sandbox in made:
            sandbox.kill()
        if checkpoint is not None:
            checkpoint.remove()
        server.terminate()
        server.communicate()
    assert net.json("ls") == []
    _holds(net, 0)


def _in_store(net: ClusterNet, key: str) -> bool:
    code = (
        "import sys; from forkpoint.cluster.connection import store_url; "
        "from forkpoint.runtime.checkpoints.portable.objects import S3Store; "
        "print(S3Store(store_url()).has(sys.argv[1]))"
    )
    return net.head(sys.executable, "-c", code, key).stdout.strip() == "True"


def test_the_e2b_gateway_serves_the_cluster(cluster: ClusterNet) -> None:
    """``forkpoint serve --e2b`` with ``FORKPOINT_CLUSTER`` set: the flagship E2B example,
    unmodified, with the real ``e2b`` SDK (create, a server reached through ``get_host``,
    fork ×3 at the same PID, pause and connect, rollback, kill) on sessions Ray placed;
    the sandboxes' rows in the cluster's store, gone with them."""
    net = cluster
    gateway = net.popen("serve", "--e2b", "--port", "3000")
    try:
        deadline = time.monotonic() + 60
        while net.head(
            "curl", "-s", "-o", "/dev/null", "http://127.0.0.1:3000/", check=False
        ).returncode:
            assert gateway.poll() is None, gateway.communicate()
            assert time.monotonic() < deadline, "the E2B gateway never listened"
            time.sleep(0.5)
        e2b_env = net.json("e2b", "env", "--port", "3000")
        example = Path(__file__).parents[1] / "examples" / "e2b_quickstart.py"
        ran = net.head(sys.executable, str(example), check=False, **e2b_env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        served = re.findall(r"^(fork )?(s-\w+)", ran.stdout, re.MULTILINE)
        assert len(served) == 4, ran.stdout  # the sandbox and its three forks answered
        # A directory watch streams from the node (async SDK: envd's WatchDir).
        watched = net.head(sys.executable, "-c", _WATCH, check=False, **e2b_env)
        assert watched.returncode == 0 and "seen.txt" in watched.stdout, watched.stderr
        # Its snapshot is the cluster's: the gateway's own host made nothing.
        snapshots = net.json("checkpoints")
        assert [c["session_id"] for c in snapshots] == [served[0][1]], snapshots
        assert _sandbox_rows(net) == []
    finally:
        gateway.terminate()
        gateway.communicate()
    net.cli("checkpoint", "rm", snapshots[0]["id"])
    assert net.json("ls") == []
    client = Store.open(Home(net.root / "client"))
    try:
        assert client.list_sessions() == [] and client.list_checkpoints() == []
    finally:
        client.close()
    refused = net.cli("serve", "--e2b", "--template-builds", check=False)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("error: E2B template builds are not available on a cluster")
    _holds(net, 0)


_WATCH = """
import asyncio
from e2b import AsyncSandbox

async def main():
    sbx = await AsyncSandbox.create(template="default", timeout=120)
    try:
        seen = []
        watch = await sbx.files.watch_dir("/root", on_event=lambda e: seen.append(e.name))
        await sbx.files.write("/root/seen.txt", "x")
        for _ in range(150):
            if "seen.txt" in seen:
                break
            await asyncio.sleep(0.2)
        await watch.stop()
        print(seen)
    finally:
        await sbx.kill()

asyncio.run(main())
"""


def _sandbox_rows(net: ClusterNet) -> list[str]:
    """The E2B sandbox rows in the cluster's store (listed by the client, which reaches it)."""
    code = (
        "from forkpoint.cluster.connection import store_url; "
        "from forkpoint.cluster.records import SandboxEntries; "
        "from forkpoint.runtime.checkpoints.portable.objects import S3Store; "
        "print(' '.join(r.session_id for r in SandboxEntries(S3Store(store_url())).list()))"
    )
    return net.head(sys.executable, "-c", code).stdout.split()


def test_forks_fetch_a_checkpoint_from_its_node_and_the_page_shows_them(
    cluster: ClusterNet,
) -> None:
    """A checkpoint taken with ``FORKPOINT_CLUSTER_PUSH=0`` is on its node only: forks
    spread over the cluster fetch it from there (not from the store; the node's archive
    of it is gone afterwards) and run its server at the same PID. ``forkpoint serve
    --port`` on the cluster prints the page's login and serves it: the real browser sees
    every session with its node and the cluster's room; screenshots of the session and
    its forks are taken through their nodes (their ports stay on the nodes' loopback) and
    compared in the grid."""
    net = cluster
    source = net.json("create", "--port", "8000", "--memory", "256")
    pid = _start_server(net, source["id"])
    taken = net.cli("checkpoint", source["id"], "--name", "kept", "--json",
                    FORKPOINT_CLUSTER_PUSH="0")  # fmt: skip
    checkpoint = json.loads(taken.stdout)["id"]
    forks = net.json("fork", "kept", "--count", "2", "--spread")
    ids = [source["id"], *(f["id"] for f in forks)]
    server = net.popen("serve", "--port", "8080")
    try:
        assert _in_store(net, f"refs/{checkpoint}") is False
        elsewhere = [f for f in forks if f["node"] != source["node"]]
        assert elsewhere, forks  # spread: fetched by another node
        _serves(net, elsewhere[0]["id"], pid)
        assert not list((net.home(source["node"]) / "cluster-exports").glob("*"))
        assert server.stdout is not None
        printed = [server.stdout.readline(), server.stdout.readline()]
        login = printed[1].removeprefix("page: ").strip()
        assert login.startswith("http://127.0.0.1:8080/ui/login?token="), printed
        seen = net.head(sys.executable, "-c", _PAGE, login, checkpoint, *ids, check=False)
        assert seen.returncode == 0, seen.stdout + seen.stderr
        page = json.loads(seen.stdout)
    finally:
        server.terminate()
        server.communicate()
        net.cli("rm", *ids)
        net.cli("checkpoint", "rm", "kept")
    rows = {row.split()[0]: row for row in page["rows"]}
    for session in [source, *forks]:
        node = session["node"]
        assert f"running on {node}" in rows[session["id"]], rows
        assert f"8000 on {node}" in rows[session["id"]], rows
    assert page["host"].startswith("sessions 3/"), page["host"]
    assert page["shots"] == [200] * 3, page["shots"]
    cells = {c["session"]: c for c in page["grid"]["cells"]}
    assert page["grid"]["parent"] == source["id"] and set(cells) == set(ids), page["grid"]
    for fork in forks:  # the same directory listing, served by each fork's own copy
        assert cells[fork["id"]]["shot"] is not None
        assert cells[fork["id"]]["differs"] < 0.01, cells[fork["id"]]
    assert net.json("ls") == []
    _holds(net, 0)


_PAGE = """
import json, sys
from playwright.sync_api import expect, sync_playwright
from forkpoint.browser.screenshot import CHROMIUM_ARGS, find_chromium

login, checkpoint, *sessions = sys.argv[1:]
with sync_playwright() as pw:
    browser = pw.chromium.launch(
        executable_path=str(find_chromium()), headless=True, args=list(CHROMIUM_ARGS)
    )
    page = browser.new_page()
    page.set_default_timeout(120_000)
    page.goto(login)
    for session in sessions:
        expect(page.locator("#sessions")).to_contain_text(session)
    expect(page.locator("#host")).to_contain_text("sessions 3/")
    shots = [
        page.evaluate(
            "async (s) => (await fetch(`/ui/shots/${s}?port=8000`,"
            " {method: 'POST', headers: {'X-Forkpoint-UI': '1'}})).status",
            session,
        )
        for session in sessions
    ]
    grid = page.evaluate(
        "async (c) => (await fetch(`/ui/grid?checkpoint=${c}&port=8000`)).json()", checkpoint
    )
    rows = page.locator("#sessions tr").all_inner_texts()
    print(json.dumps({"rows": rows, "host": page.locator("#host").inner_text(),
                      "shots": shots, "grid": grid}))
    browser.close()
"""


def test_auto_recover_revives_a_lost_session_without_asking(cluster: ClusterNet) -> None:
    """With the policy on (joining again turns it on), the node Ray moves a lost
    session's reservation to revives it on its own: same id, processes at the same PIDs."""
    net = cluster
    for node in net.nodes:
        assert net.join(node, "--ray-running", "--auto-recover")["auto_recover"] is True
    session = net.json("create", "--port", "8000", "--memory", "256")
    pid = _start_server(net, session["id"])
    net.json("checkpoint", session["id"], "--name", "auto")
    origin = session["node"]
    net.power_off(origin)
    deadline = time.monotonic() + 60
    while (now := net.json("show", session["id"]))["node"] == origin or now["state"] != "running":
        assert time.monotonic() < deadline, f"not revived on its own: {now}"
        time.sleep(1)
    assert now["id"] == session["id"] and now["node"] != origin
    _serves(net, session["id"], pid)
    joined = net.join(origin)  # back (its policy off: joined without it), its copy stale
    assert joined["removed_stale"] == [session["id"]] and joined["auto_recover"] is False
    net.cli("rm", session["id"])
    net.cli("checkpoint", "rm", "auto")
    assert net.json("ls") == []
    _holds(net, 0)


def test_a_head_restart_keeps_every_session_running(cluster: ClusterNet) -> None:
    """Ray's head lost and restarted without GCS fault tolerance (the cluster's Ray down
    with it): VMs keep running and serving on their nodes meanwhile; each node, joining the
    new head, keeps its sessions under its new Ray id — same id, same PID, its reservation
    made anew — and removes nothing."""
    net = cluster
    session = net.json("create", "--port", "8000", "--memory", "256")
    pid = _start_server(net, session["id"])
    node, vms = session["node"], net.vms(session["node"])
    forwarded = f"http://127.0.0.1:{session['ports'][0]['host_port']}/"
    net.restart_ray()
    assert net.vms(node) == vms  # the VM never stopped, and its guest served on its node:
    assert "Directory listing" in net.in_node(node, "curl", "-sf", "-m", "20", forwarded).stdout
    joined = {n: net.join(n) for n in net.nodes}
    assert joined[node]["readopted"] == [session["id"]], joined[node]
    assert all(j["removed_stale"] == [] for j in joined.values()), joined
    shown = net.json("show", session["id"])
    assert shown["state"] == "running" and shown["node"] == node, shown
    _serves(net, session["id"], pid)
    _holds(net, 1)
    net.cli("rm", session["id"])
    assert net.json("ls") == []
    _holds(net, 0)


def test_a_cluster_without_token_authentication_is_refused() -> None:
    """Guests run untrusted code: forkpoint never joins a Ray cluster anyone can drive."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["FORKPOINT_CLUSTER"] = "127.0.0.1:1"
    forkpoint = str(Path(sys.executable).with_name("forkpoint"))
    done = subprocess.run([forkpoint, "ls"], env=env, capture_output=True, text=True)
    assert done.returncode == 4, done.stderr
    assert done.stderr.startswith("error: forkpoint joins only a Ray cluster with token")
    assert "Traceback" not in done.stderr
    env.pop("FORKPOINT_CLUSTER")
    done = subprocess.run([forkpoint, "cluster", "status"], env=env, capture_output=True, text=True)
    assert done.returncode == 4 and "no cluster: give --address" in done.stderr, done.stderr


def test_one_host_use_never_loads_ray() -> None:
    """Without FORKPOINT_CLUSTER, the CLI's paths import no Ray."""
    import subprocess
    import sys

    code = (
        "import sys; from forkpoint.cli import core, app; app._register_all(); "
        "core.list_sessions(); print('ray' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_the_cluster_bench_needs_a_cluster() -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "FORKPOINT_CLUSTER"}
    done = subprocess.run(
        [str(_FORKPOINT), "bench", "--cluster"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --cluster measures a cluster: set FORKPOINT_CLUSTER")
