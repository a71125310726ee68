"""A forkpoint image as the ``FROM`` of a podman build (E2B's ``from_template``).

An image made from an OCI image names it by its config digest, which is podman's image id
while the image is still in the local container storage. A Debian image (mmdebstrap's)
becomes one by importing its cached mmdebstrap tarball (forkpoint's own files are added
when the new image is made, as for any OCI image).
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from forkpoint.config import home
from forkpoint.errors import NotFound
from forkpoint.images.catalog import Image
from forkpoint.images.rootfs import base_tarball

__all__ = ["podman_base"]

Log = Callable[[str], None]


def _exists(ref: str) -> bool:
    proc = subprocess.run(
        ["podman", "image", "exists", ref], stdin=subprocess.DEVNULL, capture_output=True,
        check=False,
    )  # fmt: skip
    return proc.returncode == 0


def podman_base(image: Image, log: Log | None = None) -> str:
    """A reference podman can build ``FROM`` for ``image``'s root filesystem.

    :raises NotFound: an OCI image no longer in the local container storage.
    """
    digest = image.source.get("digest")
    if digest:
        image_id = digest.removeprefix("sha256:")
        if not _exists(image_id):
            raise NotFound(
                f"image {image.name}: its OCI image {image.source.get('ref')} is no longer "
                "in the local container storage; rebuild it"
            )
        return image_id
    ref = f"localhost/forkpoint-debian/{image.name.lower()}:{image.hash}"
    if not _exists(ref):
        with tempfile.TemporaryDirectory(prefix="forkpoint-base-") as work:
            tarball = base_tarball(image.recipe, home().cache, Path(work), log)
            if log is not None:
                log(f"importing {image.name}'s Debian {image.recipe.suite} into podman")
            subprocess.run(
                ["podman", "import", "-q", str(tarball), ref], stdin=subprocess.DEVNULL,
                capture_output=True, check=True,
            )  # fmt: skip
    return ref
