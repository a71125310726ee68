"""Session lifetime (create --timeout, forkpoint timeout), the upkeep every CLI call and
the server's reaper run, and the disk use sessions and checkpoints report."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from cli_run import FORKPOINT, cli, cli_json, remove_sessions
from forkpoint.config import Home, home
from forkpoint.runtime.housekeeping.upkeep import expires_after, upkeep
from forkpoint.runtime.queries import Queries
from forkpoint.sdk import Sandbox
from forkpoint.store import SessionRecord, SessionState, Store
from forkpoint.vm.logcap import LOG_CAP_BYTES
from forkpoint.vm.process import is_running


def test_expiry_is_a_store_timestamp() -> None:
    assert expires_after(None) is None
    stamp = expires_after(90)
    assert stamp is not None and len(stamp) == len("2026-05-01T12:00:00.123Z")
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert 89 < (moment - datetime.now(UTC)).total_seconds() <= 90


@pytest.fixture
def queries(tmp_path: Path) -> Iterator[Queries]:
    h = Home(tmp_path / "home").ensure()
    with Store.open(h) as store:
        store.insert_layer("base.qcow2")
        yield Queries(h, store)


def _add(queries: Queries, state: SessionState, expires_at: str | None) -> SessionRecord:
    record = SessionRecord.new(
        image="default", image_hash="h", disk_layer="base.qcow2", memory_mib=512, cpus=1,
        state=state, expires_at=expires_at,
    )  # fmt: skip
    record = queries.store.insert_session(record)
    queries.files(record.id).dir.mkdir(parents=True)
    return record


def test_upkeep_removes_expired_sessions_and_trims_logs(queries: Queries) -> None:
    expired = _add(queries, SessionState.STOPPED, "2020-01-01T00:00:00.000Z")
    later = _add(queries, SessionState.STOPPED, expires_after(600))
    running = _add(queries, SessionState.RUNNING, None)
    log = queries.files(running.id).qemu_log
    log.write_bytes(b"guest-provoked device error\n" * (3 * LOG_CAP_BYTES // 28))
    assert upkeep(queries) == [expired.id]
    assert {r.id for r in queries.store.list_sessions()} == {later.id, running.id}
    assert not queries.files(expired.id).dir.exists()
    assert log.stat().st_size <= LOG_CAP_BYTES
    assert upkeep(queries) == []


# -- with real VMs ---------------------------------------------------------------------------


def _sse(
    client: httpx.Client, params: dict[str, str], headers: dict[str, str], count: int
) -> list[tuple[str, str, dict[str, object]]]:
    """The first ``count`` events of ``GET /v1/events/stream``: (id, kind, data)."""
    got: list[tuple[str, str, dict[str, object]]] = []
    with client.stream("GET", "/v1/events/stream", params=params, headers=headers) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in answer.iter_lines():
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if "data" in fields:
                got.append((fields["id"], fields["event"], json.loads(fields["data"])))
                if len(got) == count:
                    return got
            fields = {}
    raise AssertionError(f"the stream ended after {got}")


def _qemu_pid(session_id: str) -> int:
    with Store.open(home()) as store:
        pid = store.get_session(session_id).qemu_pid
    assert pid
    return pid


def _listed(command: str) -> set[str]:
    return {item["id"] for item in cli_json(command)}


@pytest.mark.vm
def test_disk_use_and_timeout_through_the_cli() -> None:
    s = cli_json("create", "--timeout", "600")
    try:
        assert s["expires_at"] > s["created_at"] and 0 < s["disk_bytes"] < 8 << 20
        shown = cli("show", s["id"]).stdout.decode()
        assert "expires" in shown and "used on the host" in shown
        cli("exec", s["id"], "--", "sh", "-c", "head -c 33554432 /dev/urandom > /big; sync")
        grown = cli_json("show", s["id"])["disk_bytes"]
        assert grown - s["disk_bytes"] >= 32 << 20
        checkpoint = cli_json("checkpoint", s["id"])
        (listed,) = [c for c in cli_json("checkpoints") if c["id"] == checkpoint["id"]]
        assert listed["disk_bytes"] >= max(checkpoint["size_bytes"], 32 << 20)
        # The data moved to the checkpoint's frozen layer; the session's own top is new.
        assert cli_json("show", s["id"])["disk_bytes"] < 8 << 20
        box = Sandbox.connect(s["id"])  # embedded: the REST app in this process
        try:
            box.set_timeout(120)  # REST POST /v1/sessions/{id}/timeout
            assert box.info.expires_at is not None and box.info.expires_at < s["expires_at"]
        finally:
            box.close()
        never = cli_json("timeout", s["id"], "never")
        assert never["expires_at"] is None
        pid = _qemu_pid(s["id"])
        cli("timeout", s["id"], "1")
        time.sleep(1.5)
        assert s["id"] not in _listed("ls")  # every CLI call removes expired sessions
        assert not is_running(pid, f"forkpoint-{s['id']}")
        assert checkpoint["id"] in _listed("checkpoints")  # kept
    finally:
        remove_sessions(s["id"])


@pytest.mark.vm
def test_pause_resume_and_a_lifetime_that_ends_in_a_pause() -> None:
    """One lifetime concept: a session created to pause at its timeout is paused by the
    next CLI call past it (a hidden ``pause`` checkpoint, the VM gone, no expiry left),
    and ``resume`` brings its processes back at the same PIDs. Removing it deletes the
    pause checkpoint nothing depends on."""
    s = cli_json("create", "--timeout", "600", "--on-timeout", "pause")
    try:
        assert s["on_expiry"] == "pause"
        pid = cli_json("exec", "-b", s["id"], "--", "sleep", "1000")["pid"]
        qemu = _qemu_pid(s["id"])
        cli_json("timeout", s["id"], "0")  # it ends now
        paused = cli_json("show", s["id"])  # this CLI call pauses it
        assert (paused["state"], paused["expires_at"]) == ("stopped", None)
        assert not is_running(qemu, f"forkpoint-{s['id']}")
        with Store.open(home()) as store:
            (hidden,) = store.list_checkpoints(session_id=s["id"])
        assert hidden.kind == "pause" and hidden.id not in _listed("checkpoints")
        assert "is stopped" in cli("pause", s["id"], code=4).stderr.decode()
        resumed = cli_json("resume", s["id"])
        assert resumed["state"] == "running" and resumed["ports"] == s["ports"]
        cli("exec", s["id"], "--", "kill", "-0", str(pid))  # the same process, same PID
        assert "not paused" in cli("resume", s["id"], code=4).stderr.decode()
        again = cli_json("pause", s["id"])
        assert again["state"] == "stopped"
        cli("rm", s["id"])
        with Store.open(home()) as store:
            assert store.list_checkpoints(session_id=s["id"]) == []
        # its life, as `forkpoint events` tells it (its events outlive it)
        told = cli_json("events", "--session", s["id"])
        assert [(e["kind"], e["detail"].get("then")) for e in told] == [
            ("created", None), ("expired", "pause"), ("resumed", None), ("paused", None),
            ("removed", None),
        ]  # fmt: skip
        assert told[2]["checkpoint"] == hidden.id  # resumed from its pause checkpoint
    finally:
        remove_sessions(s["id"])


@pytest.mark.vm
def test_a_filesystem_only_pause_boots_anew_from_the_disk() -> None:
    """Paused keeping only its disk, a session resumes by booting from it: same id and
    ports, its files as they were, a new kernel boot, none of its old processes. A
    lifetime can end in such a pause too."""
    s = cli_json("create", "--port", "8000")
    try:
        cli("exec", s["id"], "--", "sh", "-c", "echo persisted > /root/marker")
        boot_id = ["cat", "/proc/sys/kernel/random/boot_id"]
        before = cli("exec", s["id"], "--", *boot_id).stdout
        cli_json("exec", "-b", s["id"], "--", "sleep", "1000")
        paused = cli_json("pause", "--filesystem-only", s["id"])
        assert (paused["state"], paused["paused_on_disk"]) == ("stopped", True)
        with Store.open(home()) as store:  # no memory kept: no checkpoint of its own
            assert store.list_checkpoints(session_id=s["id"]) == []
        resumed = cli_json("resume", s["id"])
        assert (resumed["state"], resumed["paused_on_disk"]) == ("running", False)
        assert resumed["ports"] == s["ports"]
        assert cli("exec", s["id"], "--", "cat", "/root/marker").stdout == b"persisted\n"
        assert cli("exec", s["id"], "--", *boot_id).stdout != before
        running = cli("exec", s["id"], "--", "ps", "-eo", "args").stdout
        assert b"sleep 1000" not in running  # rebooted: its processes are gone
        kinds = [e["kind"] for e in cli_json("events", "--session", s["id"])]
        assert kinds == ["created", "paused", "resumed"]

        cli_json("timeout", s["id"], "0", "--on-timeout", "pause", "--filesystem-only")
        ended = cli_json("show", s["id"])  # this CLI call pauses it, disk only
        assert (ended["state"], ended["paused_on_disk"]) == ("stopped", True)
        assert cli_json("resume", s["id"])["state"] == "running"
        assert cli("exec", s["id"], "--", "cat", "/root/marker").stdout == b"persisted\n"
    finally:
        remove_sessions(s["id"])


@pytest.mark.vm
def test_the_server_reaper_removes_an_expired_session(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [*FORKPOINT, "serve", "--socket", str(tmp_path / "s")], stderr=subprocess.DEVNULL
    )
    try:
        s = cli_json("create", "--timeout", "3")
        pid = _qemu_pid(s["id"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with Store.open(home()) as store:  # the store alone: no upkeep of our own
                if s["id"] not in {r.id for r in store.list_sessions()}:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the server did not remove the expired session")
        removed_after = time.monotonic() - deadline + 30
        assert not is_running(pid, f"forkpoint-{s['id']}")
        print(f"removed ≈ {removed_after:.1f} s after create (timeout 3 s)")
        # followed as server-sent events; a reconnect resumes after Last-Event-ID
        transport = httpx.HTTPTransport(uds=str(tmp_path / "s"))
        with httpx.Client(transport=transport, base_url="http://forkpoint", timeout=30) as client:
            streamed = _sse(client, {"session": s["id"]}, {}, 2)
            assert [(kind, data["detail"]) for _, kind, data in streamed] == [
                ("created", {"image": "default"}),
                ("expired", {"then": "remove"}),
            ]
            resumed = _sse(client, {"session": s["id"]}, {"Last-Event-ID": streamed[0][0]}, 1)
            assert resumed == streamed[1:]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
