"""The ``forkpoint`` command.

:func:`main` is the entry point: the most frequent calls of a CLI-driven agent
(``ls --json``, ``show S --json``, ``exec``) take the quick path, which loads no CLI
framework (:mod:`forkpoint.cli.quick`); everything else is the typer app
(:mod:`forkpoint.cli.app`).
"""

import sys

__all__ = ["main"]


def main() -> None:
    from forkpoint.cli.quick import run_quick

    code = run_quick(sys.argv[1:])
    if code is None:
        from forkpoint.cli.app import main as full

        full()
    else:
        sys.exit(code)
