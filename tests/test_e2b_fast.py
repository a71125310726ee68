"""The E2B gateway against the real ``e2b`` SDK, without VMs: auth, errors, env, framing.

The gateway runs as ``forkpoint serve --e2b`` in a subprocess on a runtime home with no
sessions; the client is the unmodified ``e2b`` package.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import stat
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import certifi
import httpx
import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
)

from e2b_gateway import Gateway, free_port, running_gateway
from forkpoint.e2b.connect import ConnectError, end_stream, envelope, read_envelopes
from forkpoint.e2b.proxy import parse_host
from forkpoint.e2b.tls import SYSTEM_BUNDLES

UNKNOWN = "s-00000000ff"


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with running_gateway() as gw:
        yield gw


def test_wrong_api_key_is_401(gateway: Gateway) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-the-token").next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-the-token")
    response = httpx.get(f"{gateway.url}/v2/sandboxes")
    assert response.status_code == 401
    assert response.json()["code"] == 401


def test_list_is_empty(gateway: Gateway) -> None:
    paginator = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING]))
    assert paginator.next_items() == []
    assert not paginator.has_next


def test_unknown_sandbox_is_not_found(gateway: Gateway) -> None:
    with pytest.raises(NotFoundException):
        Sandbox.connect(UNKNOWN)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(UNKNOWN)
    assert Sandbox.kill(UNKNOWN) is False
    with pytest.raises(NotFoundException):
        Sandbox.set_timeout(UNKNOWN, 30)
    with pytest.raises(NotFoundException):
        Sandbox.pause(UNKNOWN)


def test_unknown_sandbox_async(gateway: Gateway) -> None:
    async def scenario() -> None:
        with pytest.raises(NotFoundException):
            await AsyncSandbox.connect(UNKNOWN)
        assert await AsyncSandbox.kill(UNKNOWN) is False
        assert await AsyncSandbox.list().next_items() == []

    asyncio.run(scenario())


def test_unknown_template_is_a_clear_error(gateway: Gateway) -> None:
    with pytest.raises(SandboxException, match="template 'no-such-template' not found"):
        Sandbox.create("no-such-template")


def test_bad_arguments_are_400(gateway: Gateway) -> None:
    headers = {"X-API-KEY": gateway.api_key}
    bad = httpx.post(f"{gateway.url}/v2/sandboxes", json={"timeout": -5}, headers=headers)
    assert bad.status_code == 400 and "timeout" in bad.json()["message"]
    fork = httpx.post(f"{gateway.url}/sandboxes/{UNKNOWN}/fork", json={"count": 0},
                      headers=headers)  # fmt: skip
    assert fork.status_code == 400
    for network in (
        {"allowOut": ["py_pi.org"]},
        {"maskRequestHost": "a\r\nb"},
        {"rules": {"api.example.com": [{"transform": {"body": "b"}}]}},
        {"rules": {"api.example.com": [{"transform": {"headers": {"A": "b\r\nC: d"}}}]}},
    ):
        bad = httpx.post(f"{gateway.url}/v2/sandboxes", json={"network": network},
                         headers=headers)  # fmt: skip
        assert bad.status_code == 400, bad.text
        assert "\n" not in bad.json()["message"]
    update = httpx.put(f"{gateway.url}/sandboxes/{UNKNOWN}/network", json={"denyOut": ["1.1.1.1"]},
                       headers=headers)  # fmt: skip
    assert update.status_code == 404
    metrics = httpx.get(f"{gateway.url}/sandboxes/{UNKNOWN}/metrics", params={"start": 10**20},
                        headers=headers)  # fmt: skip
    assert metrics.status_code == 400  # past any datetime: refused before the sandbox is looked up
    assert httpx.get(f"{gateway.url}/v2/sandboxes", headers=headers).json() == []


def test_envd_for_an_unknown_sandbox_is_not_running(gateway: Gateway) -> None:
    headers = {"E2b-Sandbox-Id": UNKNOWN, "X-Access-Token": "x"}
    health = httpx.get(f"{gateway.url}/health", headers=headers)
    assert health.status_code == 502 and "was not found" in health.json()["message"]
    rpc = httpx.post(f"{gateway.url}/process.Process/List", json={}, headers=headers)
    assert rpc.status_code == 502 and rpc.json()["code"] == "unavailable"
    unsigned = httpx.get(f"{gateway.url}/files", params={"path": "/etc/hostname"})
    assert unsigned.status_code == 400


def test_proxy_answers_for_unknown_and_foreign_hosts(gateway: Gateway) -> None:
    proxy = f"http://127.0.0.1:{gateway.proxy_port}"
    gone = httpx.get(proxy, headers={"Host": f"8000-{UNKNOWN}.localhost:{gateway.proxy_port}"})
    assert gone.status_code == 502 and "was not found" in gone.json()["message"]
    foreign = httpx.get(proxy, headers={"Host": "example.com"})
    assert foreign.status_code == 400
    # HTTP_PROXY mode: absolute-form targets, the API itself reachable through it.
    with httpx.Client(proxy=proxy) as client:
        via = client.get(f"http://8000-{UNKNOWN}.localhost:{gateway.proxy_port}/")
        assert via.status_code == 502
        api = client.get(f"{gateway.url}/v2/sandboxes", headers={"X-API-KEY": gateway.api_key})
        assert api.status_code == 200 and api.json() == []


def test_proxy_speaks_https_on_the_same_port_with_the_local_ca(gateway: Gateway) -> None:
    """TLS and plain HTTP on one port; the certificate is for the very host name, signed
    by the CA that the exported bundle (system CAs + forkpoint's) trusts."""
    host = f"8000-{UNKNOWN}.localhost:{gateway.proxy_port}"
    bundle = gateway.env["SSL_CERT_FILE"]
    with httpx.Client(verify=ssl.create_default_context(cafile=bundle)) as client:
        answer = client.get(f"https://{host}/")
    assert answer.status_code == 502 and "was not found" in answer.json()["message"]
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://{host}/", verify=ssl.create_default_context(cafile=certifi.where()))
    assert httpx.get(f"http://{host}/").status_code == 502  # plain HTTP still
    with socket.create_connection(("127.0.0.1", gateway.proxy_port)) as raw:
        context = ssl.create_default_context(cafile=bundle)
        with context.wrap_socket(raw, server_hostname=host.split(":")[0]) as tls:
            cert = tls.getpeercert()
    assert cert is not None and ("DNS", host.split(":")[0]) in cert["subjectAltName"]
    system = next((p for p in SYSTEM_BUNDLES if p.is_file()), None)
    if system is not None:  # the system's CAs are kept in the bundle
        assert Path(bundle).read_bytes().startswith(system.read_bytes().rstrip(b"\n"))


def test_env_works_on_a_fresh_home(tmp_path: Path) -> None:
    """Before any gateway ran: the token and the CA are made (keys 0600)."""
    env = {**os.environ, "FORKPOINT_HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", "e2b", "env", "--json"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout  # fmt: skip
    variables = json.loads(out)
    token = tmp_path / "home" / "token"
    assert variables["E2B_API_KEY"] == token.read_text().strip()
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    key = tmp_path / "home" / "tls" / "ca.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (
        Path(variables["SSL_CERT_FILE"])
        .read_bytes()
        .endswith((tmp_path / "home" / "tls" / "ca.pem").read_bytes())
    )


def test_a_gateway_on_a_fresh_home_has_its_key_before_it_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API key is written before the port accepts: a client connecting at once finds
    it (a CI run on a fresh home once read the key file too early)."""
    monkeypatch.setenv("FORKPOINT_HOME", str(tmp_path / "home"))
    with running_gateway() as fresh:  # reads the key as soon as the port accepts
        assert fresh.api_key == (tmp_path / "home" / "token").read_text().strip()
        listed = httpx.get(f"{fresh.url}/v2/sandboxes", headers={"X-API-KEY": fresh.api_key})
        assert listed.json() == []


def test_env_command_prints_the_variables(gateway: Gateway) -> None:
    def run(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "forkpoint.cli.app", "e2b", "env", *args],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    shell = run("--port", str(gateway.port), "--proxy-port", str(gateway.proxy_port))
    assert shell.splitlines() == [f"export {k}={v}" for k, v in gateway.env.items()]
    as_json = json.loads(run("--port", "4000", "--json"))
    assert as_json["E2B_API_URL"] == "http://127.0.0.1:4000"
    assert as_json["E2B_DOMAIN"] == "localhost:4001"
    assert as_json["E2B_API_KEY"] == gateway.api_key


def test_refuses_a_public_address() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "forkpoint.cli.app", "serve", "--e2b", "--host", "0.0.0.0",
         "--port", str(free_port())],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--allow-remote" in proc.stderr


def test_connect_framing_round_trip() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        data = envelope({"start": {"process": {"pid": 7}}}) + envelope({"keepalive": {}})
        data += end_stream() + envelope({"never": 1})
        for i in range(0, len(data), 3):  # split anywhere
            yield data[i : i + 3]

    async def collect() -> list[dict[str, object]]:
        return [m async for m in read_envelopes(chunks())]

    assert asyncio.run(collect()) == [{"start": {"process": {"pid": 7}}}, {"keepalive": {}}]
    flags, length = struct.unpack(">BI", end_stream(ConnectError("not_found", "x"))[:5])
    assert flags == 2 and length > 0


def test_parse_host() -> None:
    assert parse_host("8000-s-0123456789.localhost:3001") == (8000, "s-0123456789")
    assert parse_host("8000-s-0123456789.localhost") == (8000, "s-0123456789")
    assert parse_host("localhost:3001") is None
    assert parse_host("99999-s-0123456789.localhost") is None


def test_proxy_listens_on_ipv6_loopback_too(gateway: Gateway) -> None:
    if not socket.has_ipv6 or os.environ.get("FORKPOINT_NO_IPV6"):
        pytest.skip("no IPv6")
    try:
        socket.create_connection(("::1", gateway.proxy_port), timeout=2).close()
    except OSError as error:
        pytest.skip(f"no IPv6 loopback here: {error}")


def test_template_builds_are_off_unless_asked_and_bad_input_is_refused(gateway: Gateway) -> None:
    """Template builds run their steps as root on the host: a gateway serves them only with
    --template-builds. What every build route refuses, with one line each."""
    from e2b import BuildException, Template

    with pytest.raises(BuildException, match="template builds are off"):
        Template.build(Template().from_image("ubuntu:22.04").run_cmd("true"), "fp-off")
    key = {"X-API-KEY": gateway.api_key}
    status = httpx.get(f"{gateway.url}/templates/nope/builds/{UNKNOWN}/status", headers=key)
    assert status.status_code == 404 and "not found" in status.json()["message"]
    link = httpx.get(f"{gateway.url}/templates/nope/files/{'0' * 64}", headers=key)
    assert link.status_code == 404
    upload = httpx.put(f"{gateway.url}/template-files/{'0' * 64}?token=forged", content=b"x")
    assert upload.status_code == 403
    tags = httpx.post(
        f"{gateway.url}/templates/tags", headers=key, json={"target": "nope:v1", "tags": [":x"]}
    )
    assert tags.status_code == 400 and "invalid tag" in tags.json()["message"]
    assert not Template.exists("fp-off")
    listed = httpx.get(f"{gateway.url}/templates", headers=key).json()
    assert "fp-off" not in {name for t in listed for name in t["names"]}


def test_a_sandbox_past_its_timeout_is_gone_before_the_reaper_removes_it(
    tmp_path: Path,
) -> None:
    """Regression (the suite's test_shorten_timeout under load): ``is_running`` 1 s after
    the end answered True because the reaper, a round a second, had not removed the VM."""
    from dataclasses import replace

    from forkpoint.config import Home
    from forkpoint.e2b.sandboxes import GatewayConfig, Sandboxes
    from forkpoint.errors import NotFound
    from forkpoint.models import Expiry
    from forkpoint.runtime import Runtime
    from forkpoint.store import SessionRecord, SessionState, Store, utc_now
    from forkpoint.store.e2b import E2bSandboxRecord

    home = Home(tmp_path).ensure()
    runtime = Runtime(home, Store.open(home))
    try:
        sandboxes = Sandboxes(runtime, GatewayConfig())
        runtime.store.insert_layer("base.qcow2")
        ids = {}
        for name, ago, then in (("ended", 1.0, Expiry.REMOVE), ("living", -60.0, Expiry.REMOVE),
                                ("pausing", 1.0, Expiry.PAUSE)):  # fmt: skip
            new = SessionRecord.new(image="default", image_hash="ih", disk_layer="base.qcow2",
                                    memory_mib=512, cpus=1)  # fmt: skip
            record = runtime.store.insert_session(
                replace(new, state=SessionState.RUNNING, expires_at=utc_now(ago), on_expiry=then)
            )
            sandboxes.records.insert(
                E2bSandboxRecord(
                    session_id=record.id, access_token="t", template="base", started_at=0
                )  # fmt: skip
            )
            ids[name] = record.id
        with pytest.raises(NotFound):
            sandboxes.get(ids["ended"])
        assert sandboxes.get(ids["living"]).id == ids["living"]
        assert sandboxes.get(ids["pausing"]).id == ids["pausing"]  # paused, not gone
        assert sorted(s.id for s in sandboxes.all()) == sorted([ids["living"], ids["pausing"]])
    finally:
        runtime.close()
