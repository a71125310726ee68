"""The data directory's XFS image, mounted again after a reboot.

Where the host's file system has no reflinks, ``make setup`` (``tools/reflink-home.sh``)
moves ``$FORKPOINT_HOME`` into an XFS image beside it, ``<home>.xfs``, mounted over the
directory. A mount does not survive a reboot: without this, forkpoint would find an empty
directory where its checkpoints were.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from forkpoint.errors import InternalError

__all__ = ["filesystems_of", "image_of", "mount_image_if_needed"]


def image_of(root: Path) -> Path:
    """The XFS image that holds ``root`` when the host file system has no reflinks."""
    return root.with_name(f"{root.name}.xfs")


def mount_image_if_needed(root: Path) -> None:
    """Mount ``root``'s image over it if it has one and it is not mounted.

    :raises InternalError: it cannot be mounted (forkpoint would otherwise work on an
        empty directory in its place)."""
    image = image_of(root)
    if not image.is_file() or os.path.ismount(root):
        return
    try:
        loop = subprocess.run(
            ["losetup", "--direct-io=on", "--find", "--show", str(image)],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        subprocess.run(
            ["mount", "-o", "discard,noatime", loop, str(root)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        raise InternalError(
            f"{root} lives on {image}, which is not mounted and cannot be "
            f"({detail.strip()}); mount it as root: make storage"
        ) from error


def filesystems_of(root: Path) -> list[Path]:
    """Where writing under ``root`` takes space: its own file system and, if that is one
    of these images, the host file system the image lives on (a sparse image of the host's
    size grows into it: the host fills first)."""
    mount = root
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    if mount == mount.parent:
        return [root]
    image = image_of(mount)
    return [root, image.parent] if image.is_file() else [root]
