"""Options more than one command takes: what a VM is made of (``create``, ``warm``)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["CpusOption", "ImageOption", "MemoryOption", "NetworkOption"]

ImageOption = Annotated[str, typer.Option("--image", help="Image name (see `image ls`).")]
MemoryOption = Annotated[int, typer.Option("--memory", help="Guest RAM, MiB.")]
CpusOption = Annotated[int, typer.Option("--cpus", help="Virtual CPUs.")]
NetworkOption = Annotated[
    str, typer.Option("--network", help="'user' (NAT, port forwards) or 'none'.")
]
