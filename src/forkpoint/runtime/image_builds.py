"""Guest images through the runtime's doors (REST, SDK, MCP; the CLI builds locally): list
them and build one — a minimal Debian plus packages, or a Dockerfile (podman) with its
build context sent along. Removal is the checkpoints' (``remove_image``): it needs their
locks."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from forkpoint.images import Image, Recipe, build_image, build_oci_image, list_images
from forkpoint.images.catalog import current_hashes
from forkpoint.models import ImageInfo
from forkpoint.requests import ImageBuildRequest

__all__ = ["build", "image_info", "images"]


def image_info(image: Image) -> ImageInfo:
    config = image.config or {}
    return ImageInfo(
        name=image.name, hash=image.hash, suite=image.recipe.suite,
        kernel_version=image.kernel_version, size_bytes=image.size_bytes,
        created_at=image.created_at.isoformat(), source=dict(image.source),
        packages=list(image.recipe.packages), start=[str(a) for a in config.get("start") or []],
        ready=config.get("ready"),
    )  # fmt: skip


def images() -> list[ImageInfo]:
    """Each name's newest build, by name."""
    current = set(current_hashes().values())
    found = [image_info(i) for i in list_images() if i.hash in current]
    return sorted(found, key=lambda i: i.name)


async def build(request: ImageBuildRequest) -> ImageInfo:
    """Build (or find in the cache) the image ``request`` describes; minutes for a new one.

    :raises InvalidInput: :raises UnknownPackage: :raises UnusableImage:
    :raises ImageBuildError: as ``forkpoint image build``.
    """
    return image_info(await asyncio.to_thread(_build, request))


def _build(request: ImageBuildRequest) -> Image:
    if request.dockerfile is None:
        return build_image(Recipe.create(request.name, request.packages or None))
    with tempfile.TemporaryDirectory(prefix="forkpoint-context-") as scratch:
        context = Path(scratch)
        for path, data in request.context_files().items():
            target = context / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        dockerfile = context / "Dockerfile"
        dockerfile.write_text(request.dockerfile)
        return build_oci_image(
            request.name, dockerfile=dockerfile, context=context, start=request.start
        )
