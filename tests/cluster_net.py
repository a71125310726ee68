"""A forkpoint cluster on this machine: a Ray head and three nodes, each in its own
network namespace with its own address, ``$FORKPOINT_HOME`` and jail, joined by a bridge
in a namespace of their own, plus a real S3 server (localbucket) in the head's
namespace. Every address is inside those namespaces; nothing touches the host's network.

Images are shared (each host would build them from the same recipe to the same hash);
everything else is per node. The client (the CLI) runs in the head's namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkpoint.config import home

__all__ = ["ClusterNet"]

_HUB = "fpc-hub"
_HEAD = "fpc-head"
_SUBNET = "10.231.0"
_HEAD_ADDRESS = f"{_SUBNET}.1"
_S3_PORT = 9000
_BIN = Path(sys.executable).parent


def _sh(*argv: str, check: bool = True, env: dict[str, str] | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, check=check, env=env, timeout=timeout
    )


def _in(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def _is_ray(pid: int) -> bool:
    """A process of Ray's (GCS, raylet, a worker, an agent), not a VM or its helpers."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[0].startswith(b"ray::") or any(b"/ray/" in a for a in argv[:3])


@dataclass
class ClusterNet:
    root: Path  # node homes and the bucket's files
    nodes: tuple[str, ...] = ("n1", "n2", "n3")
    slots: int = 6  # VMs a node offers
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    _store: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{_HEAD_ADDRESS}:6379"

    def ns(self, node: str) -> str:
        return f"fpc-{node}"

    def home(self, node: str) -> Path:
        return self.root / node

    def env(self, **extra: str) -> dict[str, str]:
        """The client's environment: the cluster, its token and its store."""
        env = dict(os.environ)
        env.update(
            RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, RAY_USAGE_STATS_ENABLED="0",
            FORKPOINT_CLUSTER=self.address, FORKPOINT_CLUSTER_STORE="s3://forkpoint/cluster",
            AWS_ENDPOINT_URL=f"http://{_HEAD_ADDRESS}:{_S3_PORT}", AWS_ACCESS_KEY_ID="local",
            AWS_SECRET_ACCESS_KEY="local", AWS_DEFAULT_REGION="us-east-1",
            FORKPOINT_HOME=str(self.root / "client"),
        )  # fmt: skip
        env.update(extra)
        return env

    # -- up and down -----------------------------------------------------------------------

    def start(self) -> None:
        self.stop()  # a run killed before its clean-up
        _sh("ip", "netns", "add", _HUB)
        _sh(*_in(_HUB, "ip", "link", "add", "br0", "type", "bridge"))
        _sh(*_in(_HUB, "ip", "link", "set", "lo", "up"))
        _sh(*_in(_HUB, "ip", "link", "set", "br0", "up"))
        for i, ns in enumerate([_HEAD, *map(self.ns, self.nodes)], start=1):
            _sh("ip", "netns", "add", ns)
            _sh(*_in(ns, "ip", "link", "set", "lo", "up"))
            _sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                "peer", f"hub{i}", "netns", _HUB)  # fmt: skip
            _sh(*_in(_HUB, "ip", "link", "set", f"hub{i}", "master", "br0", "up"))
            _sh(*_in(ns, "ip", "addr", "add", f"{_SUBNET}.{i}/24", "dev", "eth0"))
            _sh(*_in(ns, "ip", "link", "set", "eth0", "up"))
            if ns != _HEAD:  # passt needs a route out (to nowhere: the head forwards none)
                _sh(*_in(ns, "ip", "route", "add", "default", "via", _HEAD_ADDRESS))
        self._start_store()
        self._start_head()
        for node in self.nodes:
            self.join(node)

    def _start_store(self) -> None:
        data = self.root / "s3"
        data.mkdir(parents=True, exist_ok=True)
        serve = "import sys, localbucket; sys.exit(localbucket.main())"
        self._store = subprocess.Popen(
            _in(_HEAD, sys.executable, "-c", serve, "--host", _HEAD_ADDRESS,
                "--port", str(_S3_PORT), str(data)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        bucket = f"http://{_HEAD_ADDRESS}:{_S3_PORT}/forkpoint"
        deadline = time.monotonic() + 30
        while _sh(*_in(_HEAD, "curl", "-sf", "-X", "PUT", bucket), check=False).returncode:
            assert time.monotonic() < deadline, "the S3 server did not start"
            time.sleep(0.3)

    def _start_head(self) -> None:
        # Node deaths noticed within seconds (Ray's default takes about 15 s).
        health = {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000,
                  "health_check_failure_threshold": 3}  # fmt: skip
        _sh(*_in(_HEAD, str(_BIN / "ray"), "start", "--head", "--node-ip-address", _HEAD_ADDRESS,
                 "--port", "6379", "--num-cpus", "0", "--include-dashboard=false",
                 "--disable-usage-stats", "--system-config", json.dumps(health)),
            env=self.env())  # fmt: skip

    def join(self, node: str, *options: str) -> dict[str, Any]:
        """``forkpoint cluster join OPTIONS`` on ``node`` (by default its Ray node started
        by it)."""
        h = self.home(node)
        h.mkdir(parents=True, exist_ok=True)
        real = home().ensure().root
        for shared in ("images", "cache"):
            link = h / shared
            if not link.is_symlink():
                link.symlink_to(real / shared)
        done = _sh(*_in(self.ns(node), str(_BIN / "forkpoint"), "cluster", "join",
                        "--address", self.address, "--name", node, "--slots", str(self.slots),
                        "--cpus", str(self.slots), "--json", *options),
                   env=self.env(FORKPOINT_HOME=str(h)), check=False)  # fmt: skip
        assert done.returncode == 0, f"join {node} failed: {done.stdout}{done.stderr}"
        return dict(json.loads(done.stdout))

    def power_off(self, node: str) -> None:
        """The host is gone: every process in its namespace (raylet, workers, the
        daemon, its VMs) killed at once."""
        self._kill_all(self.ns(node))

    def restart_ray(self) -> None:
        """The cluster's Ray down and a new head up, as a head restarted without GCS
        fault tolerance leaves it: every Ray process killed — the head's (not the S3
        server beside it) and each node's raylet and workers, its daemon among them —
        while the hosts and their VMs stay; nodes join the new head anew."""
        for ns in [_HEAD, *map(self.ns, self.nodes)]:
            for pid in self.pids(ns):
                if pid != (self._store.pid if self._store else None) and _is_ray(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
        self._start_head()

    def in_node(self, node: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """A command in ``node``'s namespace (its own loopback)."""
        return _sh(*_in(self.ns(node), *argv), check=False)

    def _kill_all(self, ns: str) -> None:
        for pid in self.pids(ns):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def pids(self, ns: str) -> list[int]:
        return [int(p) for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]

    def vms(self, node: str) -> list[int]:
        """The QEMU processes running in ``node``'s namespace."""
        found = []
        for pid in self.pids(self.ns(node)):
            try:
                if Path(f"/proc/{pid}/exe").resolve().name.startswith("qemu-system"):
                    found.append(pid)
            except OSError:
                pass
        return found

    def stop(self) -> None:
        """Every process of every namespace killed, the namespaces gone."""
        namespaces = [_HEAD, *map(self.ns, self.nodes), _HUB]
        for ns in namespaces:
            if Path(f"/run/netns/{ns}").exists():
                self._kill_all(ns)
        for ns in namespaces:
            _sh("ip", "netns", "del", ns, check=False)
        if self._store is not None:
            self._store.kill()
            self._store.wait()

    def remove_files(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # -- the client ------------------------------------------------------------------------

    def cli(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        """``forkpoint ARGS`` as a client of the cluster (in the head's namespace)."""
        done = _sh(*_in(_HEAD, str(_BIN / "forkpoint"), *args), env=self.env(**env), check=False)
        if check:
            assert done.returncode == 0, f"forkpoint {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def ray_status(self) -> str:
        argv = _in(_HEAD, str(_BIN / "ray"), "status", "--address", self.address)
        return _sh(*argv, env=self.env()).stdout

    def head(self, *argv: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        """A command in the head's namespace (curl through a tunnel)."""
        return _sh(*_in(_HEAD, *argv), env=self.env(**env), check=check)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """``forkpoint ARGS`` left running (a tunnel, a server)."""
        return subprocess.Popen(
            _in(_HEAD, str(_BIN / "forkpoint"), *args), env=self.env(), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
