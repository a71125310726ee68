"""The metadata store: migrations, CRUD, dependency rules, GC, concurrency and locks."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from forkpoint.config import Home
from forkpoint.errors import Conflict, InUse, InvalidInput, NotFound
from forkpoint.models import JAIL_UID_BASE, JAIL_UIDS
from forkpoint.store import (
    SCHEMA_VERSION,
    CheckpointKind,
    CheckpointRecord,
    Network,
    PortForward,
    SessionRecord,
    SessionState,
    Store,
    global_lock,
    session_lock,
    session_lock_async,
    utc_now,
)
from forkpoint.store.db import session_uids
from forkpoint.store.e2b import E2bStore
from forkpoint.store.history import HistoryStore
from forkpoint.store.schema import MIGRATIONS, migrate, schema_version

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home")


@pytest.fixture
def store(home: Home) -> Iterator[Store]:
    with Store.open(home) as s:
        yield s


def _session(store: Store, layer: str = "base.qcow2", **kw: object) -> SessionRecord:
    if layer not in {name for name in _layers(store)}:
        store.insert_layer(layer)
    record = SessionRecord.new(
        image="default", image_hash="ih1", disk_layer=layer, memory_mib=512, cpus=1
    )
    return store.insert_session(replace(record, **kw))  # type: ignore[arg-type]


def _layers(store: Store) -> list[str]:
    with closing(sqlite3.connect(store.path)) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM layers")]


def _checkpoint(
    store: Store, session: SessionRecord, layer: str, backing: str | None = None, **kw: object
) -> CheckpointRecord:
    """Freeze ``layer`` as a checkpoint (as the runtime does), session moves to a new top."""
    store.insert_layer(layer, backing)
    record = CheckpointRecord.new(
        session_id=session.id,
        disk_layer=layer,
        image=session.image,
        image_hash=session.image_hash,
        manifest={"qemu": "10.0", "ram_mib": 512},
        size_bytes=1234,
        parent_checkpoint=session.parent_checkpoint,
    )
    return store.insert_checkpoint(replace(record, **kw))  # type: ignore[arg-type]


# --- migrations ----------------------------------------------------------------------------


def test_fresh_database_is_wal_at_current_version(home: Home) -> None:
    with Store.open(home) as store:
        assert store.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    assert home.layers.is_dir() and home.checkpoints.is_dir()
    with closing(sqlite3.connect(home.db)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"sessions", "ports", "checkpoints", "layers", "templates"} <= tables


def test_older_database_is_upgraded_and_keeps_its_data(home: Home) -> None:
    home.ensure()
    with closing(sqlite3.connect(home.db, isolation_level=None)) as conn:
        migrate(conn, MIGRATIONS[:3])  # a database from before v4 (jail uids)
        assert schema_version(conn) == 3
        conn.execute("INSERT INTO layers VALUES ('old.qcow2', NULL, '2024-01-01T00:00:00.000Z')")
        for sid in ("s-000000000a", "s-000000000b"):
            conn.execute(
                "INSERT INTO sessions (id, image, image_hash, state, created_at, memory_mib, "
                "cpus, network, disk_layer) VALUES (?, 'default', 'ih', 'stopped', "
                "'2024-01-01T00:00:00.000Z', 512, 1, 'user', 'old.qcow2')",
                (sid,),
            )
    with Store.open(home) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.layer_chain("old.qcow2") == ["old.qcow2"]
        first = store.uids.start
        assert {s.uid for s in store.list_sessions()} == {first, first + 1}
        assert store.get_template("ih", "mk") is None
        assert HistoryStore(store).keep("s-000000000a") is None  # the newest tables work


def test_v9_moves_the_gateway_lifetimes_and_hidden_checkpoints_onto_the_runtime(
    home: Home,
) -> None:
    """A v8 database: a running E2B sandbox with auto-pause and an end time, a paused
    one, their pause/fork checkpoints and a history step become sessions' lifetimes and
    checkpoint purposes; the foreign keys still hold after the checkpoints table's rebuild."""
    home.ensure()
    with closing(sqlite3.connect(home.db, isolation_level=None)) as conn:
        migrate(conn, MIGRATIONS[:8])
        conn.execute("INSERT INTO layers VALUES ('l.qcow2', NULL, '2024-01-01T00:00:00.000Z')")
        for sid, uid in (("s-00000000aa", 1), ("s-00000000bb", 2)):
            conn.execute(
                "INSERT INTO sessions (id, image, image_hash, state, created_at, memory_mib, "
                "cpus, network, disk_layer, uid) VALUES (?, 'default', 'ih', 'running', "
                "'2024-01-01T00:00:00.000Z', 512, 1, 'user', 'l.qcow2', ?)",
                (sid, uid),
            )
        for cid, kind in (("c-0000000001", "user"), ("c-0000000002", "user"),
                          ("c-0000000003", "user"), ("c-0000000004", "template")):  # fmt: skip
            conn.execute(
                "INSERT INTO checkpoints (id, session_id, kind, created_at, disk_layer, image, "
                "image_hash) VALUES (?, 's-00000000aa', ?, '2024-01-01T00:00:00.000Z', "
                "'l.qcow2', 'default', 'ih')",
                (cid, kind),
            )
        conn.execute(
            "INSERT INTO e2b_sandboxes VALUES ('s-00000000aa', 't', 'base', '{}', '{}', "
            "1700000000, 1700000300.5, 1, NULL)"
        )
        conn.execute(
            "INSERT INTO e2b_sandboxes VALUES ('s-00000000bb', 't', 'base', '{}', '{}', "
            "1700000000, 1700000300, 0, 'c-0000000001')"
        )
        conn.execute("INSERT INTO e2b_internal_checkpoints VALUES ('c-0000000001', "
                     "'s-00000000bb', 'pause')")  # fmt: skip
        conn.execute("INSERT INTO e2b_internal_checkpoints VALUES ('c-0000000002', "
                     "'s-00000000aa', 'fork')")  # fmt: skip
        conn.execute("INSERT INTO history_sessions VALUES ('s-00000000aa', 20)")
        conn.execute("INSERT INTO history_steps VALUES ('c-0000000003', 's-00000000aa', "
                     "'ls', 1, 0)")  # fmt: skip
    with Store.open(home) as store:
        running, paused = store.get_session("s-00000000aa"), store.get_session("s-00000000bb")
        assert (running.expires_at, running.on_expiry) == ("2023-11-14T22:18:20.500Z", "pause")
        assert (paused.expires_at, paused.on_expiry) == (None, "remove")
        kinds = {c.id: c.kind for c in store.list_checkpoints()}
        assert kinds == {"c-0000000001": "pause", "c-0000000002": "fork",
                         "c-0000000003": "history", "c-0000000004": "template"}  # fmt: skip
        assert [
            c.id for c in store.list_checkpoints(kind=(CheckpointKind.USER, CheckpointKind.HISTORY))
        ] == ["c-0000000003"]
        assert E2bStore(store).get("s-00000000aa").template == "base"
        assert HistoryStore(store).steps("s-00000000aa")["c-0000000003"].label == "ls"
        with store.transaction() as conn:
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "e2b_internal_checkpoints" not in tables


def test_migration_runs_each_step_once_and_in_order(tmp_path: Path) -> None:
    ran: list[int] = []
    steps = [lambda conn, i=i: ran.append(i) for i in range(3)]
    with closing(sqlite3.connect(tmp_path / "x.db", isolation_level=None)) as conn:
        assert migrate(conn, steps[:1]) == 0
        assert migrate(conn, steps) == 1
        assert migrate(conn, steps) == 3
        assert ran == [0, 1, 2]


def test_failed_migration_changes_nothing(tmp_path: Path) -> None:
    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half (x)")
        raise RuntimeError("boom")

    with closing(sqlite3.connect(tmp_path / "x.db", isolation_level=None)) as conn:
        with pytest.raises(RuntimeError):
            migrate(conn, [*MIGRATIONS, broken])
        assert schema_version(conn) == 0
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_newer_database_is_refused(home: Home) -> None:
    with Store.open(home):
        pass
    with closing(sqlite3.connect(home.db)) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(Conflict, match="newer|upgrade forkpoint") as info:
        Store.open(home)
    assert f"schema version {SCHEMA_VERSION + 1}" in info.value.message


# --- sessions and ports --------------------------------------------------------------------


def test_session_round_trip(store: Store) -> None:
    created = _session(store, name="web", ports=(PortForward(8000, 41000),))
    assert created.state is SessionState.CREATING
    assert created.id.startswith("s-") and len(created.id) == 12
    assert created.created_at.endswith("Z") and len(created.created_at) == 24
    assert store.get_session(created.id) == created
    assert store.get_session("web") == created
    assert store.list_sessions() == [created]
    as_json = json.loads(json.dumps(created.to_dict()))
    assert as_json["ports"] == [{"guest_port": 8000, "host_port": 41000}]
    assert as_json["state"] == "creating" and as_json["network"] == "user"

    updated = store.update_session(
        created.id, state=SessionState.RUNNING, qemu_pid=4242, aux_pids=[7, 8], generation=1
    )
    assert updated.state is SessionState.RUNNING
    assert (updated.qemu_pid, updated.aux_pids, updated.generation) == (4242, (7, 8), 1)
    assert updated.name == "web" and updated.ports == created.ports
    assert store.update_session(created.id, network=Network.NONE).network is Network.NONE

    store.delete_session(created.id)
    assert store.list_sessions() == []
    assert store.allocated_host_ports() == set()


def test_metrics_are_kept_an_hour_and_go_with_their_session(store: Store) -> None:
    from forkpoint.models import Metric
    from forkpoint.store.metrics import MetricsStore

    rows = MetricsStore(store)
    session = _session(store)

    def sample(at: str, pct: float = 5.0) -> Metric:
        return Metric(at, 1, pct, 100, 512, 10, 200, 2048)

    rows.add([
        (session.id, sample(utc_now(7200))), (session.id, sample(utc_now(60), 1.0)),
        (session.id, sample(utc_now(5), 2.0)), ("s-gone000000", sample(utc_now())),
    ])  # fmt: skip
    kept = rows.between(session.id, None, None)
    assert [m.cpu_used_pct for m in kept] == [1.0, 2.0]  # the 2 h old one pruned, oldest first
    assert rows.between(session.id, utc_now(30), None) == kept[1:]
    assert rows.between(session.id, None, utc_now(30)) == kept[:1]
    assert rows.between("s-gone000000", None, None) == []  # no session, no rows
    assert rows.latest() == {session.id: kept[-1]}  # what `show` and the page say
    store.delete_session(session.id)
    assert rows.between(session.id, None, None) == []


def test_events_are_in_order_outlive_sessions_and_the_oldest_go(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from forkpoint.models import EventKind
    from forkpoint.store import events

    rows = events.EventsStore(store)
    session = _session(store)
    rows.add([(EventKind.CREATED, session.id, None, {"image": "default"})])
    rows.add([(EventKind.CHECKPOINTED, session.id, "c-0000000001", {"kind": "user"}),
              (EventKind.CREATED, "s-other00000", None, {})])  # fmt: skip
    store.delete_session(session.id)
    rows.add([(EventKind.REMOVED, session.id, None, {})])
    every = rows.after(0, None, 100)
    assert [e.kind for e in every] == ["created", "checkpointed", "created", "removed"]
    assert [e.id for e in every] == sorted(e.id for e in every)
    assert every[1].checkpoint == "c-0000000001" and every[1].detail == {"kind": "user"}
    assert [e.kind for e in rows.after(every[0].id, session.id, 100)] == ["checkpointed", "removed"]
    assert rows.after(every[-1].id, None, 100) == []
    assert rows.last(2, None) == every[2:]  # the last ones, oldest first
    assert rows.last(1, session.id) == every[3:]
    monkeypatch.setattr(events, "KEEP", 3)
    rows.add([(EventKind.PAUSED, "s-other00000", None, {})])
    assert [e.kind for e in rows.after(0, None, 100)] == ["created", "removed", "paused"]


def test_every_session_gets_a_uid_of_its_own(store: Store) -> None:
    a, b = _session(store), _session(store)
    assert {a.uid, b.uid} == {store.uids.start, store.uids.start + 1}
    assert store.uids.start > JAIL_UID_BASE and len(store.uids) == JAIL_UIDS
    # another home on the same host most likely has a block of its own
    assert session_uids(store.path.parent / "elsewhere") != store.uids
    store.delete_session(a.id)
    assert _session(store).uid == a.uid  # a removed session's uid is free again
    jailed = store.update_session(
        b.id, disk_mib=2048, expires_at="2026-01-01T00:00:00.000Z", egress={"deny": ["1.2.3.4/32"]}
    )
    assert (jailed.uid, jailed.disk_mib, jailed.expires_at) == (
        b.uid,
        2048,
        "2026-01-01T00:00:00.000Z",
    )
    assert store.get_session(b.id).egress == {"deny": ["1.2.3.4/32"]}


def test_unknown_things_are_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="^unknown session: nope$"):
        store.get_session("nope")
    with pytest.raises(NotFound, match="^unknown checkpoint: c-0000000000$"):
        store.get_checkpoint("c-0000000000")
    with pytest.raises(NotFound, match="unknown session"):
        store.update_session("nope", state=SessionState.RUNNING)
    with pytest.raises(NotFound, match="unknown session"):
        store.delete_session("nope")
    with pytest.raises(NotFound, match="unknown layer: nope"):
        store.layer_chain("nope")
    with pytest.raises(NotFound, match="unknown layer: missing.qcow2"):
        _session(store, layer="base.qcow2", disk_layer="missing.qcow2")


def test_update_session_refuses_bad_fields(store: Store) -> None:
    s = _session(store)
    # Fields that cannot change are no parameters at all (the type checker says so).
    with pytest.raises(TypeError, match="id"):
        store.update_session(s.id, id="s-0000000000")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="ports"):
        store.update_session(s.id, ports=[])  # type: ignore[call-arg]
    with pytest.raises(InvalidInput, match="state"):
        store.update_session(s.id, state="sleeping")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="memory_mib"):
        store.update_session(s.id, memory_mib=0)
    with pytest.raises(InvalidInput, match="name"):
        store.update_session(s.id, name="s-0123456789")  # shaped like an id
    assert store.get_session(s.id) == s


def test_session_names_are_unique(store: Store) -> None:
    first = _session(store, name="dup")
    with pytest.raises(Conflict, match=f"session name 'dup' is already taken by {first.id}"):
        _session(store, name="dup")
    other = _session(store)
    with pytest.raises(Conflict, match="already taken"):
        store.update_session(other.id, name="dup")
    _session(store)  # several unnamed sessions are fine
    assert len(store.list_sessions()) == 3


def test_host_ports_are_globally_unique(store: Store) -> None:
    a, b = _session(store), _session(store)
    assert store.add_port(a.id, 8000, 41000) == PortForward(8000, 41000)
    with pytest.raises(Conflict, match=f"host port 41000 is already allocated to session {a.id}"):
        store.add_port(b.id, 8000, 41000)
    with pytest.raises(Conflict, match="guest port 8000 .* already forwarded"):
        store.add_port(a.id, 8000, 41001)
    with pytest.raises(Conflict):  # insert_session is atomic: no half session left behind
        _session(store, name="late", ports=(PortForward(80, 41002), PortForward(81, 41000)))
    with pytest.raises(NotFound):
        store.get_session("late")
    with pytest.raises(InvalidInput):
        store.add_port(b.id, 8000, 70000)
    store.add_port(b.id, 3000, 41003)
    assert store.allocated_host_ports() == {41000, 41003}
    assert store.remove_ports(a.id) == [PortForward(8000, 41000)]
    store.add_port(b.id, 8000, 41000)  # free again
    assert store.get_session(b.id).port_for(8000) == PortForward(8000, 41000)


# --- checkpoints ---------------------------------------------------------------------------


def test_checkpoint_round_trip_and_listing(store: Store) -> None:
    s = _session(store, layer="top0.qcow2")
    ck = _checkpoint(store, s, "frozen1.qcow2", name="before")
    assert ck.id.startswith("c-") and ck.kind is CheckpointKind.USER
    assert store.get_checkpoint(ck.id) == ck == store.get_checkpoint("before")
    assert json.loads(json.dumps(ck.to_dict()))["manifest"] == {"qemu": "10.0", "ram_mib": 512}
    tpl = _checkpoint(store, s, "frozen2.qcow2", kind=CheckpointKind.TEMPLATE)
    assert store.list_checkpoints() == [ck, tpl]
    assert store.list_checkpoints(kind="template") == [tpl]
    assert store.list_checkpoints(session_id=s.id, kind=CheckpointKind.USER) == [ck]
    assert store.list_checkpoints(session_id="s-0000000000") == []
    with pytest.raises(Conflict, match="checkpoint name 'before' is already taken"):
        _checkpoint(store, s, "frozen3.qcow2", name="before")


def test_delete_checkpoint_refused_while_depended_on(store: Store) -> None:
    origin = _session(store, layer="boot.qcow2")
    # checkpoint A freezes the boot layer; the origin session continues on top of it.
    a = _checkpoint(store, origin, "boot-frozen.qcow2")
    store.insert_layer("origin-top.qcow2", "boot-frozen.qcow2")
    store.update_session(origin.id, disk_layer="origin-top.qcow2")
    # a fork of A, then checkpoint B of the fork (its disk chain runs through A's layer).
    store.insert_layer("fork.qcow2", a.disk_layer)
    fork = _session(store, layer="fork.qcow2", parent_checkpoint=a.id)
    b = _checkpoint(store, fork, "fork-frozen.qcow2")
    store.insert_layer("fork-top.qcow2", "fork-frozen.qcow2")
    store.update_session(fork.id, disk_layer="fork-top.qcow2")

    # The fork started from A (its rollback target) and B descends from A. The origin
    # session only stacks its disk on A's layer: the layer, not the checkpoint, keeps that.
    assert store.checkpoint_dependents(a.id) == sorted([fork.id, b.id])
    with pytest.raises(InUse, match=f"checkpoint {a.id} is in use by .*{fork.id}"):
        store.delete_checkpoint(a.id)
    assert store.checkpoint_dependents(b.id) == []
    store.delete_checkpoint(b.id)

    store.delete_session(fork.id)
    assert store.checkpoint_dependents(a.id) == []
    assert store.delete_checkpoint(a.id) == a
    # A's frozen layer lives on under the origin session's top layer
    assert a.disk_layer not in store.unreferenced_layers()
    with pytest.raises(NotFound):
        store.get_checkpoint(a.id)


def test_templates(store: Store) -> None:
    s = _session(store)
    ck = _checkpoint(store, s, "tpl.qcow2", kind=CheckpointKind.TEMPLATE)
    assert store.get_template("ih1", "qemu10-tcg-512-1") is None
    store.set_template("ih1", "qemu10-tcg-512-1", ck.id)
    assert store.get_template("ih1", "qemu10-tcg-512-1") == ck.id
    assert [t.checkpoint_id for t in store.list_templates()] == [ck.id]
    store.delete_template("ih1", "qemu10-tcg-512-1")
    with pytest.raises(NotFound):
        store.delete_template("ih1", "qemu10-tcg-512-1")
    with pytest.raises(NotFound):
        store.set_template("ih1", "k", "c-0000000000")
    store.set_template("ih1", "k", ck.id)
    store.delete_checkpoint(ck.id)  # deleting the checkpoint forgets its template
    assert store.get_template("ih1", "k") is None


# --- layers --------------------------------------------------------------------------------


def test_layer_chain_and_gc_fixpoint(store: Store) -> None:
    names = [f"l{i}.qcow2" for i in range(5)]
    backing = None
    for name in names:
        store.insert_layer(name, backing)
        backing = name
    store.insert_layer("lone.qcow2")
    assert store.layer_chain("l4.qcow2") == list(reversed(names))
    with pytest.raises(Conflict):
        store.insert_layer("l0.qcow2")
    with pytest.raises(NotFound):
        store.insert_layer("x.qcow2", "missing.qcow2")
    with pytest.raises(InvalidInput):
        store.insert_layer("../evil")

    s = _session(store, layer="l4.qcow2")
    ck = _checkpoint(store, s, "c.qcow2", backing="l1.qcow2")
    assert store.unreferenced_layers() == ["lone.qcow2"]
    with pytest.raises(InUse, match=f"session {s.id}"):
        store.delete_layer("l4.qcow2")
    with pytest.raises(InUse, match="layer l2.qcow2"):
        store.delete_layer("l1.qcow2")

    def collect() -> list[str]:
        deleted: list[str] = []
        while garbage := store.unreferenced_layers():
            for name in garbage:
                store.delete_layer(name)
                deleted.append(name)
        return deleted

    assert collect() == ["lone.qcow2"]
    store.delete_session(s.id)
    assert collect() == ["l4.qcow2", "l3.qcow2", "l2.qcow2"]  # l1 still backs c.qcow2
    store.delete_checkpoint(ck.id)
    assert collect() == ["c.qcow2", "l1.qcow2", "l0.qcow2"]
    assert _layers(store) == []


# --- concurrency ---------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from forkpoint.config import Home
    from forkpoint.store import PortForward, SessionRecord, Store

    root, sid, worker, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with Store.open(Home(Path(root))) as store:
        for i in range(rounds):
            with store.transaction():  # read-modify-write: no lost updates
                current = store.get_session(sid)
                store.update_session(sid, generation=current.generation + 1)
            store.insert_session(
                SessionRecord.new(
                    image="img", image_hash="ih", disk_layer="base.qcow2",
                    memory_mib=256, cpus=1, name=f"w{worker}-{i}",
                )
            )
            store.add_port(store.get_session(f"w{worker}-{i}").id, 80, 20000 + worker * 1000 + i)
    """
)


def _python(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", *args],
        env={"PYTHONPATH": SRC, "PATH": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_concurrent_writer_processes_lose_nothing(home: Home) -> None:
    workers, rounds = 3, 40
    with Store.open(home) as store:
        counter = _session(store)
    procs = [
        _python(_WRITER, str(home.root), counter.id, str(w), str(rounds)) for w in range(workers)
    ]
    # This process writes concurrently too, from two threads sharing one Store.
    with Store.open(home) as store:

        def local(tag: str) -> None:
            for i in range(rounds):
                store.insert_layer(f"{tag}-{i}.qcow2")

        threads = [threading.Thread(target=local, args=(t,)) for t in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        assert store.get_session(counter.id).generation == workers * rounds
        assert len(store.list_sessions()) == 1 + workers * rounds
        assert len(store.allocated_host_ports()) == workers * rounds
        assert len(_layers(store)) == 1 + 2 * rounds


def test_concurrent_first_open_migrates_once(home: Home) -> None:
    code = "import sys; from pathlib import Path; from forkpoint.config import Home; "
    code += "from forkpoint.store import Store; Store.open(Home(Path(sys.argv[1]))).close()"
    procs = [_python(code, str(home.root)) for _ in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    with Store.open(home) as store:
        assert store.schema_version == SCHEMA_VERSION


def test_store_is_atomic_per_transaction(store: Store) -> None:
    s = _session(store)
    with pytest.raises(RuntimeError), store.transaction():
        store.update_session(s.id, generation=5)
        store.insert_layer("half.qcow2")
        raise RuntimeError("crash in the middle")
    assert store.get_session(s.id).generation == 0
    assert "half.qcow2" not in _layers(store)


# --- locks ---------------------------------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from forkpoint.config import Home
    from forkpoint.store import session_lock

    with session_lock(Home(Path(sys.argv[1])), sys.argv[2]):
        print("held", flush=True)
        time.sleep(float(sys.argv[3]))
    """
)


def test_session_lock_excludes_another_process(home: Home) -> None:
    holder = _python(_HOLDER, str(home.root), "s-0123456789", "30")
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        start = time.monotonic()
        with (
            pytest.raises(Conflict, match=r"^session s-0123456789 is busy \(another forkpoint"),
            session_lock(home, "s-0123456789", timeout_s=0.3),
        ):
            pass
        assert 0.25 < time.monotonic() - start < 5
        with session_lock(home, "s-9999999999", timeout_s=0.3):  # other sessions are free
            pass

        async def try_async() -> None:
            async with session_lock_async(home, "s-0123456789", timeout_s=0.2):
                pass

        with pytest.raises(Conflict, match="is busy"):
            asyncio.run(try_async())
    finally:
        holder.kill()
        holder.communicate()
    # The holder died, so the lock is free (the kernel dropped it with the process).
    with session_lock(home, "s-0123456789", timeout_s=5):
        pass


def test_session_lock_waits_for_release(home: Home) -> None:
    holder = _python(_HOLDER, str(home.root), "s-0123456789", "0.3")
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"

        async def wait_async() -> None:
            async with session_lock_async(home, "s-0123456789", timeout_s=10):
                pass

        asyncio.run(wait_async())
    finally:
        holder.communicate(timeout=30)


def test_locks_exclude_within_one_process_and_reject_bad_names(home: Home) -> None:
    with global_lock(home, "ports"):
        with pytest.raises(Conflict, match="'ports' is busy"), global_lock(home, "ports", 0.05):
            pass
        with session_lock(home, "s-0123456789", 0.05):  # different file, not blocked
            pass
    with global_lock(home, "ports", 0.05):
        pass
    with pytest.raises(InvalidInput), session_lock(home, "../x"):
        pass


# -- warm VMs ------------------------------------------------------------------------------


def test_warm_vms_have_their_own_uids_and_are_taken_once(store: Store) -> None:
    from forkpoint.store.warm import WarmStore

    warm = WarmStore(store)
    first = warm.reserve("c-0000000001", "k", "a.qcow2")
    session = _session(store)  # a session created meanwhile gets another uid
    second = warm.reserve("c-0000000001", "k", "b.qcow2")
    assert len({first.uid, second.uid, session.uid}) == 3
    assert warm.take("k") is None  # not started yet: no pid
    warm.set_started(first.id, 4242, 4244)
    warm.set_started(second.id, 4243, None)
    assert warm.take("other") is None
    taken = warm.take("k")
    assert taken is not None and taken.id == first.id and taken.pids == {4242, 4244}
    assert [w.id for w in warm.all()] == [second.id]  # gone from the table once taken
    warm.remove(second.id)
    assert warm.all() == [] and warm.take("k") is None
