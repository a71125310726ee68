"""``forkpoint volume create|ls|show|rm|files|put|get|mkdir|remove``: directories on the host
that outlive sessions (outside every checkpoint: forks share them, rollbacks keep them)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from forkpoint.cli._run import format_bytes, print_table, run, short_time
from forkpoint.cli.output import JSON_OPTION, console, emit_json, reports_errors

if TYPE_CHECKING:
    from forkpoint.models import Volume, VolumeEntry
    from forkpoint.runtime import Runtime

__all__ = ["register"]

_VOLUME = Annotated[str, typer.Argument(help="Volume id or name.")]
_PATH = Annotated[str, typer.Argument(help="A path in the volume (relative to its root).")]


def _print_volume(volume: Volume) -> None:
    mounted = f"  mounted by {', '.join(volume.mounts)}" if volume.mounts else ""
    console.print(f"[bold]{volume.name}[/] {volume.id}  {format_bytes(volume.size_bytes)}  "
                  f"created {short_time(volume.created_at)}{mounted}", highlight=False)  # fmt: skip


def _print_entries(entries: list[VolumeEntry]) -> None:
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("PATH", "TYPE", "SIZE", "MODE", "OWNER", "MODIFIED"):
        table.add_column(column, justify="right" if column == "SIZE" else "left")
    for e in entries:
        table.add_row(e.path, e.type, format_bytes(e.size), f"{e.mode:04o}",
                      f"{e.uid}:{e.gid}", short_time(e.mtime))  # fmt: skip
    print_table(table)


def register(app: typer.Typer) -> None:
    volume_app = typer.Typer(
        help="Volumes: host directories that outlive sessions. A volume is outside every "
        "checkpoint: forks share its files and a rollback does not undo them.",
        no_args_is_help=True,
    )
    app.add_typer(volume_app, name="volume")

    @volume_app.command("create")
    @reports_errors
    def create(
        name: Annotated[str, typer.Argument(help="Its name (unique).")],
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Create an empty volume."""

        async def op(runtime: Runtime) -> Volume:
            return await runtime.create_volume(name)

        volume = run(op)
        emit_json(volume) if as_json else _print_volume(volume)

    @volume_app.command("ls")
    @reports_errors
    def list_volumes(as_json: bool = JSON_OPTION) -> None:
        """Every volume and the space its files take."""

        async def op(runtime: Runtime) -> list[Volume]:
            return await asyncio.to_thread(runtime.list_volumes)

        volumes = run(op)
        if as_json:
            emit_json(volumes)
            return
        for volume in volumes:
            _print_volume(volume)
        if not volumes:
            console.print("no volumes (forkpoint volume create NAME)")

    @volume_app.command("show")
    @reports_errors
    def show(volume: _VOLUME, as_json: bool = JSON_OPTION) -> None:
        """One volume."""

        async def op(runtime: Runtime) -> Volume:
            return await asyncio.to_thread(runtime.get_volume, volume)

        found = run(op)
        emit_json(found) if as_json else _print_volume(found)

    @volume_app.command("rm")
    @reports_errors
    def remove_volume(volume: _VOLUME) -> None:
        """Remove a volume and every file in it."""

        async def op(runtime: Runtime) -> None:
            await runtime.remove_volume(volume)

        run(op)
        console.print(f"removed volume {volume}")

    @volume_app.command("files")
    @reports_errors
    def files(
        volume: _VOLUME,
        path: Annotated[str, typer.Argument(help="A directory in the volume.")] = "/",
        depth: Annotated[int, typer.Option(min=1, max=16, help="Levels below it.")] = 1,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """The entries below a directory of a volume."""

        async def op(runtime: Runtime) -> list[VolumeEntry]:
            return await runtime.volume_list(volume, path, depth)

        entries = run(op)
        emit_json(entries) if as_json else _print_entries(entries)

    @volume_app.command("put")
    @reports_errors
    def put(
        volume: _VOLUME,
        path: _PATH,
        source: Annotated[str, typer.Argument(help="A local file, or - for stdin.")],
        force: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Write a file of a volume (its directory must exist: `volume mkdir`)."""
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()

        async def op(runtime: Runtime) -> VolumeEntry:
            return await runtime.volume_write(volume, path, data, force=force)

        entry = run(op)
        emit_json(entry) if as_json else console.print(f"wrote {entry.path} ({entry.size} B)")

    @volume_app.command("get")
    @reports_errors
    def get(volume: _VOLUME, path: _PATH) -> None:
        """Print a file of a volume (its bytes, to stdout)."""

        async def op(runtime: Runtime) -> bytes:
            return await runtime.volume_read(volume, path)

        sys.stdout.buffer.write(run(op))
        sys.stdout.flush()

    @volume_app.command("mkdir")
    @reports_errors
    def mkdir(
        volume: _VOLUME,
        path: _PATH,
        parents: Annotated[
            bool, typer.Option("--parents", "-p", help="Its parents too; existing is fine.")
        ] = False,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Make a directory in a volume."""

        async def op(runtime: Runtime) -> VolumeEntry:
            return await runtime.volume_make_dir(volume, path, force=parents)

        entry = run(op)
        emit_json(entry) if as_json else console.print(f"made {entry.path}")

    @volume_app.command("remove")
    @reports_errors
    def remove_path(volume: _VOLUME, path: _PATH) -> None:
        """Remove a file of a volume, or a directory with everything in it."""

        async def op(runtime: Runtime) -> None:
            await runtime.volume_remove(volume, path)

        run(op)
        console.print(f"removed {path}")
