"""An OCI image's defaults for commands: its ``ENV``, ``WORKDIR`` and ``USER``.

``images/oci.py`` writes them to ``/opt/forkpoint/image.json`` when it builds the image;
Debian images have no such file, and their commands run as before (root, ``/root``).
"""

from __future__ import annotations

import functools
import json
import pwd
from dataclasses import dataclass, field

from ..protocol import ErrorCode
from .context import GuestError
from .users import Account, account

__all__ = ["CONFIG_PATH", "ImageDefaults", "image_defaults", "resolve_user"]

CONFIG_PATH = "/opt/forkpoint/image.json"


@dataclass(frozen=True, slots=True)
class ImageDefaults:
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    user: str | None = None


@functools.cache
def image_defaults() -> ImageDefaults:
    """The image's defaults (read once: the image's files never change under the agent)."""
    try:
        with open(CONFIG_PATH, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return ImageDefaults()
    env = data.get("env") or {}
    return ImageDefaults(
        env={str(k): str(v) for k, v in env.items() if k and "=" not in str(k)},
        cwd=str(data["cwd"]) if data.get("cwd") else None,
        user=str(data["user"]) if data.get("user") else None,
    )


def resolve_user(spec: str) -> Account | None:
    """The account a Dockerfile ``USER`` names (``name``, ``uid``, ``name:group`` or
    ``uid:gid``; the group part is the account's own). None for root."""
    name = spec.split(":", 1)[0]
    if name.isdigit():
        try:
            name = pwd.getpwuid(int(name)).pw_name
        except KeyError:
            raise GuestError(
                ErrorCode.NOT_FOUND, f"the image's USER {spec} has no account in the guest"
            ) from None
    if name == "root":
        return None
    return account(name)
