"""The REST API under schemathesis, reaching real guests: ``forkpoint serve`` on a fresh
home with the guest image, fuzzed by the ``schemathesis`` CLI with every check.

Two bounded runs: the stateless phases (examples, coverage, fuzzing), then the stateful
phase, which follows the spec's OpenAPI links from ``POST /v1/sessions``, forks and
checkpoints into exec, files, processes, ports, checkpoint, fork, rollback and rm. Then
the deep chains (history -> undo, checkpoint -> push -> pull, diff, a background process
killed) walked along the same links with fixed requests, so reaching them does not hang on
the time budget. Must show: 0 failures and 0 errors; every operation answered a 2xx at
least once (so a spec
without its links fails here: the session operations would see nothing but 404s); never
more running sessions than the server's cap (sampled from the home's store); nothing left
behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from forkpoint.config import Home, home
from forkpoint.models import SessionState
from s3_server import s3_server

pytestmark = pytest.mark.vm

FORKPOINT = Path(sys.executable).with_name("forkpoint")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CAP = 4  # FORKPOINT_API_MAX_SESSIONS of the fuzzed server (a diff adds a scratch fork)
HEAVY = 2  # FORKPOINT_API_MAX_HEAVY: one operation the fuzzer stopped waiting for, one more
RUNS = (("examples,coverage,fuzzing", 25), ("stateful", 60))  # phases, seconds each
UNREACHED_S = 20  # a unit run for operations the first one never got to, if any
FOCUSED_S = 30  # a last stateful run towards operations still without a 2xx, if any ...
FOCUSED_RUNS = 6  # ... while some are still missing (a loaded host gets fewer requests in)
_LIVE = (SessionState.RUNNING, SessionState.CREATING)
# Longer scenarios than the default 6 steps (create -> checkpoint -> fork -> exec -> ...),
# along the spec's own links only: links schemathesis infers from field names (any "id"
# into any "{session_id}") take turns from them and mostly end in 404s.
_CONFIG = """
[phases.stateful]
max-steps = 12
inference.algorithms = []

# A command that outlives its `timeout` answers 408 (CommandTimeout): documented, and a
# valid request's legitimate answer.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "408", "409", "429"]
"""
# The deep chains, walked deterministically along the spec's own links after the fuzzers
# (a fuzzer reaches them only as far as its time budget goes, and a slower release or a
# loaded host got fewer requests in). A chain starts with a request of its own; each next
# step follows a link named in the answer of an earlier step: (that step, link name, the
# body fields and query the link leaves to the client). A link the spec lacks or that
# leads to no 2xx fails the test.
_WAIT = {"wait": 8}  # a heavy call still running then answers 202: its operation is polled
_Link = tuple[int, str, dict[str, Any], dict[str, Any]]
_Chain = tuple[tuple[str, str, dict[str, Any]], list[_Link]]
_CHAINS: list[_Chain] = [
    # history -> undo: a session keeping history, a command (a step), its history, undo
    (
        ("POST", "/v1/sessions", {"history": True, "history_keep": 2}),
        [
            (0, "ExecCommand", {"command": ["true"]}, {}),
            (0, "History", {}, {}),
            (1, "Undo", {}, _WAIT),
        ],
    ),
    # checkpoint -> push -> pull, a diff since the checkpoint, then the checkpoint removed
    (
        ("POST", "/v1/sessions", {}),
        [
            (0, "Checkpoint", {}, _WAIT),
            (1, "PushCheckpoint", {"to": "$S3"}, {}),
            (2, "PullCheckpoint", {}, {}),
            (1, "DiffSince", {}, {}),
            (0, "RemoveSession", {}, {}),
            (1, "RemoveCheckpoint", {}, {}),
        ],
    ),
    # a pause, then a resume from the paused session's answer
    (
        ("POST", "/v1/sessions", {}),
        [(0, "Pause", {}, _WAIT), (1, "Resume", {}, _WAIT)],
    ),
    # a background process, then a signal to it
    (
        ("POST", "/v1/sessions", {}),
        [(0, "StartBackground", {}, {}), (1, "KillProcess", {}, {})],
    ),
    # a volume, a file and a directory in it, every operation on them, the volume removed
    # (no guest needed: the fuzzer's stateful turns are left to the session operations)
    (
        ("POST", "/v1/volumes", {"name": "fuzz-chain"}),
        [
            (0, "WriteVolumeFile", {}, {}),
            (0, "VolumeMakeDir", {}, {}),
            (0, "GetVolume", {}, {}),
            (1, "ReadVolumeFile", {}, {}),
            (1, "VolumeStat", {}, {}),
            (1, "VolumeSetMetadata", {"mode": 0o600}, {}),
            (2, "VolumeEntries", {}, {}),
            (1, "VolumeRemove", {}, {}),
            (0, "RemoveVolume", {}, {}),
        ],
    ),
]
# A terminal's output streams as long as its program runs (a login shell: until it exits),
# the events' as long as the client listens: a fuzzer's request would only time out.
# `_walk_streams` drives them instead.
STREAMS = ("open_terminal", "connect_terminal", "stream_events")
# Image builds and removals act on the image cache the test home shares with the real home
# (a fuzzed name would build a whole image, or remove one the user built): left out here,
# test_sdk.py drives them.
UNFUZZED = ("build_image", "remove_image")
HOOKS = Path(__file__).with_name("fuzz_hooks.py")  # use_after_free and ?path= (see there)


@dataclass
class Run:
    report: dict[str, Any]
    entries: list[dict[str, Any]]
    output: str


@dataclass
class Sampler:
    """Counts the home's running sessions every 0.1 s, on a thread."""

    home: Path
    peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from forkpoint.runtime import Runtime

        runtime = Runtime.open(Home(self.home))
        try:
            while not self._stop.wait(0.1):
                live = sum(s.state in _LIVE for s in runtime.list_sessions())
                self.peak = max(self.peak, live)
                self.samples += 1
        finally:
            runtime.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, Path]]:
    """A ``forkpoint serve --port 0`` on a fresh home sharing the image, next to a real S3
    server for pushes and pulls (its AWS_* variables reach the server): (url, token, home)."""
    with s3_server(tmp_path / "s3") as s3:
        monkeypatch.setenv("FORKPOINT_FUZZ_S3", s3.url("fuzz"))  # read by fuzz_hooks.py
        yield from _serve(tmp_path)


def _serve(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    fuzz_home = tmp_path / "home"
    fuzz_home.mkdir()
    for shared in ("images", "cache"):
        (fuzz_home / shared).symlink_to((home().root / shared).resolve())
    env = {
        **os.environ,
        "FORKPOINT_HOME": str(fuzz_home),
        "FORKPOINT_API_MAX_SESSIONS": str(CAP),
        "FORKPOINT_API_MAX_HEAVY": str(HEAVY),
    }
    proc = subprocess.Popen(
        [str(FORKPOINT), "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        match = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stderr.readline())
        assert match, "no address in forkpoint serve's banner"
        token = proc.stdout.readline().removeprefix("token: ").strip()
        yield f"http://127.0.0.1:{match.group(1)}", token, fuzz_home
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        _remove_sessions_directly(fuzz_home)


def _remove_sessions_directly(fuzz_home: Path) -> None:
    """Whatever a failed run left (VMs burn CPU), and the warm VMs the server started
    ahead (they outlive it by design; here, under the test home, they would be strays to
    the next test that checks the home's processes): removed through the runtime."""
    import asyncio

    from forkpoint.errors import ForkpointError
    from forkpoint.runtime import Runtime

    runtime = Runtime.open(Home(fuzz_home))
    try:
        runtime.warm.drain()
        for session in runtime.list_sessions():
            try:
                asyncio.run(runtime.remove(session.id))
            except ForkpointError:
                pass
    finally:
        runtime.close()


def _settle_and_clean(client: httpx.Client) -> None:
    """Wait for operations still running (a 202'd create would start a session later),
    then remove every session, user checkpoint and volume through the API."""
    deadline = time.monotonic() + 120
    while any(op["state"] == "running" for op in client.get("/v1/operations").json()):
        assert time.monotonic() < deadline, "operations still running after 120 s"
        time.sleep(0.5)
    for session in client.get("/v1/sessions").json():
        assert client.delete(f"/v1/sessions/{session['id']}").status_code in (204, 404)
    for _ in range(10):  # children before parents: a checkpoint in use answers 409
        left = [c for c in client.get("/v1/checkpoints").json() if c["kind"] == "user"]
        if not left:
            break
        for ck in left:
            client.delete(f"/v1/checkpoints/{ck['id']}")
    for volume in client.get("/v1/volumes").json():
        assert client.delete(f"/v1/volumes/{volume['id']}").status_code in (204, 404)
    assert client.get("/v1/sessions").json() == []


def _schemathesis(
    url: str, token: str, phases: str, seconds: int, out: Path, only: Collection[str] = ()
) -> Run:
    out.mkdir(parents=True)
    config = out / "schemathesis.toml"
    config.write_text(_CONFIG)
    command = [
        str(SCHEMATHESIS), "--config-file", str(config), "run", f"{url}/v1/openapi.json",
        "--header", f"Authorization: Bearer {token}",
        "--checks", "all", "--phases", phases, "--workers", "1",
        # above the longest wait an operation may be asked for (watcher_events: 60 s)
        "--max-time", str(seconds), "--request-timeout", "75",
        "--report", "json,har", "--report-dir", str(out),
    ]  # fmt: skip
    for operation_id in sorted(only):
        command += ["--include-operation-id", operation_id]
    for operation_id in (*STREAMS, *UNFUZZED):
        command += ["--exclude-operation-id", operation_id]
    result = subprocess.run(
        command, cwd=out, capture_output=True, text=True, timeout=seconds + 240,
        env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": str(HOOKS)},
    )  # fmt: skip
    (out / "output.txt").write_text(result.stdout + result.stderr)
    (report_file,) = out.glob("json-*.json")
    (har_file,) = out.glob("har-*.json")
    return Run(
        report=json.loads(report_file.read_text()),
        entries=json.loads(har_file.read_text())["log"]["entries"],
        output=result.stdout + result.stderr,
    )


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, re.Pattern[str]]]:
    """(method, path template, regex) for every operation, fewest parameters first."""
    found = []
    for path, item in spec["paths"].items():
        pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$")
        found += [
            (method.upper(), path, pattern)
            for method, op in item.items()
            if op.get("operationId") not in UNFUZZED
        ]
    return sorted(found, key=lambda op: op[1].count("{"))


def _tally(
    operations: list[tuple[str, str, re.Pattern[str]]], entries: list[dict[str, Any]]
) -> dict[str, Counter[int]]:
    """Statuses answered, per operation."""
    statuses: dict[str, Counter[int]] = {f"{m} {p}": Counter() for m, p, _ in operations}
    for entry in entries:
        method = entry["request"]["method"]
        path = httpx.URL(entry["request"]["url"]).path
        for op_method, template, pattern in operations:
            if op_method == method and pattern.match(path):
                statuses[f"{method} {template}"][entry["response"]["status"]] += 1
                break
    return statuses


def _without_2xx(statuses: dict[str, Counter[int]]) -> list[str]:
    return [op for op, seen in statuses.items() if not any(200 <= s < 300 for s in seen)]


def _leading_to(spec: dict[str, Any], targets: set[str]) -> set[str]:
    """``targets``, the operations linking straight to them, create (where every chain
    of links starts) and remove (without it the run fills the session cap in seconds and
    every create after that is a 429)."""
    links = [
        (op["operationId"], link["operationId"])
        for item in spec["paths"].values()
        for op in item.values()
        for response in op.get("responses", {}).values()
        for link in response.get("links", {}).values()
    ]
    sources = {source for source, target in links if target in targets}
    always = {"create_session", "remove_session"}
    return set(targets) | sources - {"list_sessions", "list_checkpoints"} | always


@dataclass
class _Step:
    operation: dict[str, Any]
    path: dict[str, str]
    query: dict[str, Any]
    status: str  # the answer's status; a 202's operation once it succeeded: its success's
    body: Any


def _resolve(expression: Any, step: _Step) -> Any:
    """An OpenAPI runtime expression (``$response.body#/..``, ``$request.path.x``,
    ``$request.query.x``) against an earlier step; anything else as it is."""
    if not isinstance(expression, str) or not expression.startswith("$"):
        return expression
    if expression.startswith("$response.body#"):
        value = step.body
        for part in expression.partition("#")[2].strip("/").split("/"):
            value = value[int(part)] if isinstance(value, list) else value[part]
        return value
    source, _, name = expression.removeprefix("$request.").partition(".")
    return {"path": step.path, "query": step.query}[source][name]


def _json(answer: httpx.Response) -> Any:
    return answer.json() if answer.content else None


def _until_done(client: httpx.Client, operation_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while (polled := client.get(f"/v1/operations/{operation_id}").json())["state"] == "running":
        assert time.monotonic() < deadline, f"operation {operation_id} still running"
        time.sleep(0.2)
    return dict(polled)


def _walk_chains(client: httpx.Client, spec: dict[str, Any], s3_url: str) -> list[dict[str, Any]]:
    """Walks :data:`_CHAINS`; returns HAR-like entries (method, url, status) to tally."""
    by_id = {
        op["operationId"]: (method.upper(), path, op)
        for path, item in spec["paths"].items()
        for method, op in item.items()
    }
    by_route = {(m, p): op for m, p, op in by_id.values()}
    entries: list[dict[str, Any]] = []

    def call(
        operation: dict[str, Any], method: str, template: str, path: dict[str, str],
        query: dict[str, Any], body: dict[str, Any] | None,
    ) -> _Step:  # fmt: skip
        url = template.format(**{k: str(v) for k, v in path.items()})
        answer = client.request(method, url, params=query, json=body)
        entries.append({"request": {"method": method, "url": str(answer.request.url)},
                        "response": {"status": answer.status_code}})  # fmt: skip
        assert answer.is_success, f"{method} {url}: {answer.status_code} {answer.text}"
        if answer.status_code != 202:
            return _Step(operation, path, query, str(answer.status_code), _json(answer))
        polled = _until_done(client, answer.json()["operation_id"])
        assert polled["state"] == "succeeded", f"{method} {url}: {polled}"
        success = min(
            code for code in operation["responses"] if code.startswith("2") and code != "202"
        )
        return _Step(operation, path, query, success, polled["result"])

    for (method, template, body), links in _CHAINS:
        steps = [call(by_route[(method, template)], method, template, {}, _WAIT, body)]
        for source, link_name, extra_body, extra_query in links:
            origin = steps[source]
            link = origin.operation["responses"][origin.status].get("links", {}).get(link_name)
            assert link, f"{origin.operation['operationId']} ({origin.status}) has no {link_name}"
            target_method, target, operation = by_id[link["operationId"]]
            params = {k: _resolve(v, origin) for k, v in link.get("parameters", {}).items()}
            in_path = set(re.findall(r"\{([^}]+)\}", target))
            path = {k: v for k, v in params.items() if k in in_path}
            query = {**{k: v for k, v in params.items() if k not in in_path}, **extra_query}
            request_body = {
                **{k: _resolve(v, origin) for k, v in (link.get("requestBody") or {}).items()},
                **{k: s3_url if v == "$S3" else v for k, v in extra_body.items()},
            }
            has_body = "requestBody" in operation
            steps.append(
                call(
                    operation,
                    target_method,
                    target,
                    path,
                    query,
                    request_body if has_body else None,
                )
            )
    return entries


def _walk_streams(client: httpx.Client) -> list[dict[str, Any]]:
    """A terminal's operations in order: opened (its stream's first line gives the pid,
    then the client hangs up: the program runs on), typed into, resized, re-attached,
    closed; the session's first event on the events' stream. Returns HAR-like entries to
    tally."""
    entries: list[dict[str, Any]] = []

    def note(answer: httpx.Response) -> httpx.Response:
        entries.append({"request": {"method": answer.request.method,
                                    "url": str(answer.request.url)},
                        "response": {"status": answer.status_code}})  # fmt: skip
        assert answer.is_success, f"{answer.request.url}: {answer.status_code}"
        return answer

    def first_line(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        with client.stream(method, url, json=body) as answer:
            note(answer)
            return json.loads(next(answer.iter_lines()))

    session = note(client.post("/v1/sessions", params={"wait": 8}, json={})).json()
    if "operation_id" in session:
        session = _until_done(client, session["operation_id"])["result"]
    terminals = f"/v1/sessions/{session['id']}/terminals"
    pid = first_line("POST", terminals, {"command": ["sh", "-c", "read line; sleep 60"]})["pid"]
    note(client.post(f"{terminals}/{pid}/input", json={"data": "aGkK"}))
    note(client.post(f"{terminals}/{pid}/size", json={"cols": 100, "rows": 30}))
    assert first_line("GET", f"{terminals}/{pid}") == {"kind": "start", "pid": pid}
    note(client.delete(f"{terminals}/{pid}"))
    with client.stream("GET", "/v1/events/stream", params={"session": session["id"]}) as events:
        note(events)
        assert next(events.iter_lines()).startswith("id: ")
    note(client.delete(f"/v1/sessions/{session['id']}"))
    return entries


def test_schemathesis_reaches_every_operation(served: tuple[str, str, Path]) -> None:
    url, token, fuzz_home = served
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as client:
        _fuzz(client, fuzz_home)


def _fuzz(client: httpx.Client, fuzz_home: Path) -> None:
    url, token = str(client.base_url).rstrip("/"), client.headers["authorization"].split()[-1]
    spec = client.get("/v1/openapi.json").json()
    # The template boots once, outside the fuzzers' time budget.
    warm = client.post("/v1/sessions", params={"wait": 8}, json={})
    assert warm.status_code in (201, 202), warm.text
    _settle_and_clean(client)  # waits for a 202'd create to end

    spec_ids = {
        f"{method.upper()} {path}": op["operationId"]
        for path, item in spec["paths"].items()
        for method, op in item.items()
    }
    sampler = Sampler(fuzz_home)
    started = time.monotonic()
    runs = []
    try:
        for phases, seconds in RUNS:
            runs.append(_schemathesis(url, token, phases, seconds, fuzz_home.parent / phases))
            _settle_and_clean(client)
        # The unit phases' time budget is shared: an operation with many cases (create's
        # egress fields) can spend it all, and what the run never reached gets its own.
        tallied = _tally(_operations(spec), [e for r in runs for e in r.entries])
        unreached = {spec_ids[op] for op, answered in tallied.items() if not answered}
        unreached -= set(STREAMS)  # walked below, never fuzzed
        if unreached:
            print(f"\nnot reached by the first runs, fuzzed on their own: {sorted(unreached)}")
            out = fuzz_home.parent / "unreached"
            runs.append(_schemathesis(url, token, RUNS[0][0], UNREACHED_S, out, unreached))
            _settle_and_clean(client)
        chained = _walk_chains(client, spec, os.environ["FORKPOINT_FUZZ_S3"])
        chained += _walk_streams(client)
        _settle_and_clean(client)
        # A stateful scenario picks among ~100 link rules; any operation can miss out by
        # chance. Short stateful runs follow only the links leading to what got no 2xx yet,
        # while anything is missing.
        for attempt in range(FOCUSED_RUNS):
            entries = [*chained, *(e for r in runs for e in r.entries)]
            missed = _without_2xx(_tally(_operations(spec), entries))
            if not missed:
                break
            only = _leading_to(spec, {spec_ids[op] for op in missed})
            out = fuzz_home.parent / f"stateful-focused-{attempt}"
            runs.append(_schemathesis(url, token, "stateful", FOCUSED_S, out, only))
            _settle_and_clean(client)
    finally:
        sampler.stop()
    duration = time.monotonic() - started

    statuses = _tally(_operations(spec), [*chained, *(e for run in runs for e in run.entries)])
    without_2xx = _without_2xx(statuses)
    requests = sum(len(run.entries) for run in runs)
    print(
        f"\nschemathesis: {len(statuses) - len(without_2xx)}/{len(statuses)} operations "
        f"answered 2xx, {requests} requests, "
        f"{sum(f['count'] for run in runs for f in run.report['failures'])} failures, "
        f"peak {sampler.peak} running sessions (cap {CAP}, {sampler.samples} samples), "
        f"{duration:.0f} s"
    )
    for op, seen in statuses.items():
        print(f"  {op}: {dict(sorted(seen.items()))}")

    for run in runs:
        assert run.report["failures"] == [], run.output[-6000:]
        assert run.report["errors"] == [], run.output[-6000:]
    assert not without_2xx, f"never answered 2xx: {without_2xx}"
    assert 0 < sampler.peak <= CAP, sampler.peak
    assert sampler.samples > 100
    assert client.get("/v1/sessions").json() == []
