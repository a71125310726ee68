"""How every CLI command reports: rich text for people, ``--json`` for programs.

Errors are one line on stderr (``{"error": {...}}`` on stdout with ``--json``) and map to
the documented exit codes: 0 ok, 1 guest command failed, 2 bad input, 3 not found,
4 conflict/state, 5 internal/QEMU failure.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import click
import typer
from rich.console import Console
from rich.markup import escape

from forkpoint.cli.core import emit_json
from forkpoint.errors import ForkpointError, InternalError

__all__ = ["JSON_OPTION", "console", "emit_json", "err_console", "report", "reports_errors"]

P = ParamSpec("P")
R = TypeVar("R")

# soft_wrap: a message line stays one line (ids and URLs never broken); tables still fit.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON.")


def report(error: BaseException, as_json: bool) -> int:
    """Report ``error`` the documented way (one line; a bug is an ``internal`` error, never
    a traceback) and return the exit code."""
    if not isinstance(error, ForkpointError):
        error = InternalError(f"{type(error).__name__}: {error}")
    if as_json:
        emit_json({"error": error.to_dict()})
    # soft_wrap: an error is always ONE line, whatever the terminal width (greppable).
    err_console.print(
        f"[bold red]error:[/] {escape(error.message)}",
        markup=True,
        highlight=False,
        soft_wrap=True,
    )
    if error.log_tail and not as_json:
        err_console.print(error.log_tail, markup=False, highlight=False, style="dim")
    return error.exit_code


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn ForkpointError (and Ctrl-C) into one clear line and the right exit code."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        as_json = bool(kwargs.get("as_json", False))
        try:
            return func(*args, **kwargs)
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]")
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort, click.exceptions.ClickException):
            raise  # typer/click report these themselves (usage errors exit 2)
        except Exception as error:
            raise typer.Exit(report(error, as_json)) from None

    return wrapper
