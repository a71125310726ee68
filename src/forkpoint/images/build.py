"""Build an image from a :class:`Recipe`, atomically and at most once per recipe hash.

Steps: validate packages (fast, before anything slow) → rootfs (mmdebstrap, ≈ 40 s;
or an OCI image's, ``images/oci.py``) → kernel (.deb cached) → initramfs →
``image.json`` → rename the build dir into place → point the name at it. Everything
happens in ``images/.tmp-<hash>-<pid>/``, removed on any failure, Ctrl-C or SIGTERM; a
SIGKILL'd build's dir is ignored by lookups and deleted by the next build.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from forkpoint.config import home
from forkpoint.errors import ImageBuildError, InvalidInput
from forkpoint.images import kernel as kernel_mod
from forkpoint.images.catalog import (
    INITRD_FILE,
    KERNEL_FILE,
    MANIFEST_FILE,
    ROOTFS_FILE,
    Image,
    load_image,
    set_name,
)
from forkpoint.images.initramfs import build_initramfs
from forkpoint.images.oci import OciSource, build_oci_rootfs
from forkpoint.images.recipe import Recipe
from forkpoint.images.rootfs import build_rootfs, validate_packages
from forkpoint.images.tmpdirs import build_dir, remove_stale, remove_tree

__all__ = ["Progress", "build_image", "build_oci_image"]

#: ``progress(stage, detail)``: stage is one of ``source`` (OCI images: the Dockerfile
#: build), ``cached``, ``check``, ``kernel``, ``initramfs``, ``rootfs``, ``finish``,
#: ``done``; detail is a human-readable line.
Progress = Callable[[str, str], None]


def _quiet(stage: str, detail: str) -> None:
    del stage, detail


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so ``finally`` blocks clean up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _build_lock(images: Path, recipe_hash: str) -> Iterator[None]:
    """Serialize builds of one recipe across processes (flock; released on death)."""
    lock = images / f".lock-{recipe_hash}"
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cached(images: Path, recipe: Recipe) -> Image | None:
    image = load_image(images / recipe.hash())
    if image is None:
        return None
    set_name(images, recipe.name, image.hash)
    return image


def build_image(
    recipe: Recipe | None = None,
    progress: Progress | None = None,
    source: OciSource | None = None,
) -> Image:
    """The image for ``recipe`` (default recipe if None), building it unless cached.

    A recipe with a ``base`` is an OCI image's: ``source`` is that image (its digest is
    the base's), whose root filesystem replaces mmdebstrap's.

    ``progress(stage, detail)`` is called as the build goes. Raises
    :class:`~forkpoint.errors.UnknownPackage` (before any slow step) for a package
    Debian lacks, :class:`~forkpoint.errors.ImageBuildError` when a build step fails,
    KeyboardInterrupt on Ctrl-C/SIGTERM; in every failure case nothing is cached.
    """
    recipe = recipe or Recipe()
    report = progress or _quiet
    if recipe.base is not None and (source is None or source.base != recipe.base):
        raise ImageBuildError(f"recipe {recipe.name}: its OCI source is missing or differs")
    images = home().images
    image = _cached(images, recipe)
    if image is not None:
        report("cached", f"{image.name} {image.hash} (cached)")
        return image
    with _sigterm_interrupts():
        # Before the lock and before any file is written: a bad package costs ~1 s.
        report("check", f"checking packages: {', '.join(recipe.packages)}")
        validate_packages(recipe)
        home().ensure()
        with _build_lock(images, recipe.hash()):
            return _locked_build(recipe, images, report, source)


def _locked_build(
    recipe: Recipe, images: Path, report: Progress, source: OciSource | None
) -> Image:
    image = _cached(images, recipe)  # another process may have just built it
    if image is not None:
        report("cached", f"{image.name} {image.hash} (cached)")
        return image
    for stale in remove_stale(images):
        report("check", f"removed stale build dir {stale.name}")
    work = build_dir(images, recipe.hash())
    remove_tree(work)
    work.mkdir(parents=True)
    try:
        return _build_in(recipe, images, work, report, source)
    finally:
        remove_tree(work)


def _build_in(
    recipe: Recipe, images: Path, work: Path, report: Progress, source: OciSource | None
) -> Image:
    started = time.monotonic()
    cache = home().cache

    def log(line: str) -> None:
        report("rootfs", line)

    # The root filesystem first: an unusable OCI image fails before any kernel work.
    extra: dict[str, object] = {}
    if source is None:
        build_rootfs(recipe, work, work / ROOTFS_FILE, cache, log=log)
        if (config := recipe.image_config()) is not None:
            extra["config"] = config
    else:
        extra = build_oci_rootfs(
            source, work, work / ROOTFS_FILE, recipe.disk_size, start=recipe.start, log=log
        )

    report("kernel", f"resolving {recipe.kernel_package}")
    package = kernel_mod.resolve_kernel_package(recipe.kernel_package)
    report("kernel", f"fetching {package}")
    deb = kernel_mod.download_package(package, cache)
    report("kernel", f"unpacking {deb.name}")
    extracted = kernel_mod.extract_kernel(deb, work / "kernel-pkg")
    shutil.copyfile(extracted.vmlinuz, work / KERNEL_FILE)

    report("initramfs", f"packing busybox and virtio modules for {extracted.version}")
    packed = build_initramfs(extracted, work / INITRD_FILE)
    remove_tree(work / "kernel-pkg")

    report("finish", "writing image.json")
    files = {name: (work / name).stat().st_size for name in (KERNEL_FILE, INITRD_FILE, ROOTFS_FILE)}
    manifest = {
        "name": recipe.name,
        "hash": recipe.hash(),
        "recipe": recipe.to_dict(),
        "kernel_version": extracted.version,
        "kernel_package": package,
        "initramfs_modules": packed,
        "suite": recipe.suite,
        "packages": list(recipe.packages),
        "files": files,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_seconds": round(time.monotonic() - started, 1),
        **extra,
    }
    (work / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    for name in (*files, MANIFEST_FILE):
        fd = os.open(work / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    final = images / recipe.hash()
    try:
        os.rename(work, final)
    except OSError as exc:
        existing = load_image(final)
        if existing is None:
            raise ImageBuildError(f"cannot move finished image into {final}: {exc}") from exc
        set_name(images, recipe.name, existing.hash)
        return existing
    set_name(images, recipe.name, recipe.hash())
    image = load_image(final)
    if image is None:
        raise ImageBuildError(f"finished image in {final} does not load")
    report("done", f"{image.name} {image.hash} built in {manifest['build_seconds']} s")
    return image


def build_oci_image(
    name: str,
    *,
    dockerfile: Path | None = None,
    context: Path | None = None,
    build_args: dict[str, str] | None = None,
    ref: str | None = None,
    start: bool = True,
    no_cache: bool = False,
    progress: Progress | None = None,
) -> Image:
    """An image from a Dockerfile (built with podman) or an existing OCI image ``ref``
    (see :func:`forkpoint.images.oci.resolve_ref`); cached by the image's content.

    ``start``: run its ``ENTRYPOINT``/``CMD`` in the background when the template boots
    (and, with a ``dev.forkpoint.ready-cmd`` label, wait until that check passes).
    ``no_cache``: podman runs every step again.
    :raises InvalidInput: neither or both sources, a bad path or build argument.
    :raises UnusableImage: the image lacks a shell or a libc (nothing cached).
    :raises ImageBuildError: podman, skopeo or umoci failed.
    """
    from forkpoint.images.oci import build_dockerfile, resolve_ref

    report = progress or _quiet
    if (dockerfile is None) == (ref is None):
        raise InvalidInput("give exactly one of a Dockerfile and an OCI image reference")
    if dockerfile is not None:
        report("source", f"podman build {dockerfile}")
        source = build_dockerfile(
            name,
            dockerfile,
            context,
            build_args,
            log=lambda line: report("source", line),
            no_cache=no_cache,
        )
    else:
        assert ref is not None
        report("source", f"resolving {ref}")
        source = resolve_ref(ref)
    recipe = Recipe.for_oci(name, source.base, start=start)
    return build_image(recipe, progress, source)
