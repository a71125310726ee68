"""``forkpoint image build|ls|rm``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from forkpoint.cli import mirror
from forkpoint.cli.output import JSON_OPTION, console, emit_json, err_console, reports_errors

if TYPE_CHECKING:
    from forkpoint.images import Progress as ProgressFn

__all__ = ["register"]


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


@contextmanager
def _progress_reporter() -> Iterator[ProgressFn]:
    """A ``progress(stage, detail)`` callback: a live rich line on a terminal, else lines."""
    if not err_console.is_terminal:

        def plain(stage: str, detail: str) -> None:
            # Not a terminal (a log, a test): skip apt's chatter, keep the milestones.
            if stage == "check":
                return  # keeps a bad-package failure to its one error line
            if stage == "source":  # podman's steps, not every line each step prints
                if detail.startswith(("STEP", "podman", "resolving", "COMMIT", "Error")):
                    err_console.print(
                        f"{stage}: {detail}", markup=False, highlight=False, soft_wrap=True
                    )
                return
            if stage != "rootfs" or detail.startswith(
                (
                    "I:",
                    "E:",
                    "W:",
                    "mmdebstrap",
                    "creating",
                    "reusing",
                    "copying",
                    "unpacking",
                    "adding",
                )
            ):
                err_console.print(
                    f"{stage}: {detail}", markup=False, highlight=False, soft_wrap=True
                )

        yield plain
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[stage]:<9}"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=None, stage="image")
        started = time.monotonic()

        def rich(stage: str, detail: str) -> None:
            bar.update(task, description=escape(detail[:90]), stage=stage)
            if stage in {"source", "kernel", "initramfs", "rootfs", "finish"} and detail.startswith(
                ("fetching", "packing", "mmdebstrap", "reusing", "creating", "writing", "STEP",
                 "copying", "unpacking", "adding")
            ):  # fmt: skip
                elapsed = time.monotonic() - started
                bar.console.print(f"[dim]{elapsed:6.1f}s[/] {escape(detail)}")

        yield rich


def register(app: typer.Typer) -> None:
    image_app = typer.Typer(help="Build and list guest images.", no_args_is_help=True)
    app.add_typer(image_app, name="image")
    mirror.register(image_app)

    @image_app.command("build")
    @reports_errors
    def build(
        name: str = typer.Argument("default", help="Image name."),
        packages: str = typer.Option(
            "", "--packages", help="Extra Debian packages, comma-separated (e.g. git,curl)."
        ),
        dockerfile: Annotated[
            Path | None,
            typer.Option(help="Build this Dockerfile with podman and use the result."),
        ] = None,
        context: Annotated[
            Path | None,
            typer.Option(help="The Dockerfile's build context (default: its directory)."),
        ] = None,
        build_arg: Annotated[
            list[str] | None,
            typer.Option("--build-arg", help="K=V for the Dockerfile's ARG (repeatable)."),
        ] = None,
        from_oci: Annotated[
            str | None,
            typer.Option(
                "--from-oci",
                help="An OCI layout directory, a docker/podman save archive, or an image in "
                "the local container storage.",
            ),
        ] = None,
        start: Annotated[
            bool,
            typer.Option(
                "--start/--no-start",
                help="OCI images: run ENTRYPOINT/CMD in the background in every session.",
            ),
        ] = True,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Build a guest image (kernel, initramfs, root disk); cached by recipe hash.

        By default a minimal Debian (plus --packages); with --dockerfile or --from-oci, an
        OCI image's root filesystem (its ENV, WORKDIR and USER become the defaults of
        commands in its sessions).
        """
        from forkpoint.errors import InvalidInput
        from forkpoint.images import Recipe, build_image, build_oci_image
        from forkpoint.images.oci import parse_build_args

        oci = dockerfile is not None or from_oci is not None
        if oci and packages:
            raise InvalidInput("--packages is for Debian images: use RUN in a Dockerfile")
        if not oci and (context is not None or build_arg):
            raise InvalidInput("--context and --build-arg need --dockerfile")
        started = time.monotonic()
        with _progress_reporter() as report:
            if oci:
                image = build_oci_image(
                    name, dockerfile=dockerfile, context=context,
                    build_args=parse_build_args(build_arg or []), ref=from_oci,
                    start=start, progress=report,
                )  # fmt: skip
            else:
                image = build_image(Recipe.create(name, packages or None), progress=report)
        elapsed = time.monotonic() - started
        if as_json:
            emit_json(image.to_dict())
            return
        console.print(
            f"[bold green]image[/] {escape(image.name)} [cyan]{image.hash}[/] "
            f"kernel {image.kernel_version}, {image.recipe.suite}, "
            f"{_size(image.size_bytes)} ({elapsed:.1f} s)"
        )
        console.print(f"  source:   {escape(_source(image.source))}", highlight=False)
        if image.config is not None:
            console.print(f"  defaults: {escape(_defaults(image.config))}", highlight=False)
        else:
            console.print(
                f"  packages: {escape(', '.join(image.recipe.packages))}", highlight=False
            )
        console.print(f"  dir:      {escape(str(image.dir))}", highlight=False)

    @image_app.command("ls")
    @reports_errors
    def ls(as_json: bool = JSON_OPTION) -> None:
        """List built images and where each came from."""
        from forkpoint.images import list_images
        from forkpoint.images.catalog import current_hashes

        images = list_images()
        current = current_hashes()
        if as_json:
            emit_json(
                [
                    {**image.to_dict(), "current": current.get(image.name) == image.hash}
                    for image in images
                ]
            )
            return
        if not images:
            console.print("no images yet: run [bold]forkpoint image build[/]")
            return
        table = Table(box=None, header_style="bold")
        for column in ("NAME", "HASH", "SIZE", "CREATED"):  # the kernel: --json
            table.add_column(column, no_wrap=True)
        table.add_column("SOURCE", ratio=1, overflow="fold")
        for image in images:
            latest = current.get(image.name) == image.hash
            table.add_row(
                escape(image.name) if latest else f"[dim]{escape(image.name)}[/]",
                image.hash[:12],
                _size(image.size_bytes),
                image.created_at.astimezone().strftime("%m-%d %H:%M"),
                escape(_source(image.source, digest=False)),
            )
        console.print(table)
        if len(current) < len(images):
            console.print("[dim]dimmed: superseded by a newer build of the same name[/]")

    @image_app.command("rm")
    @reports_errors
    def rm(
        name: str = typer.Argument(..., help="Image name (every build of it goes)."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Remove an image no session or checkpoint needs (its templates go with it)."""
        from forkpoint.cli.core import run

        removed = run(lambda runtime: runtime.remove_image(name))
        if as_json:
            emit_json({"name": name, "removed": removed})
            return
        console.print(f"removed image {escape(name)} ({', '.join(h[:12] for h in removed)})")


def _source(source: dict[str, str], *, digest: bool = True) -> str:
    """``debian bookworm +git``, ``dockerfile ./Dockerfile @1a2b3c4d5e6f`` (config digest)."""
    text = f"{source.get('kind', '?')} {source.get('ref', '')}".strip()
    config = source.get("digest")
    return f"{text} @{config.partition(':')[2][:12]}" if config and digest else text


def _defaults(config: dict[str, Any]) -> str:
    parts = [f"user {config.get('user') or 'root'}", f"workdir {config.get('cwd') or '-'}"]
    if config.get("env"):
        parts.append("env " + " ".join(sorted(config["env"])))
    if config.get("start"):
        parts.append("starts " + " ".join(config["start"]))
    return "; ".join(parts)
