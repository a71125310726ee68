"""Fork-aware guests on real VMs: a process that asked is told of every restore (its
signal, once), one that did not is left alone; restore hooks run with the event in their
environment and a hanging one is killed at its limit; ``forkpoint_guest.reseed`` makes
forks of one checkpoint draw different random numbers — and without it they draw the
same ones, which is the problem this solves."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkpoint.models import EventKind, GuestRestore, Session
from forkpoint.runtime import Runtime
from forkpoint.vm import Machine
from vm_checks import read_port

pytestmark = pytest.mark.vm

FORKPOINT = Path(sys.executable).with_name("forkpoint")

# Answers each connection with random.random(); "reseed" also registers for restores.
RANDOM_SERVER = """
import random, socket, sys
if sys.argv[2] == "reseed":
    import forkpoint_guest
    forkpoint_guest.on_restore(forkpoint_guest.reseed)
random.random()
server = socket.create_server(("", int(sys.argv[1])))
while True:
    conn, _ = server.accept()
    conn.recv(100)
    conn.sendall(repr(random.random()).encode())
    conn.close()
"""

# Counts the SIGUSR1s it gets in /tmp/usr1-NAME; "register" asks for one per restore.
COUNTER = """
n=0
trap 'n=$((n + 1)); echo $n > /tmp/usr1-$1' USR1
echo 0 > /tmp/usr1-$1
[ "$2" = register ] && forkpoint-guest register USR1 $$
while true; do sleep 0.2 & wait $!; done
"""

# As printf formats them (\\n: a newline).
HOOKS = {
    "10-env": "#!/bin/sh\\nenv | grep ^FORKPOINT_ | sort > /tmp/hook-env\\n",
    "20-hang": "#!/bin/sh\\nsleep 600\\n",
    "30-fail": "#!/bin/sh\\necho failing on purpose\\nexit 3\\n",
}
HOOK_LIMIT_S = 3


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    monkeypatch.setenv("FORKPOINT_RESTORE_HOOK_TIMEOUT", str(HOOK_LIMIT_S))
    runtime = Runtime.open()
    yield runtime
    runtime.close()


def _answer(session: Session, guest_port: int) -> bytes:
    forward = session.port(guest_port)
    assert forward is not None
    return read_port(forward.host_port)


def _text(rt: Runtime, session_id: str, path: str) -> str:
    return asyncio.run(rt.read_file(session_id, path)).decode().strip()


def _listeners_port_open(rt: Runtime, session_id: str) -> bool:
    async def ask() -> bool:
        record = rt.store.get_session(session_id)
        machine = await Machine.adopt(rt.files(session_id), record.qemu_pid or 0)
        try:
            return await machine.restore_listeners()
        finally:
            await machine.close()

    return asyncio.run(ask())


def _wait_until(check: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def _prepare(rt: Runtime) -> tuple[Session, dict[str, int]]:
    """A session running two random servers (8000 plain, 8001 reseeding), two USR1
    counters (one registered) and three restore hooks. Returns it and the pids."""
    session = asyncio.run(rt.create(ports=[8000, 8001]))
    pids = {}
    for name, argv in {
        "plain": ["python3", "-c", RANDOM_SERVER, "8000", "plain"],
        "reseed": ["python3", "-c", RANDOM_SERVER, "8001", "reseed"],
        "registered": ["sh", "-c", COUNTER, "counter", "registered", "register"],
        "unregistered": ["sh", "-c", COUNTER, "counter", "unregistered", "no"],
    }.items():
        pids[name] = asyncio.run(rt.spawn(session.id, argv)).pid
    hooks = "/etc/forkpoint/restore.d"
    setup = " && ".join(
        f"printf '{body}' > {hooks}/{name} && chmod 755 {hooks}/{name}"
        for name, body in HOOKS.items()
    )
    done = asyncio.run(rt.exec(session.id, ["sh", "-c", f"mkdir -p {hooks} && {setup}"]))
    assert done.exit_code == 0, done.stderr
    _answer(session, 8000), _answer(session, 8001)  # both servers are up
    _wait_until(
        lambda: (
            _text(rt, session.id, "/tmp/usr1-registered") == "0"
            and _text(rt, session.id, "/tmp/usr1-unregistered") == "0"
            and (
                asyncio.run(rt.restore_status(session.id)).listeners == 2  # reseed, registered
            )
        ),
        "the registrations",
    )
    _wait_until(lambda: _listeners_port_open(rt, session.id), "the listeners port")
    return session, pids


def _failed_hooks(rt: Runtime, session_id: str) -> dict[str, str]:
    events = asyncio.run(rt.events(session=session_id, limit=1000))
    return {
        e.detail["hook"]: e.detail["status"]
        for e in events
        if e.kind == EventKind.RESTORE_HOOK_FAILED
    }


def test_forks_and_rollbacks_tell_the_processes_that_asked(rt: Runtime) -> None:
    session, pids = _prepare(rt)
    template = rt.store.get_checkpoint(session.parent_checkpoint or "")
    assert not template.manifest.get("restore_listeners")  # nothing to tell at its boot
    created = asyncio.run(rt.restore_status(session.id))
    assert (created.generation, created.event, created.notified) == (1, "create", [])

    checkpoint = asyncio.run(rt.checkpoint(session.id))
    assert rt.store.get_checkpoint(checkpoint.id).manifest["restore_listeners"] is True
    started = time.monotonic()
    forks = [f for f in asyncio.run(rt.fork(checkpoint.id, count=3)) if isinstance(f, Session)]
    assert len(forks) == 3
    # A hanging hook was killed at its limit and the fork went on.
    assert time.monotonic() - started < 60

    plain = [_answer(f, 8000) for f in forks]
    reseeded = [_answer(f, 8001) for f in forks]
    assert len(set(plain)) == 1, f"forks drew different numbers without reseeding: {plain}"
    assert len(set(reseeded)) == 3, f"reseeded forks drew the same numbers: {reseeded}"

    first = forks[0]
    status: GuestRestore = asyncio.run(rt.restore_status(first.id))
    assert (status.event, status.session, status.checkpoint) == ("fork", first.id, checkpoint.id)
    assert status.generation == created.generation + 1
    assert sorted(status.notified) == sorted([pids["reseed"], pids["registered"]])
    assert not status.hooks_running
    runs = {run.name: run for run in status.hook_runs}
    assert runs["10-env"].exit_code == 0
    assert runs["20-hang"].timed_out and runs["20-hang"].exit_code is None
    assert runs["30-fail"].exit_code == 3
    env = dict(line.split("=", 1) for line in _text(rt, first.id, "/tmp/hook-env").splitlines())
    assert env["FORKPOINT_EVENT"] == "fork"
    assert env["FORKPOINT_SESSION"] == first.id
    assert env["FORKPOINT_CHECKPOINT"] == checkpoint.id
    assert _failed_hooks(rt, first.id) == {
        "20-hang": "killed at its time limit",
        "30-fail": "exit 3",
    }

    # Exactly one signal for the process that asked, none for the other.
    assert _text(rt, first.id, "/tmp/usr1-registered") == "1"
    assert _text(rt, first.id, "/tmp/usr1-unregistered") == "0"
    running = {p.pid for p in asyncio.run(rt.ps(first.id))}
    assert pids["unregistered"] in running and pids["registered"] in running

    # A rollback is a restore too: the plain server is back at the checkpoint's draw, the
    # reseeding one draws anew; the counter went back to 0 and got one more signal.
    asyncio.run(rt.rollback(first.id, checkpoint.id))
    assert _answer(first, 8000) == plain[0]
    again = _answer(first, 8001)
    assert again not in reseeded
    assert _text(rt, first.id, "/tmp/usr1-registered") == "1"
    after = asyncio.run(rt.restore_status(first.id))
    assert (after.event, after.generation) == ("rollback", status.generation)

    # The CLI door says the same.
    done = subprocess.run(
        [str(FORKPOINT), "restore-status", first.id, "--json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "FORKPOINT_RESTORE_HOOK_TIMEOUT": str(HOOK_LIMIT_S)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["event"], shown["session"]) == ("rollback", first.id)
    assert {run["name"] for run in shown["hook_runs"]} == set(HOOKS)

    for s in [*forks, session]:
        asyncio.run(rt.remove(s.id))


def test_a_guest_with_nobody_to_tell_is_not_waited_for(rt: Runtime) -> None:
    session = asyncio.run(rt.create())
    checkpoint = asyncio.run(rt.checkpoint(session.id))
    assert not rt.store.get_checkpoint(checkpoint.id).manifest.get("restore_listeners")
    [fork] = asyncio.run(rt.fork(checkpoint.id))
    assert isinstance(fork, Session)
    status = asyncio.run(rt.restore_status(fork.id))  # its hello carried the identity
    assert (status.event, status.session, status.notified) == ("fork", fork.id, [])
    assert _text(rt, fork.id, "/run/forkpoint/generation") == str(status.generation)
    for s in (fork, session):
        asyncio.run(rt.remove(s.id))
