"""``forkpoint image build|ls``."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    image_app = typer.Typer(help="Build and list guest images.", no_args_is_help=True)
    app.add_typer(image_app, name="image")
