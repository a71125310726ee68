"""``forkpoint image mirror start|stop|status|push|standins``: the registry mirror that
forkpoint's builds pull ``docker.io`` images through (:mod:`forkpoint.images.mirror`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from forkpoint.cli.output import JSON_OPTION, console, emit_json, err_console, reports_errors

__all__ = ["register"]


def _print_status(as_json: bool) -> None:
    from forkpoint.images.mirror import mirror_status

    status = mirror_status()
    if as_json:
        emit_json(status.to_dict())
        return
    state = "running" if status.running else "stopped"
    console.print(f"mirror {state} at {status.address or '-'} (docker.io's mirror for builds: "
                  f"{'yes' if status.configured else 'no'})")  # fmt: skip
    for image in status.images:
        console.print(f"  {escape(image)}", highlight=False)


def register(image_app: typer.Typer) -> None:
    mirror_app = typer.Typer(
        help="A registry mirror on 127.0.0.1 that builds pull docker.io images through "
        "(for machines without internet).",
        no_args_is_help=True,
    )
    image_app.add_typer(mirror_app, name="mirror")

    @mirror_app.command("start")
    @reports_errors
    def start(
        port: Annotated[int, typer.Option(help="The registry's port on 127.0.0.1.")] = 5000,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Run the mirror (Debian's docker-registry) and make it docker.io's for builds."""
        from forkpoint.images.mirror import start_mirror

        start_mirror(port)
        _print_status(as_json)

    @mirror_app.command("stop")
    @reports_errors
    def stop() -> None:
        """Stop the mirror; builds pull from docker.io again (its images are kept)."""
        from forkpoint.images.mirror import stop_mirror

        stop_mirror()
        console.print("mirror stopped")

    @mirror_app.command("status")
    @reports_errors
    def status(as_json: bool = JSON_OPTION) -> None:
        """Whether the mirror runs, where, and the images it holds."""
        _print_status(as_json)

    @mirror_app.command("push")
    @reports_errors
    def push(
        source: Annotated[str, typer.Argument(help="An image in the local container storage.")],
        name: Annotated[str, typer.Argument(help="The docker.io name it stands for.")],
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Put an image built here into the mirror under a docker.io name (ubuntu:22.04)."""
        from forkpoint.images.mirror import push as push_image

        target = push_image(source, name)
        if as_json:
            emit_json({"source": source, "name": name, "mirror": target})
            return
        console.print(f"{escape(name)} -> {escape(target)}", highlight=False)

    @mirror_app.command("standins")
    @reports_errors
    def standins(
        names: Annotated[
            list[str] | None,
            typer.Argument(help="Public images to stand in for (default: all known)."),
        ] = None,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Build Debian stand-ins for public images E2B templates start from and push them."""
        from forkpoint.images.mirror import build_stand_ins

        def log(line: str) -> None:
            err_console.print(line, markup=False, highlight=False)

        pushed = build_stand_ins(names or None, log=log)
        if as_json:
            emit_json({"pushed": pushed})
            return
        console.print(f"stand-ins in the mirror: {escape(', '.join(pushed))}", highlight=False)
