"""Options more than one command takes: what a VM is made of (``create``, ``warm``).

Their help and limits come from the request model the REST API reads
(:class:`~forkpoint.requests.CreateSessionRequest`), so a door's words and bounds are
declared once; the runtime enforces the bounds (one line, exit code 2), whichever door
asked.
"""

from __future__ import annotations

from typing import Annotated

import typer
from annotated_types import Ge, Le

from forkpoint.models import Expiry
from forkpoint.requests import CreateSessionRequest

__all__ = [
    "AllowNetOption", "CpusOption", "DenyNetOption", "ImageOption", "MemoryOption",
    "NetworkOption", "OnTimeoutOption",
]  # fmt: skip


def _help(field: str) -> str:
    """The field's description, with its bounds: ``Guest RAM in MiB (128-65536).``"""
    info = CreateSessionRequest.model_fields[field]
    low = next((m.ge for m in info.metadata if isinstance(m, Ge)), None)
    high = next((m.le for m in info.metadata if isinstance(m, Le)), None)
    text = (info.description or field).rstrip(".")
    return f"{text} ({low}-{high})." if low is not None and high is not None else f"{text}."


ImageOption = Annotated[str, typer.Option("--image", help="Image name (see `image ls`).")]
MemoryOption = Annotated[int, typer.Option("--memory", help=_help("memory_mib"))]
CpusOption = Annotated[int, typer.Option("--cpus", help=_help("cpus"))]
NetworkOption = Annotated[
    str, typer.Option("--network", help="'user' (NAT, port forwards) or 'none'.")
]
AllowNetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-net",
        help="CIDR, or host name (pypi.org, *.example.com: judged by the name each HTTP or "
        "TLS connection asks for), the guest may reach despite the denies (repeatable).",
    ),
]
DenyNetOption = Annotated[
    list[str] | None,
    typer.Option("--deny-net", help="CIDR or host name the guest may not reach (repeatable)."),
]
OnTimeoutOption = Annotated[Expiry, typer.Option("--on-timeout", help=_help("on_expiry"))]
