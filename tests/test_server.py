"""``forkpoint serve`` as a real subprocess: socket permissions, error shapes, body caps,
loopback-only TCP with a bearer token, and schemathesis fuzzing (no 5xx for any input).

No VM is started here: the servers run on an empty ``$FORKPOINT_HOME`` (no image), so
even a valid create stops at "no image" (404).
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from forkpoint.errors import InvalidInput
from forkpoint.store import validate_name

FORKPOINT = Path(sys.executable).with_name("forkpoint")


@dataclass
class Served:
    proc: subprocess.Popen[str]
    home: Path
    client: httpx.Client
    socket: Path | None = None
    port: int | None = None
    token: str | None = None


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "FORKPOINT_HOME": str(home)}


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=15)  # also closes the pipes
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def _wait_healthy(
    client: httpx.Client, proc: subprocess.Popen[str], sock: Path | None = None
) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.communicate()}")
        if sock is not None and not sock.exists():
            # The server listens as soon as the file exists (it binds, then listens).
            time.sleep(0.1)
            continue
        try:
            if client.get("/v1/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("server did not answer within 30 s")


@pytest.fixture(scope="module")
def unix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("srv")
    sock = tmp / "api.sock"
    proc = subprocess.Popen(
        [str(FORKPOINT), "serve", "--socket", str(sock)],
        env=_env(tmp / "home"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://forkpoint", timeout=30
    )
    try:
        _wait_healthy(client, proc, sock)
        yield Served(proc, tmp / "home", client, socket=sock)
    finally:
        client.close()
        _stop(proc)
    assert not sock.exists(), "the socket file is removed on shutdown"


@pytest.fixture(scope="module")
def tcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("tcp")
    proc = subprocess.Popen(
        [str(FORKPOINT), "serve", "--port", "0"],
        env=_env(tmp / "home"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        banner = proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", banner)
        assert match, f"no address in {banner!r}"
        port = int(match.group(1))
        token_line = proc.stdout.readline()
        assert token_line.startswith("token: "), token_line
        token = token_line.removeprefix("token: ").strip()
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        try:
            _wait_healthy(client, proc)
            yield Served(proc, tmp / "home", client, port=port, token=token)
        finally:
            client.close()
    finally:
        _stop(proc)


def _error(response: httpx.Response) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message"}, body
    assert body["error"]["message"]
    return dict(body["error"])


# -- unix socket ---------------------------------------------------------------------


def test_socket_is_private(unix_server: Served) -> None:
    assert unix_server.socket is not None
    st = unix_server.socket.lstat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600


def test_unknown_ids_are_404_with_error_shape(unix_server: Served) -> None:
    c = unix_server.client
    for method, url in [
        ("GET", "/v1/sessions/s-0000000000"),
        ("DELETE", "/v1/sessions/nope"),
        ("GET", "/v1/sessions/nope/processes"),
        ("GET", "/v1/sessions/nope/files?path=/etc/hostname"),
        ("GET", "/v1/checkpoints/c-0000000000"),
        ("DELETE", "/v1/checkpoints/nope"),
    ]:
        response = c.request(method, url)
        assert response.status_code == 404, (method, url, response.text)
        assert _error(response)["code"] == "not_found"
    response = c.post("/v1/sessions/nope/rollback", json={})
    assert response.status_code == 404
    response = c.post("/v1/checkpoints/nope/fork", json={"count": 2})
    assert response.status_code == 404
    assert c.get("/v1/no-such-route").status_code == 404
    assert c.get("/v1/sessions").json() == []


def test_events_take_their_query_string_and_wait_for_the_next(unix_server: Served) -> None:
    c = unix_server.client
    events = c.get("/v1/events", params={"after": 0, "limit": 1000, "wait": 0}).json()
    last = events[-1]["id"] if events else 0
    started = time.monotonic()
    assert c.get("/v1/events", params={"after": last, "wait": "0.5"}).json() == []
    assert time.monotonic() - started >= 0.5  # a long poll: it waited for one
    too_big = str(2**63)  # past SQLite's INTEGER: refused, not an overflow inside
    for bad in (
        {"after": "-1"},
        {"after": too_big},
        {"limit": "0"},
        {"wait": "61"},
        {"session": "bad name!"},
    ):
        answer = c.get("/v1/events", params=bad)
        assert answer.status_code == 422, (bad, answer.text)
        assert "\n" not in _error(answer)["message"]
    assert c.get("/v1/events/stream", params={"after": too_big}).status_code == 422


def test_a_bodyless_post_takes_the_defaults_and_a_wrong_body_is_refused(
    unix_server: Served,
) -> None:
    c = unix_server.client
    assert c.post("/v1/sessions/s-0000000000/pause").status_code == 404  # no body: defaults
    assert c.post("/v1/sessions/s-0000000000/pause", json={"keep_memory": "no"}).status_code == 422


def test_malformed_json_is_4xx(unix_server: Served) -> None:
    response = unix_server.client.post(
        "/v1/sessions", content=b'{"image": ', headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500
    assert _error(response)["code"] == "invalid_input"
    response = unix_server.client.post("/v1/sessions", json=["not", "an", "object"])
    assert response.status_code == 422


def test_oversized_json_is_413(unix_server: Served) -> None:
    big = b'{"image": "' + b"a" * (2 << 20) + b'"}'
    response = unix_server.client.post(
        "/v1/sessions", content=big, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert _error(response)["code"] == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the streaming cap applies
        yield b'{"image": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'

    response = unix_server.client.post(
        "/v1/sessions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/v1/sessions/x/ports", {"guest_port": 70000}),
        ("/v1/sessions/x/ports", {"guest_port": 0}),
        ("/v1/sessions", {"memory_mib": 1}),
        ("/v1/sessions", {"ports": [65536]}),
        ("/v1/sessions", {"name": "../etc"}),
        ("/v1/sessions", {"unknown_field": 1}),
        ("/v1/checkpoints/x/fork", {"count": 129}),
        ("/v1/checkpoints/x/fork", {"count": 0}),
        ("/v1/sessions/x/exec", {"command": []}),
        ("/v1/sessions/x/exec", {"command": "true", "timeout": -1}),
        # JSON's true is no number and 1 no flag (pydantic's lax mode took both; the API
        # fuzzer found {"timeout_s": true} answered 200)
        ("/v1/sessions/x/timeout", {"timeout_s": True}),
        ("/v1/sessions/x/ports", {"guest_port": True}),
        ("/v1/sessions", {"memory_mib": True}),
        ("/v1/sessions", {"memory_mib": "512"}),
        ("/v1/sessions", {"history": 1}),
        ("/v1/checkpoints/x/fork", {"count": True}),
        ("/v1/sessions/x/undo", {"steps": True}),
        # a flag is a JSON boolean in the exec union too (the fuzzer's {"background": 0})
        ("/v1/sessions/x/exec", {"command": "true", "background": 0}),
        ("/v1/sessions/x/exec", {"command": "true", "background": 1}),
    ],
)
def test_bad_input_is_422(unix_server: Served, url: str, body: dict[str, object]) -> None:
    response = unix_server.client.post(url, json=body)
    assert response.status_code == 422, response.text
    assert _error(response)["code"] == "invalid_input"


def test_create_without_image_is_404(unix_server: Served) -> None:
    response = unix_server.client.post("/v1/sessions", json={"image": "nothing-here"})
    assert response.status_code == 404
    assert "forkpoint image build" in _error(response)["message"]


def test_pull_is_no_checkpoint_id(unix_server: Served) -> None:
    """``/v1/checkpoints/pull`` is pull's route alone: the checkpoint routes do not take
    ``pull`` as an id (the API fuzzer saw OPTIONS answer "Allow: DELETE, GET, POST")."""
    for method in ("OPTIONS", "GET", "DELETE"):
        response = unix_server.client.request(method, "/v1/checkpoints/pull")
        assert response.status_code == 405, (method, response.text)
        assert response.headers["allow"] == "POST"
    spec = unix_server.client.get("/v1/openapi.json").json()
    assert set(spec["paths"]["/v1/checkpoints/{checkpoint_id}"]) == {"get", "delete"}
    # and so no checkpoint may be named so
    with pytest.raises(InvalidInput, match="reserved"):
        validate_name("pull", "checkpoint")
    assert validate_name("pull", "session") == "pull"


def test_openapi_is_served(unix_server: Served) -> None:
    spec = unix_server.client.get("/v1/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    paths = spec["paths"]
    for path in [
        "/v1/sessions",
        "/v1/sessions/{session_id}",
        "/v1/sessions/{session_id}/exec",
        "/v1/sessions/{session_id}/files",
        "/v1/sessions/{session_id}/files/list",
        "/v1/sessions/{session_id}/ports",
        "/v1/sessions/{session_id}/checkpoints",
        "/v1/sessions/{session_id}/rollback",
        "/v1/checkpoints",
        "/v1/checkpoints/{checkpoint_id}/fork",
    ]:
        assert path in paths, path


# -- listening rules -----------------------------------------------------------------


def test_non_loopback_host_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(FORKPOINT), "serve", "--port", "0", "--host", "0.0.0.0"],
        env=_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--allow-remote" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_socket_and_port_are_exclusive(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(FORKPOINT), "serve", "--port", "0", "--socket", str(tmp_path / "s")],
        env=_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2


def test_tcp_needs_the_token(tcp_server: Served) -> None:
    c, token = tcp_server.client, tcp_server.token
    assert c.get("/v1/health").status_code == 200  # liveness stays open
    response = c.get("/v1/sessions")
    assert response.status_code == 401
    assert _error(response)["code"] == "unauthorized"
    wrong = c.get("/v1/sessions", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert c.get("/v1/openapi.json").status_code == 401
    ok = c.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    assert ok.json() == []
    token_file = tcp_server.home / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.read_text().strip() == token


def _listeners(proc_file: str, port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) listening on ``port``."""
    found = []
    for line in Path(proc_file).read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        address, _, hex_port = local.rpartition(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(address)
    return found


def test_tcp_binds_loopback_only(tcp_server: Served) -> None:
    assert tcp_server.port is not None
    assert _listeners("/proc/net/tcp", tcp_server.port) == ["0100007F"]  # 127.0.0.1
    if Path("/proc/net/tcp6").exists():
        assert _listeners("/proc/net/tcp6", tcp_server.port) == []


# -- fuzzing -------------------------------------------------------------------------


def test_schemathesis_finds_no_5xx(tcp_server: Served) -> None:
    """Every operation, schema-valid and schema-violating input: never a 5xx."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.core.result import Ok

    headers = {"Authorization": f"Bearer {tcp_server.token}"}
    base = f"http://127.0.0.1:{tcp_server.port}"
    schema = schemathesis.openapi.from_url(f"{base}/v1/openapi.json", headers=headers)
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        operations += 1
        if operation.label in ("GET /v1/events/stream", "GET /v1/events"):
            # a stream for as long as the client listens, and a long poll of up to 60 s:
            # test_api_fuzz.py fuzzes the latter with a timeout above its longest wait
            continue
        if operation.label in ("POST /v1/images", "DELETE /v1/images/{image}"):
            continue  # the shared image cache: a fuzzed name builds or removes an image
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @settings(
                max_examples=5 if mode == schemathesis.GenerationMode.POSITIVE else 3,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case: schemathesis.Case[Any]) -> None:
                response = case.call(base_url=base, headers=headers, timeout=30)
                if response.status_code >= 500:
                    failures.append(
                        f"{case.method} {case.formatted_path} -> {response.status_code}: "
                        f"{response.text[:300]}"
                    )

            try:
                check()
            except Unsatisfiable:
                # No input can violate a schema without parameters (GET /v1/sessions).
                assert mode == schemathesis.GenerationMode.NEGATIVE
    assert operations >= 15
    assert not failures, "\n".join(failures)
