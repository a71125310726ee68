"""Guest images: kernel + initramfs + root disk, built from a recipe, cached by its hash.

Use :func:`build_image` to build (or fetch from the cache), :func:`build_oci_image` for
one made from a Dockerfile or an OCI image, :func:`get_image` to look one
up by name or hash, :func:`list_images` to enumerate. Everything lives under
``$FORKPOINT_HOME/images/``.
"""

from __future__ import annotations

from forkpoint.images.build import Progress, build_image, build_oci_image
from forkpoint.images.catalog import Image, get_image, list_images
from forkpoint.images.recipe import Recipe

__all__ = [
    "Image",
    "Progress",
    "Recipe",
    "build_image",
    "build_oci_image",
    "get_image",
    "list_images",
]
