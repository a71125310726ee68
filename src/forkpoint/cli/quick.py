"""The quick path of ``forkpoint``: ``ls --json``, ``show S --json`` and ``exec`` without
loading the CLI framework.

An agent that drives forkpoint through its CLI pays the command's start-up on every call,
and typer + rich alone take longer to import than these commands take to run. Their plain
forms are recognised here with a few lines of parsing and run through the same functions
as the typer commands (:mod:`forkpoint.cli.core`). Anything else — other options,
``--help``, the human-readable ``ls``/``show`` tables, a usage error — is left to the
typer app, which defines and documents the whole CLI.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from forkpoint.cli import core

__all__ = ["recognise", "run_quick"]

_EXEC_FLAGS = {"--json", "--background", "-b"}
_EXEC_OPTIONS = {"--cwd", "--env", "-e", "--timeout"}


def run_quick(argv: list[str]) -> int | None:
    """Run ``argv`` if it is a quick form and return the exit code; None if it is not."""
    recognised = recognise(argv)
    if recognised is None:
        return None
    command, as_json = recognised
    try:
        return command()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # reported exactly as the typer commands report it
        from forkpoint.cli.output import report

        return report(error, as_json)


def recognise(argv: list[str]) -> tuple[Callable[[], int], bool] | None:
    """The command to run for ``argv`` and whether it reports JSON, if a quick form."""
    match argv:
        case ["ls", "--json"]:
            return lambda: _emit(core.list_sessions()), True
        case ["show", "--json", session] | ["show", session, "--json"] if session[:1] != "-":
            return lambda: _emit(core.get_session(session)), True
        case ["exec", session, *rest] if session[:1] != "-":
            return _exec(session, rest)
    return None


def _emit(value: object) -> int:
    core.emit_json(value)
    return 0


def _exec(session: str, rest: list[str]) -> tuple[Callable[[], int], bool] | None:
    """``exec SESSION [--json] [-b] [--cwd D] [--env K=V]... [--timeout S] [--] CMD...``"""
    flags: set[str] = set()
    options: dict[str, list[str]] = {}
    while rest and rest[0] != "--" and rest[0].startswith("-"):
        name, eq, value = rest[0].partition("=")
        if name in _EXEC_FLAGS and not eq:
            flags.add(name)
            rest = rest[1:]
        elif name in _EXEC_OPTIONS and (eq or len(rest) > 1):
            options.setdefault(name, []).append(value if eq else rest[1])
            rest = rest[1:] if eq else rest[2:]
        else:
            return None
    explicit = rest[:1] == ["--"]
    command = rest[1:] if explicit else rest
    # Without `--`, typer would read a later option-like word as an option: let it.
    if not command or (not explicit and any(word.startswith("-") for word in command)):
        return None
    if len(options.get("--cwd", [])) > 1 or len(options.get("--timeout", [])) > 1:
        return None
    try:
        timeout = float(options["--timeout"][0]) if "--timeout" in options else None
    except ValueError:
        return None
    cwd = options.get("--cwd", [None])[0]
    env_pairs = options.get("--env", []) + options.get("-e", [])
    as_json = "--json" in flags
    run = functools.partial(
        core.exec_command, session, command, background=bool(flags & {"--background", "-b"}),
        cwd=cwd, env_pairs=env_pairs, timeout=timeout, as_json=as_json,
    )  # fmt: skip
    return run, as_json
