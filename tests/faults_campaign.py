"""The fault campaign: crash forkpoint at every named crash point of every operation,
kill or freeze QEMU and passt mid-operation, race two forkpoint processes on one
session, damage checkpoint files, kill every VM at once (a host restart) — and check the
home's invariants (``forkpoint.runtime.housekeeping.invariants``) after every fault.

``make faults`` runs it in full (``--rounds`` walks, then random points up to
``--crashes``); ``tests/test_faults.py`` runs the reduced campaign in ``make test``.
Run with ``$FORKPOINT_HOME`` set to a scratch home: it makes and removes sessions there.
Report: ``<out>/faults.json`` and ``<out>/faults.md`` (the tables of docs/reliability.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forkpoint.config import Home, home
from forkpoint.faults import CRASH_AT_ENV, CRASH_TRACE_ENV
from forkpoint.runtime import Runtime
from forkpoint.runtime.housekeeping.invariants import Ledger, check_home, home_processes
from forkpoint.runtime.housekeeping.orphans import GRACE_ENV
from forkpoint.store import Store

FORKPOINT = str(Path(sys.executable).parent / "forkpoint")
# The campaign runs one operation at a time: an orphan is one as soon as it exists.
# Operations run concurrently (the races, the faults while an operation runs) keep the
# product's grace for orphans: it is what keeps a GC from taking a file another operation
# has just made. The campaign's own GC and the sequential recovery steps use none (nothing
# else runs then), so that an orphan is one as soon as it exists.
# Only while the campaign runs (main): set at import, it reached every test of a pytest run
# that imports this module, and a server under test then swept the staging directory of a
# checkpoint in progress (the fuzz test's 500: "No such file ... .tmp-c-…/state").
CONCURRENT_ENV = dict(os.environ)
BASE_ENV = {**os.environ, GRACE_ENV: "0"}
MARKER = "/root/fault-marker"


@dataclass
class Row:
    injected: int = 0
    recovered: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def fp(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FORKPOINT, *args], env={**BASE_ENV, **(env or {})}, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def fpj(*args: str) -> Any:
    done = fp(*args, "--json")
    if done.returncode != 0:
        raise RuntimeError(
            f"forkpoint {' '.join(args)}: rc {done.returncode}: {done.stderr.strip()}"
        )
    return json.loads(done.stdout)


class Campaign:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.home = home()
        self.ledger = Ledger()
        self.rows: dict[tuple[str, str], Row] = {}
        self.others: dict[str, Row] = {}
        self.session = ""
        self.first = ""
        self.counter = 0
        self.before = ""  # the session's marker before the fault under way
        self.pending = ""  # the marker written for the checkpoint under way
        self.acceptable: dict[str, set[str]] = {}  # checkpoint → markers it may show

    # -- the world the faults hit ------------------------------------------------------

    def setup(self) -> None:
        s = fpj("create", "--port", "8000")
        self.session = s["id"]
        self.ledger.sessions.add(self.session)
        self.ledger.seen.add(self.session)
        self.first = self.checkpoint_with_marker()

    def marker(self) -> str:
        self.counter += 1
        value = f"m{self.counter}-{self.rng.randrange(1 << 30)}"
        done = fp("exec", self.session, "--", "sh", "-c", f"echo {value} > {MARKER}; sync")
        if done.returncode != 0:
            raise RuntimeError(f"marker: {done.stderr.strip()}")
        self.before = value
        return value

    def checkpoint_with_marker(self) -> str:
        value = self.marker()
        c = fpj("checkpoint", self.session)
        self.ledger.checkpoints[c["id"]] = value
        return str(c["id"])

    def marker_of(self, session: str) -> str | None:
        done = fp("exec", session, "--", "cat", MARKER)
        return done.stdout.strip() if done.returncode == 0 else None

    # -- the operations ------------------------------------------------------------------

    def prepare(
        self, op: str
    ) -> tuple[list[str], Callable[[subprocess.CompletedProcess[str]], None]]:
        """The command line of one run of ``op``, and what its success means."""

        def nothing(done: subprocess.CompletedProcess[str]) -> None:
            pass

        if op == "create":
            return ["create"], nothing
        if op == "fork":
            return ["fork", self.first], nothing
        if op == "rollback":
            return ["rollback", self.session, self.first], nothing
        if op == "checkpoint":
            value = self.marker()

            def recorded(done: subprocess.CompletedProcess[str]) -> None:
                self.ledger.checkpoints[json.loads(done.stdout)["id"]] = value

            self.pending = value
            return ["checkpoint", self.session, "--json"], recorded
        if op == "rm":
            victim = fpj("fork", self.first)[0]["id"]
            self.ledger.seen.add(victim)
            return ["rm", victim], nothing
        if op == "checkpoint-rm":
            extra = fpj("checkpoint", self.session)["id"]
            return ["checkpoint", "rm", extra], nothing
        if op == "chain-rm":
            # A checkpoint in the middle of the session's chain: the next one is a clone of
            # its RAM file plus what changed (and the VM then maps that one). Removing it
            # must leave the later one restorable, with its marker (check_restores).
            middle = fpj("checkpoint", self.session)["id"]
            self.checkpoint_with_marker()
            return ["checkpoint", "rm", middle], nothing
        raise ValueError(op)

    def adopt_unreported_checkpoints(self) -> None:
        """A checkpoint that no operation reported (its process was killed after recording
        it, or a fault or race ran beside it) must still be whole and show a state its
        session really had: the marker it held before the fault, the one written for the
        checkpoint, or the first checkpoint's (a rollback ran first)."""
        store = Store.open(self.home)
        try:
            for c in store.list_checkpoints(session_id=self.session):
                if c.id not in self.ledger.checkpoints and c.kind == "user":
                    held = {self.before, self.pending, self.ledger.checkpoints[self.first]}
                    self.ledger.checkpoints[c.id] = min(held)  # one of them (for the ledger)
                    self.acceptable[c.id] = held
        finally:
            store.close()

    # -- after a fault ---------------------------------------------------------------------

    def recover(self) -> bool:
        """The next operations a user would run: every session the ledger does not know
        is removed, the campaign's session rolled back if it crashed, then used."""
        ok = True
        for s in fpj("ls"):
            self.ledger.seen.add(s["id"])
            if s["id"] != self.session:
                ok &= fp("rm", s["id"]).returncode == 0
            elif s["state"] != "running":
                ok &= fp("rollback", self.session).returncode == 0
        ok &= fp("exec", self.session, "--", "true").returncode == 0
        self.adopt_unreported_checkpoints()
        self.before = self.marker_of(self.session) or ""
        # Every completed operation collects; one more pass for the case none ran.
        ok &= fp("checkpoint", "rm", "c-0000000000").returncode == 3
        rt = Runtime.open(self.home)
        try:
            rt.gc()
        finally:
            rt.close()
        return ok

    def check(self) -> list[str]:
        store = Store.open(self.home)
        try:
            return check_home(self.home, store, self.ledger)
        finally:
            store.close()

    def check_restores(self) -> list[str]:
        problems = []
        for checkpoint, marker in sorted(self.ledger.checkpoints.items()):
            done = fp("fork", checkpoint, "--json")
            if done.returncode != 0:
                problems.append(f"checkpoint {checkpoint} does not restore: {done.stderr.strip()}")
                continue
            fork = json.loads(done.stdout)[0]["id"]
            shown = self.marker_of(fork)
            fp("rm", fork)
            if shown not in self.acceptable.get(checkpoint, {marker}):
                want = self.acceptable.get(checkpoint, {marker})
                problems.append(f"checkpoint {checkpoint} shows {shown!r}, not one of {want}")
        return problems

    def settle(self, row: Row, started: float) -> None:
        if self.recover():
            row.recovered += 1
        else:
            row.violations.append("recovery failed")
        found = self.check()
        for problem in found:
            print(f"    VIOLATION {problem}", flush=True)
        row.violations += found
        row.seconds += time.perf_counter() - started

    # -- crash points --------------------------------------------------------------------

    def trace(self, op: str) -> list[str]:
        with tempfile.NamedTemporaryFile("r", suffix=".trace") as trace:
            args, on_success = self.prepare(op)
            done = fp(*args, env={CRASH_TRACE_ENV: trace.name})
            if done.returncode != 0:
                raise RuntimeError(f"{op}: rc {done.returncode}: {done.stderr.strip()}")
            on_success(done)
            points = [line for line in Path(trace.name).read_text().splitlines() if line]
        self.recover()
        return points

    def crash(self, op: str, nth: int, points: list[str]) -> None:
        started = time.perf_counter()
        args, on_success = self.prepare(op)
        done = fp(*args, env={CRASH_AT_ENV: str(nth)})
        name = points[nth - 1] if nth <= len(points) else f"#{nth}"
        row = self.rows.setdefault((op, f"{nth:02d} {name}"), Row())
        if done.returncode == -signal.SIGKILL:
            row.injected += 1
        elif done.returncode == 0:
            on_success(done)  # this run passed fewer points (e.g. nothing left to collect)
        else:
            row.violations.append(f"rc {done.returncode}: {done.stderr.strip()[-200:]}")
        self.settle(row, started)
        print(f"  {op:<14} {nth:>2} {name:<30} rc {done.returncode:>3}  "
              f"violations {len(row.violations)}", flush=True)  # fmt: skip

    # -- other faults ----------------------------------------------------------------------

    def _vm_pids(self, session: str) -> tuple[list[int], list[int]]:
        """(QEMU pids, passt pids) of a session right now."""
        qemu: list[int] = []
        passt: list[int] = []
        for pid, sid in home_processes(self.home, self.ledger.seen | {session}):
            if sid != session:
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            (passt if b"passt" in cmd.split(b"\0")[0] else qemu).append(pid)
        return qemu, passt

    def _midway(self, args: list[str]) -> Callable[[], bool]:
        """True once ``args`` (a checkpoint or rollback of the session) is under way: its
        staging directory exists, or a QEMU other than the session's old one runs."""
        if args[0] == "checkpoint":
            return lambda: any(self.home.checkpoints.glob(".tmp-*"))
        old = set(self._vm_pids(self.session)[0])
        return lambda: bool(set(self._vm_pids(self.session)[0]) - old)

    def during(self, what: str, args: list[str], act: Callable[[], None], delay: float) -> None:
        """Run ``args``, and ``act`` ``delay`` s after it is under way (see ``_midway``)."""
        started = time.perf_counter()
        row = self.others.setdefault(what, Row())
        midway = self._midway(args)
        proc = subprocess.Popen([FORKPOINT, *args], env=CONCURRENT_ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        while not midway() and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(delay)
        if proc.poll() is not None:
            row.violations.append(f"{what}: finished before the fault ({delay} s)")
        act()
        row.injected += 1
        try:
            _, err = proc.communicate(timeout=180)
            if proc.returncode not in (0, 4, 5):
                row.violations.append(f"{what}: rc {proc.returncode}: {err.strip()[-200:]}")
        except subprocess.TimeoutExpired:
            proc.kill()
            row.violations.append(f"{what}: the operation hung")
        self.settle(row, started)
        print(f"  {what:<40} rc {proc.returncode}  violations {len(row.violations)}", flush=True)

    def kill_vm(
        self, sig: int, which: str = "qemu", resume_after: float = 0.0
    ) -> Callable[[], None]:
        def act() -> None:
            qemu, passt = self._vm_pids(self.session)
            for pid in qemu if which == "qemu" else passt:
                os.kill(pid, sig)
            if resume_after:
                time.sleep(resume_after)
                for pid in qemu if which == "qemu" else passt:
                    # Gone meanwhile: the operation killed it (a stopped rollback standby
                    # it discarded, the VM it replaced).
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)

        return act

    def process_faults(self) -> None:
        for d in (0.0, 0.01, 0.03):  # after the step that shows it is under way
            self.during("QEMU SIGKILL during checkpoint", ["checkpoint", self.session],
                        self.kill_vm(signal.SIGKILL), d)  # fmt: skip
            self.during("QEMU SIGSTOP 5 s during checkpoint", ["checkpoint", self.session],
                        self.kill_vm(signal.SIGSTOP, resume_after=5), d)  # fmt: skip
            self.during("QEMU SIGKILL during rollback", ["rollback", self.session, self.first],
                        self.kill_vm(signal.SIGKILL), d)  # fmt: skip
            self.during("QEMU SIGSTOP 5 s during rollback", ["rollback", self.session, self.first],
                        self.kill_vm(signal.SIGSTOP, resume_after=5), d)  # fmt: skip
            self.during("passt SIGKILL during rollback", ["rollback", self.session, self.first],
                        self.kill_vm(signal.SIGKILL, "passt"), d + 0.05)  # fmt: skip
            self.during("passt SIGKILL during checkpoint", ["checkpoint", self.session],
                        self.kill_vm(signal.SIGKILL, "passt"), d)  # fmt: skip

    def races(self, rounds: int) -> None:
        for _ in range(rounds):
            started = time.perf_counter()
            row = self.others.setdefault("race: checkpoint vs rollback vs rm", Row())
            victim = fpj("fork", self.first)[0]["id"]
            self.ledger.seen.add(victim)
            commands = [["checkpoint", self.session], ["rollback", self.session, self.first],
                        ["checkpoint", victim], ["rollback", victim], ["rm", victim]]  # fmt: skip
            pipe = subprocess.PIPE
            procs = [
                subprocess.Popen(
                    [FORKPOINT, *c], env=CONCURRENT_ENV, stdout=pipe, stderr=pipe, text=True
                )
                for c in commands
            ]
            row.injected += 1
            for c, p in zip(commands, procs, strict=True):
                _, err = p.communicate(timeout=300)
                if p.returncode not in (0, 3, 4):  # done, gone already, wrong state
                    row.violations.append(f"{' '.join(c)}: rc {p.returncode}: {err.strip()[-200:]}")
            self.settle(row, started)
            print(f"  race  violations {len(row.violations)}", flush=True)

    def damage(self, kinds: list[str]) -> None:
        for kind in kinds:
            started = time.perf_counter()
            row = self.others.setdefault(f"damaged checkpoint: {kind}", Row())
            victim = fpj("checkpoint", self.session)["id"]
            whole = fp("checkpoint", "verify", victim, "--json")
            if whole.returncode != 0 or not json.loads(whole.stdout)[0]["ok"]:
                row.violations.append(f"verify of the whole {victim}: {whole.stdout}")
            target, how = kind.split(" ", 1)
            path = self.home.checkpoints / victim / target
            size = path.stat().st_size
            with open(path, "r+b") as f:
                if how == "truncated":
                    f.truncate(size // 2)
                else:  # bytes flipped, in the middle of the file
                    f.seek(size // 2)
                    byte = f.read(1)
                    f.seek(size // 2)
                    f.write(bytes([byte[0] ^ 0xFF]))
            before = len(fpj("ls"))
            done = fp("fork", victim)
            row.injected += 1
            if done.returncode != 4 or "damaged checkpoint" not in done.stderr:
                row.violations.append(
                    f"fork of {kind}: rc {done.returncode}: {done.stderr.strip()[-200:]}"
                )
            if len(fpj("ls")) != before:
                row.violations.append(f"fork of {kind} left a session")
            verify = fp("checkpoint", "verify", victim)
            if verify.returncode != 4:
                row.violations.append(f"verify of {kind}: rc {verify.returncode}")
            fp("checkpoint", "rm", victim)
            self.settle(row, started)
            print(
                f"  damage {kind:<22} fork rc {done.returncode} verify rc {verify.returncode}",
                flush=True,
            )

    def host_restart(self) -> None:
        """Every QEMU and passt killed at once, one forwarded port taken meanwhile by
        another program: ``recover`` brings each session back, same id, same ports except
        the taken one."""
        started = time.perf_counter()
        row = self.others.setdefault("host restart: every QEMU and passt SIGKILLed", Row())
        extra = fpj("fork", self.first)[0]["id"]
        self.ledger.seen.add(extra)
        ports_before = {s["id"]: s["ports"] for s in fpj("ls")}
        for pid, _ in home_processes(self.home, self.ledger.seen):
            # A passt may be gone already: given its QEMU connection (--fd), it quits once that
            # QEMU (killed just before) hangs up — found in CI inside the Debian 13 root.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        row.injected += 1
        time.sleep(0.5)
        states = {s["id"]: s["state"] for s in fpj("ls")}
        if set(states.values()) != {"crashed"}:
            row.violations.append(f"after the kill: {states}")
        squatter = socket.socket()  # another program took the fork's port
        squatter.bind(("127.0.0.1", ports_before[extra][0]["host_port"]))
        squatter.listen()
        try:
            done = fp("recover", "--json")
        finally:
            squatter.close()
        if done.returncode != 0:
            row.violations.append(f"recover: rc {done.returncode}: {done.stderr.strip()}")
        after = {s["id"]: s for s in fpj("ls")}
        for sid in states:
            s = after.get(sid)
            if s is None or s["state"] != "running":
                row.violations.append(f"{sid} after recover: {s}")
                continue
            same = [p["host_port"] for p in s["ports"]] == [
                p["host_port"] for p in ports_before[sid]
            ]
            if same == (sid == extra):  # kept where free, moved where taken
                row.violations.append(f"{sid}'s ports: {ports_before[sid]} → {s['ports']}")
        if self.marker_of(self.session) is None:
            row.violations.append("the recovered session does not answer")
        fp("rm", extra)
        self.settle(row, started)
        print(f"  host restart  violations {len(row.violations)}", flush=True)

    def disk_full(self, delays_s: list[float]) -> None:
        """A home on a small tmpfs, filled by another writer while a checkpoint writes
        (``delay`` s after its staging directory appears, its free-space check passed):
        the checkpoint fails with one line, leaves nothing, and the next one (space
        freed) works and restores its marker."""
        root = self.home.root / "diskfull-home"
        root.mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200m", "tmpfs", str(root)], check=True)
        small = Home(root)
        env = {"FORKPOINT_HOME": str(root), "FORKPOINT_DISK_RESERVE": "0"}
        try:
            for shared in ("images", "cache"):
                (root / shared).symlink_to((self.home.root / shared).resolve())
            made = fp("create", "--memory", "256", "--json", env=env)
            session = json.loads(made.stdout)["id"]
            for delay in delays_s:
                self._fill_during_checkpoint(small, session, env, delay)
        finally:
            for s in json.loads(fp("ls", "--json", env=env).stdout or "[]"):
                fp("rm", s["id"], env=env)
            subprocess.run(["umount", "--lazy", str(root)], check=False)

    def _fill_during_checkpoint(
        self, small: Home, session: str, env: dict[str, str], delay: float
    ) -> None:
        started = time.perf_counter()
        row = self.others.setdefault("disk full during a checkpoint", Row())
        value = f"full-{delay}"
        fp("exec", session, "--", "sh", "-c", f"echo {value} > {MARKER}", env=env)
        filler = small.root / "filler"
        # Left free: just what the free-space check wants (its RAM size + 16 MiB, bounded
        # from above), so the check passes and the checkpoint starts.
        room = (256 + 16 + 4) << 20
        with open(filler, "wb") as f:
            st = os.statvfs(small.root)
            os.posix_fallocate(f.fileno(), 0, max(1 << 20, st.f_bavail * st.f_frsize - room))
        pipe = subprocess.PIPE
        proc = subprocess.Popen(
            [FORKPOINT, "checkpoint", session], env={**BASE_ENV, **env}, stdout=pipe,
            stderr=pipe, text=True,
        )  # fmt: skip
        # Once its staging directory exists (its free-space check passed), plus ``delay``,
        # another writer takes the rest, a MiB at a time (what it got, it keeps).
        limit = time.monotonic() + 60
        while not any(small.checkpoints.glob(".tmp-*")) and time.monotonic() < limit:
            time.sleep(0.001)
        time.sleep(delay)
        block = b"\xa5" * (1 << 20)
        with open(small.root / "filler2", "wb", buffering=0) as f:
            try:
                while proc.poll() is None:
                    f.write(block)
            except OSError:
                pass  # full
        _, err = proc.communicate(timeout=300)
        full = proc.returncode != 0
        row.injected += full
        found: list[str] = []
        if full and (proc.returncode < 0 or len(err.strip().splitlines()) != 1):
            found.append(f"rc {proc.returncode}: {err.strip()[-300:]}")
        elif full and re.match(r"error: \w+(Error|Exception)\b", err):
            found.append(f"a bare Python exception: {err.strip()}")  # say what happened
        filler.unlink()
        (small.root / "filler2").unlink()
        store = Store.open(small)
        try:
            Runtime(small, store).gc()  # what the next operation does
            found += check_home(small, store)
        finally:
            store.close()
        again = fp("checkpoint", session, "--json", env=env)
        if again.returncode != 0:
            found.append(f"after freeing space: {again.stderr.strip()}")
        else:
            fork = fp("fork", json.loads(again.stdout)["id"], "--json", env=env)
            if fork.returncode != 0:
                found.append(f"a fork after freeing space: {fork.stderr.strip()}")
            else:
                fork_id = json.loads(fork.stdout)[0]["id"]
                shown = fp("exec", fork_id, "--", "cat", MARKER, env=env).stdout.strip()
                fp("rm", fork_id, env=env)
                if shown != value:
                    found.append(f"the checkpoint after freeing space shows {shown!r}")
        for c in reversed(json.loads(fp("checkpoints", session, "--json", env=env).stdout)):
            fp("checkpoint", "rm", c["id"], env=env)  # room for the next round
        row.recovered += full and not found
        row.violations += found
        for problem in found:
            print(f"    VIOLATION {problem}", flush=True)
        row.seconds += time.perf_counter() - started
        print(f"  disk full after {delay} s: rc {proc.returncode} {err.strip()[:150]} "
              f"violations {len(row.violations)}", flush=True)  # fmt: skip

    # -- the whole campaign --------------------------------------------------------------

    def run(
        self, ops: list[str], walk: bool, crashes: int, quick_ops: list[str], sample: int = 0
    ) -> None:
        """Every point of every operation (``walk``; else of ``quick_ops``, and ``sample``
        random points of each other one), then random points until ``crashes`` in all."""
        self.setup()
        traces = {op: self.trace(op) for op in ops}
        for op, points in traces.items():
            print(f"{op}: {len(points)} points: {' '.join(points)}", flush=True)
        done = 0
        for op in ops:
            if walk or op in quick_ops:
                chosen = list(range(1, len(traces[op]) + 1))
            else:
                chosen = self.rng.sample(range(1, len(traces[op]) + 1), sample)
            for nth in chosen:
                self.crash(op, nth, traces[op])
                done += 1
        while done < crashes:
            op = self.rng.choice(ops)
            self.crash(op, self.rng.randrange(1, len(traces[op]) + 1), traces[op])
            done += 1

    def report(self, out: Path, restores: list[str], wall_s: float) -> dict[str, Any]:
        data: dict[str, Any] = {
            "crash_points": [
                {"operation": op, "point": point, "injected": r.injected, "recovered": r.recovered,
                 "violations": r.violations, "seconds": round(r.seconds, 1)}
                for (op, point), r in sorted(self.rows.items())
            ],
            "other_faults": [
                {"fault": what, "injected": r.injected, "recovered": r.recovered,
                 "violations": r.violations, "seconds": round(r.seconds, 1)}
                for what, r in self.others.items()
            ],
            "restores_checked": len(self.ledger.checkpoints),
            "restore_violations": restores,
            "wall_s": round(wall_s, 1),
        }  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        (out / "faults.json").write_text(json.dumps(data, indent=2))
        lines = ["| operation | crash point | injected | recovered | invariant violations |",
                 "|---|---|---:|---:|---:|"]  # fmt: skip
        for row in data["crash_points"]:
            lines.append(f"| {row['operation']} | `{row['point']}` | {row['injected']} | "
                         f"{row['recovered']} | {len(row['violations'])} |")  # fmt: skip
        lines += [
            "",
            "| fault | injected | recovered | invariant violations |",
            "|---|---:|---:|---:|",
        ]
        for row in data["other_faults"]:
            lines.append(
                f"| {row['fault']} | {row['injected']} | {row['recovered']} "
                f"| {len(row['violations'])} |"
            )
        total = sum(r["injected"] for r in data["crash_points"])
        lines += [
            "",
            f"{total} crashes injected; {len(self.ledger.checkpoints)} checkpoints restored "
            f"and their markers compared ({len(restores)} wrong); {wall_s / 60:.1f} min.",
        ]
        (out / "faults.md").write_text("\n".join(lines) + "\n")
        return data

    def teardown(self) -> None:
        """Every session, then every checkpoint the campaign made (newest first)."""
        for s in fpj("ls"):
            fp("rm", s["id"])
        for c in reversed(fpj("checkpoints")):
            fp("checkpoint", "rm", c["id"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the reduced campaign of make test")
    parser.add_argument("--crashes", type=int, default=200, help="crashes in all (full run)")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--out", type=Path, default=Path("faults-out"))
    parser.add_argument(
        "--others-only", action="store_true", help="skip the crash points: the other faults"
    )
    args = parser.parse_args(argv)
    ops = ["create", "checkpoint", "fork", "rollback", "rm", "checkpoint-rm", "chain-rm"]
    before = os.environ.get(GRACE_ENV)
    os.environ[GRACE_ENV] = "0"  # the campaign's own in-process GC (see BASE_ENV)
    campaign = Campaign(args.seed)
    started = time.perf_counter()
    try:
        if args.quick:  # every checkpoint point, one random point of each other operation
            campaign.run(ops, walk=False, crashes=0, quick_ops=["checkpoint"], sample=1)
            campaign.damage(["state bytes-flipped", "ram truncated", "manifest.json bytes-flipped"])
            campaign.during(  # its regression test: a dead passt was never replaced
                "passt SIGKILL during checkpoint", ["checkpoint", campaign.session],
                campaign.kill_vm(signal.SIGKILL, "passt"), 0.0,
            )  # fmt: skip
            campaign.host_restart()
            campaign.disk_full([0.0])
        else:
            if args.others_only:
                campaign.setup()
            else:
                campaign.run(ops, walk=True, crashes=args.crashes, quick_ops=[])
            campaign.process_faults()
            campaign.races(3)
            campaign.damage([f"{f} {h}" for f in ("state", "ram", "manifest.json")
                             for h in ("truncated", "bytes-flipped")])  # fmt: skip
            campaign.host_restart()
            campaign.disk_full([0.0, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2])
        restores = campaign.check_restores()
        return campaign.report(args.out, restores, time.perf_counter() - started)
    finally:
        campaign.teardown()
        if before is None:
            os.environ.pop(GRACE_ENV, None)
        else:
            os.environ[GRACE_ENV] = before


if __name__ == "__main__":
    result = main()
    bad = sum(len(r["violations"]) for r in result["crash_points"] + result["other_faults"])
    bad += len(result["restore_violations"])
    print(f"violations: {bad}")
    sys.exit(1 if bad else 0)
