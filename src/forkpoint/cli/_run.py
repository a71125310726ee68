"""Shared plumbing of the session commands: spinners, timers, rendering (rich).

Running an operation on a runtime (``run``) and ``parse_env`` live in
:mod:`forkpoint.cli.core`, which the quick path uses without rich; re-exported here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from forkpoint.cli.core import parse_env, run
from forkpoint.cli.output import console, err_console

if TYPE_CHECKING:
    from forkpoint.models import Checkpoint, Session

__all__ = [
    "Timer",
    "describe_checkpoint",
    "format_bytes",
    "format_ms",
    "parse_env",
    "print_ports",
    "print_session",
    "print_table",
    "run",
    "short_time",
    "spinner",
    "styled_state",
]

T = TypeVar("T")


@contextmanager
def spinner(message: str, enabled: bool = True) -> Iterator[None]:
    """A rich status spinner on stderr while a long operation runs (terminals only)."""
    if not enabled or not err_console.is_terminal:
        yield
        return
    with err_console.status(message):
        yield


class Timer:
    """Wall-clock duration of a block, in ms (``with Timer() as t: …; t.ms``)."""

    def __init__(self) -> None:
        self._started = 0.0
        self.ms = 0.0

    def __enter__(self) -> Timer:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ms = (time.perf_counter() - self._started) * 1000


def print_table(table: Table) -> None:
    """Print a table without truncating ids: off a terminal (pipes, logs) rich would
    squeeze it into 80 columns, so print it at its natural width there."""
    if console.is_terminal:
        console.print(table, highlight=False)
        return
    natural = Measurement.get(console, console.options.update_width(10_000), table).maximum
    wide = Console(file=console.file, width=max(console.width, natural), highlight=False)
    wide.print(table)


def short_time(iso: str) -> str:
    """``2026-12-02T12:17:28.523Z`` → ``12-02 12:17:28`` in local time (as given if odd)."""
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    return moment.astimezone().strftime("%m-%d %H:%M:%S")


def format_ms(ms: float) -> str:
    """``95 ms`` below 10 s, else ``12.3 s``."""
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def format_bytes(n: int) -> str:
    """``512 B``, ``1.5 KiB``, ``12.0 MiB``, ``1.2 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _state_style(state: str) -> str:
    return {"running": "green", "crashed": "bold red", "stopped": "yellow"}.get(state, "")


def styled_state(state: str) -> str:
    style = _state_style(state)
    return f"[{style}]{escape(state)}[/]" if style else escape(state)


def print_ports(session: Session, indent: str = "  ") -> None:
    """One line per forwarded port: ``guest 8000 → http://127.0.0.1:43507``."""
    for port in session.ports:
        console.print(
            f"{indent}port {port.guest_port} → [link={port.url}]{port.url}[/link]",
            highlight=False,
            soft_wrap=True,
        )


def print_session(session: Session, headline: str) -> None:
    """``headline`` then the session's forwarded URLs (create, fork, rollback)."""
    console.print(headline, highlight=False, soft_wrap=True)
    print_ports(session)


def describe_checkpoint(checkpoint: Checkpoint) -> str:
    name = f" ({escape(checkpoint.name)})" if checkpoint.name else ""
    return f"[cyan]{checkpoint.id}[/]{name}"
