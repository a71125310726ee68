"""The guest's unprivileged account: ``user`` (uid/gid 1000, ``/home/user``, bash, sudo).

E2B code expects it: commands run as ``user`` by default, files belong to ``user:user``
and ``sudo`` works without a password. Written straight into the root filesystem's
``/etc`` files (no chroot, no ``useradd``), so the build needs nothing from the guest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Final

__all__ = ["GUEST_GID", "GUEST_HOME", "GUEST_UID", "GUEST_USER", "add_guest_user"]

GUEST_USER: Final = "user"
GUEST_UID: Final = 1000
GUEST_GID: Final = 1000
GUEST_HOME: Final = "/home/user"


def _append_line(path: Path, line: str, mode: int) -> None:
    """Append ``line`` unless an entry with the same first field exists."""
    text = path.read_text() if path.exists() else ""
    key = line.split(":", 1)[0] + ":"
    if any(existing.startswith(key) for existing in text.splitlines()):
        return
    if text and not text.endswith("\n"):
        text += "\n"
    path.write_text(text + line + "\n")
    path.chmod(mode)


def add_guest_user(tree: Path) -> list[str]:
    """Create the account in the root filesystem at ``tree``. Returns the paths written.

    The password is locked (``!``): the account is reached through the agent and ``sudo``
    is passwordless, as on E2B.
    """
    etc = tree / "etc"
    name, uid, gid = GUEST_USER, GUEST_UID, GUEST_GID
    # Container images may lack bash (Alpine, busybox): their /bin/sh is the shell then.
    bash = tree / "bin" / "bash"
    shell = "/bin/bash" if bash.exists() or bash.is_symlink() else "/bin/sh"
    _append_line(etc / "passwd", f"{name}:x:{uid}:{gid}::{GUEST_HOME}:{shell}", 0o644)
    _append_line(etc / "group", f"{name}:x:{gid}:", 0o644)
    _append_line(etc / "shadow", f"{name}:!:19000:0:99999:7:::", 0o640)
    _append_line(etc / "gshadow", f"{name}:!::", 0o640)
    sudoers = etc / "sudoers.d" / name
    sudoers.parent.mkdir(parents=True, exist_ok=True)
    sudoers.write_text(f"{name} ALL=(ALL:ALL) NOPASSWD:ALL\n")
    sudoers.chmod(0o440)
    home = tree / GUEST_HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    skel = etc / "skel"
    if skel.is_dir():
        for item in skel.iterdir():
            if item.is_file() and not item.is_symlink() and not (home / item.name).exists():
                shutil.copyfile(item, home / item.name)
    home.chmod(0o750)
    for path in [home, *home.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)  # a link's target is not the home's
    return [
        *(f"/etc/{f}" for f in ("passwd", "group", "shadow", "gshadow", f"sudoers.d/{name}")),
        GUEST_HOME,
    ]
