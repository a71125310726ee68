"""The ``forkpoint`` command: one typer app; each area registers its commands."""

from __future__ import annotations

import typer

__all__ = ["app", "main"]

app = typer.Typer(
    name="forkpoint",
    help="MicroVM sessions you can checkpoint, fork and roll back in milliseconds.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    # Imported here so each area's module stays independent of the others.
    from forkpoint.cli import (
        bench,
        browser,
        checkpoints,
        cluster,
        demo,
        e2b,
        events,
        guest,
        history,
        images,
        metrics,
        serve,
        sessions,
        shell,
        ui,
        volumes,
        warm,
    )

    images.register(app)
    sessions.register(app)
    guest.register(app)
    shell.register(app)
    checkpoints.register(app)
    cluster.register(app)
    browser.register(app)
    history.register(app)
    metrics.register(app)
    events.register(app)
    demo.register(app)
    bench.register(app)
    serve.register(app)
    e2b.register(app)
    ui.register(app)
    volumes.register(app)
    warm.register(app)


def main() -> None:
    _register_all()
    app()


if __name__ == "__main__":
    main()
