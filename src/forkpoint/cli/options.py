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
    "AllowNetOption", "CpusOption", "DenyNetOption", "ImageOption", "InjectHeaderOption",
    "MemoryOption", "NetworkOption", "OnTimeoutOption", "inject_headers_of", "volumes_of",
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
InjectHeaderOption = Annotated[
    list[str] | None,
    typer.Option(
        "--inject-header",
        metavar="HOST:NAME=VALUE",
        help="Set header NAME on the guest's plain-HTTP requests to HOST (*.example.com: "
        "every name under it); the value stays on the host, never in the guest. "
        "NAME=@FILE reads the value from FILE (repeatable).",
    ),
]
OnTimeoutOption = Annotated[Expiry, typer.Option("--on-timeout", help=_help("on_expiry"))]


def volumes_of(options: list[str] | None) -> dict[str, str]:
    """``--volume VOLUME:/PATH`` options as a request's ``volumes`` (``{path: volume}``).

    :raises InvalidInput: an option without ``:``, or a path mounted twice."""
    from forkpoint.errors import InvalidInput

    mounts: dict[str, str] = {}
    for option in options or ():
        volume, colon, path = option.partition(":")
        if not (colon and volume and path):
            raise InvalidInput(f"--volume {option!r}: expected VOLUME:/PATH")
        if path in mounts:
            raise InvalidInput(f"--volume: {path} is given twice")
        mounts[path] = volume
    return mounts


def inject_headers_of(options: list[str] | None) -> dict[str, dict[str, str]]:
    """``--inject-header HOST:NAME=VALUE`` (or ``NAME=@FILE``) options as a request's
    ``inject_headers``; the request checks hosts, names and values.

    :raises InvalidInput: an option without ``:`` or ``=``, or a file that cannot be read.
    """
    from pathlib import Path

    from forkpoint.errors import InvalidInput

    headers: dict[str, dict[str, str]] = {}
    for option in options or ():
        host, colon, field = option.partition(":")
        name, equals, value = field.partition("=")
        if not (colon and equals and host and name):
            raise InvalidInput(f"--inject-header {option!r}: expected HOST:NAME=VALUE")
        if value.startswith("@"):
            try:
                value = Path(value[1:]).read_text().strip("\r\n")
            except OSError as error:
                raise InvalidInput(f"--inject-header {host}:{name}: {error.strerror}") from None
        headers.setdefault(host, {})[name] = value
    return headers
