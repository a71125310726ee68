"""forkpoint_guest: a program in a forkpoint guest learns that its machine was restored.

A forkpoint session can be forked, rolled back and resumed: every process continues from
the checkpoint's moment, in every fork alike — the same ``random`` state, the same cached
nonces and leases. The agent tells the processes that ask, after each restore (create,
fork, rollback, resume), once the kernel's RNG and clock are fresh::

    import forkpoint_guest

    forkpoint_guest.on_restore(forkpoint_guest.reseed)   # a fresh `random` in every fork
    forkpoint_guest.on_restore(lambda restore: pool.clear())

Standard library only; runs on the image's own Python. The contract underneath is plain
files and signals (any language can use it; ``docs/guest.md``):
``/run/forkpoint/generation``, ``/run/forkpoint/restore.json`` and a registration
``/run/forkpoint/notify/<pid>`` holding ``<signal> <start time>``. ``python3 -m
forkpoint_guest wait-restore`` (or the ``forkpoint-guest`` shell helper) waits for one.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "DEFAULT_SIGNAL",
    "generation",
    "on_restore",
    "register",
    "reseed",
    "state",
    "unregister",
    "wait_restore",
]

RUN_DIR = "/run/forkpoint"
#: The signal :func:`on_restore` asks for: a real-time one, which no program gives a
#: meaning of its own (SIGUSR1/2 often have one: nginx upgrades its binary on SIGUSR2).
DEFAULT_SIGNAL = signal.SIGRTMIN + 4

Callback = Callable[[dict[str, Any]], Any]
_callbacks: list[Callback] = []
_installed_signal: int | None = None
_seen_generation: int | None = None
_lock = threading.Lock()


def generation() -> int:
    """How many restores this machine's lineage has had (0: none yet)."""
    try:
        with open(os.path.join(RUN_DIR, "generation")) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def state() -> dict[str, Any]:
    """The latest restore: ``generation``, ``event`` (create/fork/rollback/resume),
    ``session``, ``checkpoint``, ``hostname``, ``at``, ``notified``, ``hooks``."""
    try:
        with open(os.path.join(RUN_DIR, "restore.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {"generation": 0}
    return data if isinstance(data, dict) else {"generation": 0}


def register(signum: int = DEFAULT_SIGNAL, pid: int | None = None) -> None:
    """Ask for ``signum`` after every restore, for ``pid`` (default: this process). The
    registration names the process by its start time too, so a reused pid gets nothing."""
    pid = os.getpid() if pid is None else pid
    started = _start_time(pid)
    if started is None:
        raise ProcessLookupError(f"no process {pid}")
    notify = os.path.join(RUN_DIR, "notify")
    tmp = os.path.join(notify, f".{pid}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(f"{int(signum)} {started}\n")
    os.replace(tmp, os.path.join(notify, str(pid)))


def unregister(pid: int | None = None) -> None:
    """Stop asking (a process that exits needs not: its registration is dropped)."""
    try:
        os.unlink(os.path.join(RUN_DIR, "notify", str(os.getpid() if pid is None else pid)))
    except FileNotFoundError:
        pass


def on_restore(callback: Callback, signum: int = DEFAULT_SIGNAL) -> None:
    """Call ``callback(state())`` after every restore of this machine, once each.

    It runs in the main thread (a signal handler: call this from the main thread), after
    the kernel RNG was reseeded and the clock set, while other threads may run on. Call it
    again to add callbacks; they run in the order added.
    """
    global _installed_signal, _seen_generation
    with _lock:
        _callbacks.append(callback)
        if _installed_signal is None:
            signal.signal(signum, _on_signal)
            _installed_signal = signum
            _seen_generation = generation()
            register(signum)


def reseed(*generators: Any) -> None:
    """Reseed ``random``'s global generator and each ``random.Random`` given from the
    kernel's entropy (fresh after a restore). Usable as an :func:`on_restore` callback."""
    random.seed()
    for generator in generators:
        if isinstance(generator, random.Random):
            generator.seed()


def wait_restore(timeout: float | None = None, since: int | None = None) -> dict[str, Any] | None:
    """Block until the generation differs from ``since`` (default: now's); return the
    new :func:`state`, or None after ``timeout`` seconds. Polls a small file every 50 ms."""
    start = generation() if since is None else since
    deadline = None if timeout is None else time.monotonic() + timeout
    while generation() == start:
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return state()


def _on_signal(signum: int, frame: Any) -> None:
    global _seen_generation
    now = generation()
    if now == _seen_generation:
        return  # a stray signal: nothing was restored since the callbacks last ran
    _seen_generation = now
    current = state()
    for callback in list(_callbacks):
        callback(current)


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # /proc/PID/stat field 22
    except (IndexError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="forkpoint-guest", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("generation", help="print the restore generation")
    commands.add_parser("state", help="print the latest restore as JSON")
    wait = commands.add_parser("wait-restore", help="wait for the next restore; print it")
    wait.add_argument(
        "--timeout", type=float, default=None, help="give up after S seconds (exit 1)"
    )
    opts = parser.parse_args(argv)
    if opts.command == "generation":
        print(generation())
    elif opts.command == "state":
        print(json.dumps(state()))
    else:
        found = wait_restore(opts.timeout)
        if found is None:
            return 1
        print(json.dumps(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
