"""``forkpoint image build|ls``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

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
            if stage != "rootfs" or detail.startswith(
                ("I:", "E:", "W:", "mmdebstrap", "creating", "reusing")
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
            if stage in {"kernel", "initramfs", "rootfs", "finish"} and detail.startswith(
                ("fetching", "packing", "mmdebstrap", "reusing", "creating", "writing")
            ):
                elapsed = time.monotonic() - started
                bar.console.print(f"[dim]{elapsed:6.1f}s[/] {escape(detail)}")

        yield rich


def register(app: typer.Typer) -> None:
    image_app = typer.Typer(help="Build and list guest images.", no_args_is_help=True)
    app.add_typer(image_app, name="image")

    @image_app.command("build")
    @reports_errors
    def build(
        name: str = typer.Argument("default", help="Image name."),
        packages: str = typer.Option(
            "", "--packages", help="Extra Debian packages, comma-separated (e.g. git,curl)."
        ),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Build a guest image (kernel, initramfs, root disk); cached by recipe hash."""
        from forkpoint.images import Recipe, build_image

        recipe = Recipe.create(name, packages or None)
        started = time.monotonic()
        with _progress_reporter() as report:
            image = build_image(recipe, progress=report)
        elapsed = time.monotonic() - started
        if as_json:
            emit_json(image.to_dict())
            return
        console.print(
            f"[bold green]image[/] {escape(image.name)} [cyan]{image.hash}[/] "
            f"kernel {image.kernel_version}, {image.recipe.suite}, "
            f"{_size(image.size_bytes)} ({elapsed:.1f} s)"
        )
        console.print(f"  packages: {escape(', '.join(image.recipe.packages))}", highlight=False)
        console.print(f"  dir:      {escape(str(image.dir))}", highlight=False)

    @image_app.command("ls")
    @reports_errors
    def ls(as_json: bool = JSON_OPTION) -> None:
        """List built images."""
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
        for column in ("NAME", "HASH", "KERNEL", "SIZE", "CREATED"):
            table.add_column(column, no_wrap=True)
        table.add_column("PACKAGES", ratio=1)
        for image in images:
            latest = current.get(image.name) == image.hash
            table.add_row(
                escape(image.name) if latest else f"[dim]{escape(image.name)}[/]",
                image.hash[:12],
                image.kernel_version,
                _size(image.size_bytes),
                image.created_at.astimezone().strftime("%m-%d %H:%M"),
                escape(", ".join(image.recipe.packages)),
            )
        console.print(table)
        if len(current) < len(images):
            console.print("[dim]dimmed: superseded by a newer build of the same name[/]")
