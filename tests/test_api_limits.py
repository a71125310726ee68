"""The REST layer without VMs: admission limits (429 + Retry-After), long operations (202 +
an operation to poll, and the SDK polling it), schemas that state the real constraints,
Allow on 405, and the error mappings the fuzzer found (issue 18). A fake runtime stands in
for the real one: these are the server's rules, not the VMs'.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from forkpoint.agent_client._errors import error_from_agent
from forkpoint.config import ApiLimits
from forkpoint.errors import (
    Busy,
    CommandNotFound,
    Conflict,
    ForkpointError,
    GuestRefused,
    InvalidInput,
    LimitExceeded,
    NotFound,
    Unsatisfiable,
)
from forkpoint.models import Checkpoint, CheckpointKind, Network, Session, SessionState
from forkpoint.protocol import ErrorCode, ErrorInfo, Op
from forkpoint.runtime.admission import Admission
from forkpoint.runtime.hostfit import check_host_fits, host_memory_mib
from forkpoint.sdk._client import ApiClient
from forkpoint.server import create_app

SESSION = Session(
    id="s-0123456789", name=None, image="default", state=SessionState.RUNNING,
    created_at="2026-01-01T00:00:00.000Z", parent_checkpoint="c-0000000000", memory_mib=512,
    cpus=1, network=Network.USER,
)  # fmt: skip
CHECKPOINT = Checkpoint(
    id="c-0123456789", session_id=SESSION.id, name=None, kind=CheckpointKind.USER,
    created_at=SESSION.created_at, parent_checkpoint=None, image="default", size_bytes=1,
    duration_ms=1.0, pause_ms=1.0,
)  # fmt: skip


class FakeRuntime:
    """What the server calls, with each heavy call taking ``delay`` seconds."""

    def __init__(self, delay: float = 0.0, fail: ForkpointError | None = None) -> None:
        self.delay = delay
        self.fail = fail
        self.sessions: dict[str, Session] = {}
        self.started = 0

    async def _work(self) -> None:
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail

    def _new(self) -> Session:
        self.started += 1
        session = replace(SESSION, id=f"s-{self.started:010d}")
        self.sessions[session.id] = session
        return session

    async def create(self, **_: Any) -> Session:
        await self._work()
        return self._new()

    async def fork(
        self, checkpoint: str, count: int = 1, *, spread: bool = False
    ) -> list[Session | ForkpointError]:
        await self._work()
        return [self._new() for _ in range(count)]

    async def checkpoint(self, session: str, name: str | None = None) -> Checkpoint:
        await self._work()
        return CHECKPOINT

    async def rollback(self, session: str, checkpoint: str | None = None) -> Session:
        await self._work()
        return self.get(session)

    async def remove(self, session: str) -> None:
        self.get(session)
        del self.sessions[session]

    def list_sessions(self) -> list[Session]:
        return list(self.sessions.values())

    def get(self, session: str) -> Session:
        try:
            return self.sessions[session]
        except KeyError:
            raise NotFound(f"unknown session: {session}") from None

    def get_checkpoint(self, checkpoint: str) -> Checkpoint:
        if checkpoint != CHECKPOINT.id:
            raise NotFound(f"unknown checkpoint: {checkpoint}")
        return CHECKPOINT

    def diff_forks(self, a: str, b: str | None = None) -> int:
        return 0  # (not asked of this fake: no diffs here)

    def serve_long_lived(self, limits: ApiLimits) -> Admission:
        """The runtime's own policy, over this fake's sessions."""
        self.admission = Admission(limits, self)
        return self.admission


def sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an ``async def`` test on its own event loop."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def _client(runtime: FakeRuntime, **limits: Any) -> httpx.AsyncClient:
    app = create_app(runtime, limits=ApiLimits(**limits))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


async def _poll(client: httpx.AsyncClient, response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 202, response.text
    operation = response.json()
    assert response.headers["location"] == f"/v1/operations/{operation['operation_id']}"
    while operation["state"] == "running":
        await asyncio.sleep(0.01)
        answer = await client.get(response.headers["location"])
        assert answer.status_code == 200
        operation = answer.json()
    return dict(operation)


# -- admission ---------------------------------------------------------------------------


@sync
async def test_session_cap_answers_429_with_retry_after(runtime: FakeRuntime) -> None:
    async with _client(runtime, max_sessions=2) as client:
        for _ in range(2):
            assert (await client.post("/v1/sessions", json={})).status_code == 201
        refused = await client.post("/v1/sessions", json={})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["code"] == "busy"
        fork = await client.post(f"/v1/checkpoints/{CHECKPOINT.id}/fork", json={"count": 1})
        assert fork.status_code == 429
        await client.delete(f"/v1/sessions/{SESSION.id[:2]}0000000001")
        assert (await client.post("/v1/sessions", json={})).status_code == 201
    assert runtime.started == 3


@sync
async def test_fork_larger_than_the_cap_is_a_conflict(runtime: FakeRuntime) -> None:
    async with _client(runtime, max_sessions=3) as client:
        response = await client.post(f"/v1/checkpoints/{CHECKPOINT.id}/fork", json={"count": 4})
        assert response.status_code == 409
        assert "at most 3" in response.json()["error"]["message"]


@sync
async def test_heavy_operations_at_once_are_capped() -> None:
    runtime = FakeRuntime(delay=0.3)
    async with _client(runtime, max_heavy=2, max_sessions=10) as client:
        answers = await asyncio.gather(*(client.post("/v1/sessions", json={}) for _ in range(3)))
        assert sorted(a.status_code for a in answers) == [201, 201, 429]
        busy = next(a for a in answers if a.status_code == 429)
        assert busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["retry_after_s"] == 1.0
        # Slots are freed when operations end.
        assert (await client.post("/v1/sessions", json={})).status_code == 201


@sync
async def test_scratch_forks_count_as_sessions_but_take_no_heavy_slot() -> None:
    """A diff's or preview's scratch forks: against the session cap while it runs, never
    holding up a create or fork for a slot."""
    runtime = FakeRuntime()
    runtime._new()  # one session running
    admission = Admission(ApiLimits(max_sessions=3, max_heavy=1), runtime)
    diff = await admission.scratch(2)
    with pytest.raises(Busy, match="3 sessions are running or starting"):
        await admission.create()
    checkpoint, _ = await admission.checkpoint(SESSION.id[:2] + "0000000001")  # a slot free
    diff.release()
    preview = await admission.scratch(1)
    assert admission.heavy_running == 1
    checkpoint.release()
    preview.release()
    assert admission.heavy_running == 0


@sync
async def test_unknown_ids_are_404_before_any_429() -> None:
    runtime = FakeRuntime(delay=0.3)
    async with _client(runtime, max_heavy=1) as client:
        pending = asyncio.ensure_future(client.post("/v1/sessions", json={}))
        await asyncio.sleep(0.1)  # the only heavy slot is taken
        fork = await client.post("/v1/checkpoints/c-9999999999/fork", json={})
        assert fork.status_code == 404
        checkpoint = await client.post("/v1/sessions/s-9999999999/checkpoints", json={})
        assert checkpoint.status_code == 404
        assert (await pending).status_code == 201


@sync
async def test_operations_still_running_hold_their_sessions() -> None:
    """A create answered with 202 still counts against the cap until it ends."""
    runtime = FakeRuntime(delay=0.3)
    async with _client(runtime, max_sessions=1, max_heavy=4) as client:
        first = await client.post("/v1/sessions", params={"wait": 0}, json={})
        assert first.status_code == 202
        assert (await client.post("/v1/sessions", json={})).status_code == 429
        assert (await _poll(client, first))["state"] == "succeeded"


def test_busy_travels_with_its_retry_after() -> None:
    error = ForkpointError.from_dict(Busy("full", 5.0).to_dict())
    assert isinstance(error, Busy) and isinstance(error, Conflict)
    assert error.retry_after_s == 5.0
    assert error.http_status == 429 and error.exit_code == 4


# -- long operations ---------------------------------------------------------------------


@sync
async def test_slow_operations_become_operations_to_poll() -> None:
    runtime = FakeRuntime(delay=0.2)
    async with _client(runtime) as client:
        answer = await client.post(
            f"/v1/checkpoints/{CHECKPOINT.id}/fork", params={"wait": 0.05}, json={"count": 2}
        )
        assert answer.headers["retry-after"] == "1"
        operation = await _poll(client, answer)
        assert operation["kind"] == "fork"
        assert operation["target"] == CHECKPOINT.id
        assert [s["id"] for s in operation["result"]] == ["s-0000000001", "s-0000000002"]
        assert operation["finished_at"] is not None
        listed = (await client.get("/v1/operations")).json()
        assert [op["operation_id"] for op in listed] == [operation["operation_id"]]
        # Within the wait: the plain answer, and no operation is kept.
        direct = await client.post("/v1/sessions", params={"wait": 5}, json={})
        assert direct.status_code == 201
        assert len((await client.get("/v1/operations")).json()) == 1


@sync
async def test_a_failed_operation_carries_its_error() -> None:
    runtime = FakeRuntime(delay=0.1, fail=Conflict("nope"))
    runtime.sessions[SESSION.id] = SESSION
    async with _client(runtime) as client:
        answer = await client.post(
            f"/v1/sessions/{SESSION.id}/checkpoints", params={"wait": 0}, json={}
        )
        operation = await _poll(client, answer)
        assert operation["state"] == "failed"
        assert operation["error"]["code"] == "conflict"
        assert (await client.get("/v1/operations/op-0000000000")).status_code == 404


@pytest.mark.parametrize("wait", [-1, 8.5])
@sync
async def test_wait_is_bounded(runtime: FakeRuntime, wait: float) -> None:
    async with _client(runtime) as client:
        response = await client.post("/v1/sessions", params={"wait": wait}, json={})
        assert response.status_code == 422


@sync
async def test_sdk_polls_operations_transparently() -> None:
    runtime = FakeRuntime(delay=0.3)
    client = ApiClient(runtime=runtime)  # type: ignore[arg-type]
    client._http._transport = httpx.ASGITransport(  # the server bound: 0.05 s
        app=create_app(runtime, limits=ApiLimits(wait_s=0.05))  # type: ignore[arg-type]
    )
    client.retain()
    try:
        session = await client.create()
        assert session.id == "s-0000000001"
        forks = await client.fork(CHECKPOINT.id, 2)
        assert [f.id for f in forks if isinstance(f, Session)] == ["s-0000000002", "s-0000000003"]
        runtime.fail = GuestRefused("guest says no")
        with pytest.raises(GuestRefused, match="guest says no"):
            await client.checkpoint(session.id, None)
    finally:
        await client.release()


# -- schemas and Allow -------------------------------------------------------------------


def _with_session(runtime: FakeRuntime) -> httpx.AsyncClient:
    runtime.sessions[SESSION.id] = SESSION
    return _client(runtime)


@sync
async def test_allow_lists_every_method_of_the_path(runtime: FakeRuntime) -> None:
    async with _with_session(runtime) as client:
        for path, allowed in [
            ("/v1/sessions", "GET, POST"),
            (f"/v1/sessions/{SESSION.id}", "DELETE, GET"),
            (f"/v1/sessions/{SESSION.id}/files", "DELETE, GET, PUT"),
        ]:
            response = await client.patch(path)
            assert response.status_code == 405
            assert response.headers["allow"] == allowed


@pytest.mark.parametrize(
    "body",
    [
        {"command": "true", "background": True, "stdin": "x"},
        {"command": "true", "background": True, "timeout": 1},
        {"command": [""]},
        {"command": "a\x00b"},
        {"command": "true", "cwd": "relative"},
        {"command": "true", "env": {"A=B": "c"}},
        {"command": "true", "stdin": "not base64!", "stdin_encoding": "base64"},
        5,  # not an object at all (was a 500: the union's discriminator read .background)
        ["command"],
    ],
)
@sync
async def test_exec_schema_states_the_constraints(runtime: FakeRuntime, body: object) -> None:
    async with _with_session(runtime) as client:
        response = await client.post(f"/v1/sessions/{SESSION.id}/exec", json=body)
        assert response.status_code == 422, response.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "relative/file"),
        ("PUT", "x"),
        ("GET", ""),
        ("DELETE", "/"),
        ("DELETE", "//"),
    ],
)
@sync
async def test_guest_paths_are_absolute(runtime: FakeRuntime, method: str, path: str) -> None:
    async with _with_session(runtime) as client:
        response = await client.request(
            method, f"/v1/sessions/{SESSION.id}/files", params={"path": path}
        )
        assert response.status_code == 422, response.text


@sync
async def test_refs_and_ports_are_checked(runtime: FakeRuntime) -> None:
    async with _with_session(runtime) as client:
        assert (await client.get("/v1/sessions/not a name")).status_code == 422
        duplicate = await client.post("/v1/sessions", json={"ports": [80, 80]})
        assert duplicate.status_code == 422
        assert "twice" in duplicate.json()["error"]["message"]
        kill = await client.delete(
            f"/v1/sessions/{SESSION.id}/processes/5", params={"signal": "NOPE"}
        )
        assert kill.status_code == 422


@sync
async def test_spec_links_every_new_id_to_its_operations(runtime: FakeRuntime) -> None:
    async with _with_session(runtime) as client:
        spec = (await client.get("/v1/openapi.json")).json()
        create = spec["paths"]["/v1/sessions"]["post"]["responses"]
        targets = {link["operationId"] for link in create["201"]["links"].values()}
        session_ops = {
            op["operationId"]
            for path, item in spec["paths"].items()
            if path.startswith("/v1/sessions/{session_id}")
            for op in item.values()
        }
        # Their pid comes from exec's answer, or from a terminal's stream (no link can say
        # so); a terminal's stream lasts as long as its program: not for a fuzzer to follow.
        terminals = {"open_terminal", "connect_terminal", "type_into_terminal",
                     "resize_terminal", "close_terminal"}  # fmt: skip
        watcher_ops = {"watcher_events", "remove_watcher"}  # linked from create_watcher
        assert session_ops - targets == {"kill_process", *terminals, *watcher_ops}
        watch = spec["paths"]["/v1/sessions/{session_id}/watchers"]["post"]["responses"]
        links = watch["201"]["links"].values()
        assert {link["operationId"] for link in links} == watcher_ops
        assert {link["parameters"]["watcher_id"] for link in links} == {"$response.body#/id"}
        exec_links = spec["paths"]["/v1/sessions/{session_id}/exec"]["post"]["responses"]["200"]
        assert exec_links["links"]["KillProcess"]["parameters"]["pid"] == "$response.body#/pid"
        assert "202" in create and "429" in create
        body = spec["paths"]["/v1/sessions/{session_id}/exec"]["post"]["requestBody"]
        assert "oneOf" in str(body) or "anyOf" in str(body) or "$ref" in str(body)


# -- error mappings ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "code", "expected", "status"),
    [
        (Op.READ_FILE, ErrorCode.INVALID_INPUT, GuestRefused, 409),
        (Op.REMOVE, ErrorCode.IO_ERROR, GuestRefused, 409),
        (Op.EXEC, ErrorCode.PERMISSION_DENIED, GuestRefused, 409),
        (Op.EXEC, ErrorCode.NOT_FOUND, CommandNotFound, 409),
        (Op.SPAWN, ErrorCode.NOT_FOUND, CommandNotFound, 409),
        (Op.READ_FILE, ErrorCode.NOT_FOUND, NotFound, 404),
    ],
)
def test_what_the_guest_refuses_is_not_a_bad_request(
    op: Op, code: ErrorCode, expected: type[ForkpointError], status: int
) -> None:
    error = error_from_agent(op, ErrorInfo(code=code, message="m"))
    assert type(error) is expected
    assert error.http_status == status
    # Callers that caught the old classes still do.
    assert isinstance(error, InvalidInput | NotFound)


def test_shapes_larger_than_the_host_are_refused_up_front(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  2097152 kB\nSwapTotal: 1048576 kB\nMemFree: 1 kB\n")
    assert host_memory_mib(meminfo) == 3072
    with pytest.raises(Conflict, match="more than this host has"):
        check_host_fits(host_memory_mib() + 1, 1)
    with pytest.raises(Conflict, match="CPUs"):
        check_host_fits(128, 10_000)
    check_host_fits(128, 1)


def test_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKPOINT_API_MAX_SESSIONS", "3")
    monkeypatch.setenv("FORKPOINT_API_WAIT", "0.5")
    limits = ApiLimits.from_env()
    assert (limits.max_sessions, limits.wait_s) == (3, 0.5)
    monkeypatch.setenv("FORKPOINT_API_MAX_HEAVY", "lots")
    with pytest.raises(InvalidInput, match="FORKPOINT_API_MAX_HEAVY"):
        create_app(FakeRuntime())  # type: ignore[arg-type]
    monkeypatch.setenv("FORKPOINT_API_MAX_HEAVY", "1")
    monkeypatch.setenv("FORKPOINT_API_WAIT", "60")
    with pytest.raises(InvalidInput, match="FORKPOINT_API_WAIT"):
        create_app(FakeRuntime())  # type: ignore[arg-type]


@sync
async def test_a_client_that_hangs_up_leaves_the_slot_to_the_work() -> None:
    runtime = FakeRuntime(delay=0.3)
    async with _client(runtime, max_heavy=1) as client:
        request = asyncio.ensure_future(client.post("/v1/sessions", json={}))
        await asyncio.sleep(0.1)
        request.cancel()  # the client goes away mid-wait
        await asyncio.sleep(0)
        busy = await client.post("/v1/sessions", json={})
        assert busy.status_code == 429  # the create still runs, and holds its slot
        await asyncio.sleep(0.4)
        assert runtime.started == 1
        assert (await client.post("/v1/sessions", json={})).status_code == 201


@sync
async def test_the_runtimes_own_limit_is_a_429_too() -> None:
    """LimitExceeded (FORKPOINT_MAX_SESSIONS, the disk reserve) is a Busy: 429, Retry-After."""
    runtime = FakeRuntime(fail=LimitExceeded("FORKPOINT_MAX_SESSIONS=32 reached"))
    async with _client(runtime) as client:
        refused = await client.post("/v1/sessions", json={})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["code"] == "limit_exceeded"
    assert LimitExceeded("x").exit_code == 4


def test_what_exists_cannot_satisfy_is_409_and_still_invalid_input() -> None:
    error = Unsatisfiable("--disk 1 MiB is smaller than image default's disk")
    assert isinstance(error, InvalidInput) and error.exit_code == 2
    assert error.http_status == 409
