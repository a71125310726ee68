"""After every restore — create, fork, rollback, resume — the guest's processes can know.

A restored VM resumes every process exactly as it was: a program that drew its random
state, a UUID clock sequence or a nonce before the checkpoint draws the same ones in every
fork. The agent applies each restore's identity (``identity``: clock, kernel RNG,
hostname) and then, for the processes that ask, says what happened. The contract is
language-neutral (``forkpoint_guest`` is its Python library, ``forkpoint-guest`` its
shell helper; ``docs/guest.md``):

- ``/run/forkpoint/restore.json``: ``generation``, ``event`` (create/fork/rollback/resume),
  ``session``, ``checkpoint``, ``hostname``, ``at``, the pids ``notified`` and the
  ``hooks`` run; ``/run/forkpoint/generation``: the generation alone, written after it
  (a cheap file to poll). The generation counts restores along this VM's lineage, so it
  changes at every restore: forks of one checkpoint all get the checkpoint's plus one.
- ``/run/forkpoint/notify/<pid>`` holding ``<signal> <start time>``: that process gets the
  signal once per restore, after the files above and the reseed. Only a process that
  asked gets one; a registration whose process is gone, or whose pid now names another
  process (another start time: pids are reused), or that another user wrote for a process
  not theirs, is removed instead. A rollback brings back the registrations of its moment,
  with the processes they name.
- ``/etc/forkpoint/restore.d/*``: executables run one after another by name after the
  signals, with ``FORKPOINT_EVENT``, ``FORKPOINT_GENERATION``, ``FORKPOINT_SESSION``,
  ``FORKPOINT_CHECKPOINT`` and ``FORKPOINT_HOSTNAME`` set, each killed (its process
  group) at the restore's time limit; their output goes to
  ``/var/log/forkpoint-restore.log``. A failing hook is reported, never fails the restore.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import stat
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

from ..protocol import (
    RESTORE_LISTENERS_PORT,
    HookRun,
    RestoreFacts,
    RestoreStatus,
    RestoreStatusArgs,
)
from .context import Context
from .transport import find_virtio_port

__all__ = ["HOOK_DIR", "RUN_DIR", "ListenersPort", "RestoreOps", "process_start_time"]

RUN_DIR: Final = "/run/forkpoint"
HOOK_DIR: Final = "/etc/forkpoint/restore.d"
LOG_FILE: Final = "/var/log/forkpoint-restore.log"
_REGISTRATION_MAX_BYTES: Final = 64
_HOOK_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot: ``/proc/PID/stat`` field 22), None if
    there is no such process. With the pid it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()  # the name may hold spaces and ")"
    try:
        return int(fields[19])  # field 22; fields[0] is field 3
    except (IndexError, ValueError):
        return None


class RestoreOps:
    """Tells the guest about each restore (:meth:`restored`) and answers ``restore_status``.

    The paths are parameters for tests on a host; in a guest they are the defaults.
    """

    def __init__(
        self, run_dir: str = RUN_DIR, hook_dir: str = HOOK_DIR, log_file: str = LOG_FILE
    ) -> None:
        self.run_dir = Path(run_dir)
        self.notify_dir = self.run_dir / "notify"
        self.hook_dir = Path(hook_dir)
        self.log_file = Path(log_file)
        # The generation whose hooks have finished: a VM restored while an older
        # restore's hooks ran resumes that thread too, so completion is per generation.
        # None run in a new agent (one restarted after a crash, say).
        self._hooks_done = self._generation()
        self._changed = threading.Condition()

    # -- the restore -------------------------------------------------------------------

    def restored(self, facts: RestoreFacts, hostname: str | None) -> None:
        """Publish the restore, signal the registered processes, start the hooks."""
        self.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.notify_dir.mkdir(mode=0o755, exist_ok=True)
        self.notify_dir.chmod(0o1777)  # anyone may register, no one may unregister others
        generation = self._generation() + 1
        state: dict[str, Any] = {
            "generation": generation, "event": facts.event, "session": facts.session,
            "checkpoint": facts.checkpoint, "hostname": hostname or socket.gethostname(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "notified": [],
            "hooks": [], "hooks_running": False,
        }  # fmt: skip
        self._write(state, generation)
        state["notified"] = self._notify()
        hooks = self._hooks()
        state["hooks_running"] = bool(hooks)
        self._write(state)
        if hooks:
            threading.Thread(
                target=self._run_hooks, args=(hooks, facts, state), daemon=True
            ).start()
        else:
            self._finished(generation)

    def status(self, ctx: Context, args: RestoreStatusArgs) -> RestoreStatus:
        """The latest restore as the guest saw it, waiting up to ``args.wait_s`` for its
        hooks to finish."""
        deadline = time.monotonic() + args.wait_s
        with self._changed:
            while self._hooks_done < self._generation():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        state = self._state()
        return RestoreStatus(
            generation=int(state.get("generation", 0)),
            event=state.get("event"),
            session=state.get("session"),
            checkpoint=state.get("checkpoint"),
            at=state.get("at"),
            notified=[int(p) for p in state.get("notified", [])],
            listeners=self.listeners(),
            hooks=len(self._hooks()),
            hooks_running=bool(state.get("hooks_running")),
            hook_runs=[HookRun(**run) for run in state.get("hooks", [])],
        )

    def listeners(self) -> int:
        """The processes registered now (valid registrations only)."""
        return len(self._registrations(prune=False))

    def has_hooks(self) -> bool:
        return bool(self._hooks())

    # -- files -------------------------------------------------------------------------

    def _generation(self) -> int:
        try:
            return int((self.run_dir / "generation").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _state(self) -> dict[str, Any]:
        try:
            data = json.loads((self.run_dir / "restore.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, state: dict[str, Any], generation: int | None = None) -> None:
        """``restore.json`` then (given) ``generation``, each replaced whole: a reader
        that sees the new generation finds the new state."""
        _replace(self.run_dir / "restore.json", json.dumps(state, indent=1) + "\n")
        if generation is not None:
            _replace(self.run_dir / "generation", f"{generation}\n")

    # -- signals -----------------------------------------------------------------------

    def _notify(self) -> list[int]:
        sent = []
        for pid, signum in self._registrations(prune=True):
            try:
                os.kill(pid, signum)
            except OSError:  # it exited meanwhile
                (self.notify_dir / str(pid)).unlink(missing_ok=True)
                continue
            sent.append(pid)
        return sent

    def _registrations(self, *, prune: bool) -> list[tuple[int, int]]:
        """``(pid, signal)`` of each valid registration; with ``prune`` the invalid and
        stale ones are removed."""
        found = []
        try:
            entries = list(os.scandir(self.notify_dir))
        except OSError:
            return []
        for entry in entries:
            if not entry.name.isdigit():
                continue  # a registration being written (a temporary name)
            signum = _registered_signal(entry.path, int(entry.name))
            if signum is not None:
                found.append((int(entry.name), signum))
            elif prune:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
        return sorted(found)

    # -- hooks -------------------------------------------------------------------------

    def _hooks(self) -> list[Path]:
        try:
            entries = sorted(os.scandir(self.hook_dir), key=lambda e: e.name)
        except OSError:
            return []
        return [
            Path(e.path)
            for e in entries
            if not e.name.startswith(".")
            and not e.name.endswith("~")
            and e.is_file()
            and os.access(e.path, os.X_OK)
        ]

    def _run_hooks(self, hooks: list[Path], facts: RestoreFacts, state: dict[str, Any]) -> None:
        env = {
            "PATH": _HOOK_PATH, "HOME": "/root", "LANG": "C.UTF-8",
            "FORKPOINT_EVENT": facts.event, "FORKPOINT_GENERATION": str(state["generation"]),
            "FORKPOINT_SESSION": facts.session, "FORKPOINT_CHECKPOINT": facts.checkpoint,
            "FORKPOINT_HOSTNAME": str(state["hostname"]),
        }  # fmt: skip
        runs = []
        try:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_file, "ab", buffering=0) as log:
                for hook in hooks:
                    runs.append(asdict(_run_hook(hook, env, facts.hook_timeout_s, log)))
        except OSError:  # the log cannot be written: the hooks' results still are
            pass
        finally:
            if self._generation() == state["generation"]:  # no newer restore since
                self._write({**state, "hooks": runs, "hooks_running": False})
            self._finished(int(state["generation"]))

    def _finished(self, generation: int) -> None:
        with self._changed:
            self._hooks_done = max(self._hooks_done, generation)
            self._changed.notify_all()


def _run_hook(hook: Path, env: dict[str, str], timeout_s: float, log: Any) -> HookRun:
    log.write(f"== {time.strftime('%H:%M:%S')} {hook.name} ({env['FORKPOINT_EVENT']})\n".encode())
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [str(hook)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=env, cwd="/", start_new_session=True,
        )  # fmt: skip
    except OSError as error:
        log.write(f"== {hook.name} could not start: {error.strerror}\n".encode())
        return HookRun(hook.name, None, 0.0, error=str(error.strerror or error))
    try:
        code: int | None = proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it started too
        proc.wait()
        code, timed_out = None, True
    took = (time.monotonic() - started) * 1000
    end = f"killed at its limit of {timeout_s:g} s" if timed_out else f"exit {code}"
    log.write(f"== {hook.name}: {end} ({took:.0f} ms)\n".encode())
    return HookRun(hook.name, code, round(took, 1), timed_out=timed_out)


def _registered_signal(path: str, pid: int) -> int | None:
    """The signal a registration file asks for, if it is valid: a regular file written
    by root or by the owner of the process it names, holding ``<signal> <start time>``
    where the start time is that process's (it still runs, under that pid)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        text = os.read(fd, _REGISTRATION_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    parts = text.split()
    if (
        len(text) > _REGISTRATION_MAX_BYTES
        or len(parts) != 2
        or not all(p.isdigit() for p in parts)
    ):
        return None
    signum, started = int(parts[0]), int(parts[1])
    if not 1 <= signum <= 64 or process_start_time(pid) != started:
        return None
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    return signum if info.st_uid in (0, owner) else None


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    os.replace(tmp, path)


_IN_CHANGES: Final = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800  # any change
_IN_NONBLOCK_CLOEXEC: Final = os.O_NONBLOCK | os.O_CLOEXEC
_RECHECK_S: Final = 30.0  # a directory made since, a registered process that exited


class ListenersPort:
    """Holds the guest's restore-listeners port open while there is someone to tell of a
    restore — a registered process or a hook — and closed otherwise.

    QEMU shows the host whether the port is open (``query-chardev``), and a checkpoint
    records it: a restore of a checkpoint with listeners returns only once the guest has
    told them, one without pays nothing for it. Re-checked whenever the registrations or
    the hooks change (inotify) and every :data:`_RECHECK_S`: a process that exited
    without unregistering keeps the port open until then, which only costs a restore
    its wait for the guest.
    """

    def __init__(self, restores: RestoreOps, port: str = RESTORE_LISTENERS_PORT) -> None:
        self.restores = restores
        self.port = port
        self._fd: int | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="restore-listeners", daemon=True).start()

    def refresh(self) -> None:
        wanted = self.restores.listeners() > 0 or self.restores.has_hooks()
        with self._lock:
            if wanted and self._fd is None:
                try:
                    path = find_virtio_port(self.port, timeout=0)
                    self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
                except OSError:  # a VM without the port (an older QEMU layout)
                    return
            elif not wanted and self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _watch(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        inotify = libc.inotify_init1(_IN_NONBLOCK_CLOEXEC)
        while True:
            if inotify >= 0:
                for directory in (self.restores.notify_dir, self.restores.hook_dir):
                    libc.inotify_add_watch(inotify, str(directory).encode(), _IN_CHANGES)
            self.refresh()
            ready = select.select([inotify], [], [], _RECHECK_S)[0] if inotify >= 0 else []
            if ready:
                time.sleep(0.01)  # a burst of changes (a file written, then renamed) is one
                with contextlib.suppress(OSError):
                    os.read(inotify, 65536)
            elif inotify < 0:
                time.sleep(_RECHECK_S)
