"""Shared plumbing of the session commands: one Runtime per command, spinners, rendering.

Each command is one ``asyncio.run`` around one ``Runtime.open()`` … ``close()``. The
runtime is imported lazily so ``forkpoint --help`` and the image commands stay fast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from rich.markup import escape

from forkpoint.cli.output import console, err_console
from forkpoint.errors import InvalidInput

if TYPE_CHECKING:
    from forkpoint.runtime import Checkpoint, Runtime, Session

__all__ = [
    "Timer",
    "describe_checkpoint",
    "format_ms",
    "parse_env",
    "print_ports",
    "print_session",
    "run",
    "spinner",
    "styled_state",
]

T = TypeVar("T")


def run(operation: Callable[[Runtime], Awaitable[T]]) -> T:
    """Open the runtime, await ``operation(runtime)``, close it; returns its result."""
    from forkpoint.runtime import Runtime

    async def main() -> T:
        runtime = Runtime.open()
        try:
            return await operation(runtime)
        finally:
            runtime.close()

    return asyncio.run(main())


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


def format_ms(ms: float) -> str:
    """``95 ms`` below 10 s, else ``12.3 s``."""
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def parse_env(pairs: list[str] | None) -> dict[str, str]:
    """``["K=V", …]`` → dict. :raises InvalidInput: an item without ``=`` or an empty key."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--env must be KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


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
        )


def print_session(session: Session, headline: str) -> None:
    """``headline`` then the session's forwarded URLs (create, fork, rollback)."""
    console.print(headline, highlight=False)
    print_ports(session)


def describe_checkpoint(checkpoint: Checkpoint) -> str:
    name = f" ({escape(checkpoint.name)})" if checkpoint.name else ""
    return f"[cyan]{checkpoint.id}[/]{name}"
