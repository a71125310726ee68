"""Templates built from code (E2B's ``Template().…`` + ``Template.build``), carried out by
forkpoint's image builder.

A build: the SDK requests it (a name, tags), uploads each ``COPY`` step's files as a tar
named by their content hash (skipped when the hash is already here), then starts it with
the steps. The steps become a Dockerfile (:mod:`.template_dockerfile`) built by podman
into a forkpoint image, whose template is then booted: the start command runs and the
ready command is waited for before the template's checkpoint, so every sandbox of it starts
with the service up at the same PID. The log goes line by line to the build's log, which
the SDK polls; a failure names the step that failed (podman's ``STEP n`` mapped back).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import tarfile
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from forkpoint.errors import Conflict, ForkpointError, InvalidInput, NotFound
from forkpoint.images import build_oci_image, get_image
from forkpoint.images.podman_base import podman_base
from forkpoint.images.recipe import E2B_BASE_IMAGE
from forkpoint.runtime import Runtime
from forkpoint.store import Store, utc_now
from forkpoint.store.e2b_templates import E2bTemplatesStore, TemplateBuildRecord

from .template_dockerfile import BASE_STEP, FINALIZE_STEP, TemplateSpec, to_dockerfile
from .template_files import stage_copy

__all__ = ["LogLine", "TemplateBuilds", "split_name"]

#: What ``from_base_image()`` names: E2B's base image, which is forkpoint's ``base``.
E2B_BASE_REFS: Final = ("e2bdev/base", "e2bdev/base:latest", "docker.io/e2bdev/base:latest")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")
_STEP_RE = re.compile(r"^STEP (\d+)/\d+: ")
# podman 5 / podman 4.3's words for a USER with no account.
_NO_USER_RE = re.compile(r'unable to find user ([^:\s]+)|looking up user "([^"]+)"')
# podman's "Error: building at STEP "RUN …": <what went wrong>"
_STEP_ERROR_RE = re.compile(r'building at STEP "[^"]*": (.*)$')
_EXIT_RE = re.compile(r"exit status \d+")
#: How many log lines one status call answers (the SDK keeps asking until none are left).
_PAGE: Final = 100
_MAX_UPLOAD: Final = 2 * 1024**3
#: Builds whose logs the gateway keeps in memory.
_KEPT_LOGS: Final = 64

Report = Callable[[str, str], None]  # the image builder's progress: (stage, line)


@dataclass(frozen=True)
class LogLine:
    timestamp: str
    level: str
    message: str
    step: str | None = None


def split_name(name: str) -> tuple[str, str | None]:
    """``name[:tag]`` -> (name, tag).

    :raises InvalidInput: not a template name, or an empty or bad tag."""
    base, sep, tag = name.partition(":")
    if not _NAME_RE.match(base):
        raise InvalidInput(
            f"invalid template name {base!r}: lowercase letters, digits, '.', '_', '-'"
        )
    if sep and not _TAG_RE.match(tag):
        raise InvalidInput(f"invalid tag {tag!r} in {name!r}")
    return base, (tag if sep else None)


def check_tags(tags: list[str]) -> list[str]:
    """:raises InvalidInput: an empty tag, or one with a colon (``name:`` or ``:tag``)."""
    for tag in tags:
        if not _TAG_RE.match(tag):
            raise InvalidInput(f"invalid tag {tag!r}: letters, digits, '.', '_', '-'")
    return tags


class TemplateBuilds:
    """The gateway's template builds: its store rows, uploaded files and running builds."""

    def __init__(self, runtime: Runtime, store: Store, memory_mib: int, cpus: int) -> None:
        self.runtime = runtime
        self.store = E2bTemplatesStore(store)
        self.files = runtime.home.root / "e2b-template-files"
        self.memory_mib = memory_mib
        self.cpus = cpus
        self.logs: dict[str, list[LogLine]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.store.fail_unfinished("the gateway stopped during the build")

    # -- requests, uploads, tags ------------------------------------------------------------

    def request(
        self, name: str, tags: list[str], cpus: int | None = None, memory_mib: int | None = None
    ) -> TemplateBuildRecord:
        """A new build of ``name[:tag]``; its sandboxes get ``cpus`` and ``memory_mib`` (the
        gateway's by default)."""
        base, tag = split_name(name)
        wanted = check_tags([*([tag] if tag else []), *tags])
        return self.store.request(
            base, list(dict.fromkeys(wanted)), cpus or self.cpus, memory_mib or self.memory_mib
        )

    def _file(self, files_hash: str) -> Path:
        if not _HASH_RE.match(files_hash):
            raise InvalidInput(f"invalid files hash {files_hash!r}: 64 hex digits")
        return self.files / files_hash

    def has_files(self, template_id: str, files_hash: str) -> bool:
        if self.store.template_id(template_id) is None:
            raise NotFound(f"template {template_id} not found")
        return self._file(files_hash).is_file()

    async def save_files(self, files_hash: str, chunks: AsyncIterator[bytes]) -> None:
        """Store an upload under its hash, whole or not at all."""
        final = self._file(files_hash)
        partial = final.with_name(f".{final.name}.{secrets.token_hex(8)}")
        out = await asyncio.to_thread(_open_new, partial)
        size = 0
        try:
            with out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > _MAX_UPLOAD:
                        raise InvalidInput(f"upload larger than {_MAX_UPLOAD} bytes")
                    await asyncio.to_thread(out.write, chunk)
            await asyncio.to_thread(partial.replace, final)
        finally:
            await asyncio.to_thread(partial.unlink, missing_ok=True)

    # -- the build ------------------------------------------------------------------------------

    async def start(self, template_id: str, build_id: str, spec: TemplateSpec) -> None:
        """:raises NotFound: no such build. :raises Conflict: it was already started."""
        build = await asyncio.to_thread(self.store.build, template_id, build_id)
        if build.status != "waiting":
            raise Conflict(f"build {build_id} was already started ({build.status})")
        files = [s.filesHash for s in spec.steps if s.type == "COPY" and s.filesHash]
        await asyncio.to_thread(self.store.start, build.build_id, files)
        while len(self.logs) >= _KEPT_LOGS:  # the oldest builds' logs go
            del self.logs[next(iter(self.logs))]
        self.logs[build.build_id] = []
        task = asyncio.create_task(self._run(build, spec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def status(
        self, template_id: str, build_id: str, offset: int
    ) -> tuple[TemplateBuildRecord, list[LogLine]]:
        build = self.store.build(template_id, build_id)
        lines = self.logs.get(build.build_id, [])
        return build, lines[max(offset, 0) : max(offset, 0) + _PAGE]

    def _log(
        self, build_id: str, message: str, level: str = "info", step: str | None = None
    ) -> None:
        self.logs.setdefault(build_id, []).append(LogLine(utc_now(), level, message, step))

    async def _run(self, build: TemplateBuildRecord, spec: TemplateSpec) -> None:
        steps = _StepTracker()

        def report(stage: str, detail: str) -> None:
            steps.see(detail)
            self._log(build.build_id, detail, step=steps.current)

        try:
            image_hash, oci_id = await self._build(build, spec, report, steps)
            steps.current = FINALIZE_STEP
            if spec.startCmd:
                report("start", f"starting {spec.startCmd!r} and waiting until it is ready")
            else:
                report("start", "booting the template")
            await self.runtime.prepare(image_hash, build.memory_mib, build.cpus)
        except Exception as error:  # noqa: BLE001 - a build must end, whatever went wrong
            message = (
                steps.failure(error.message, spec)
                if isinstance(error, ForkpointError)
                else f"{type(error).__name__}: {error}"
            )
            self._log(build.build_id, message, level="error", step=steps.current)
            await asyncio.to_thread(
                self.store.set_status, build.build_id, "error", reason=message, step=steps.current
            )
            return
        self._log(build.build_id, f"template {build.name} is ready (image {image_hash})")
        await asyncio.to_thread(
            self.store.set_status, build.build_id, "ready", image_hash=image_hash, oci_id=oci_id
        )

    async def _build(
        self, build: TemplateBuildRecord, spec: TemplateSpec, report: Report, steps: _StepTracker
    ) -> tuple[str, str]:
        with tempfile.TemporaryDirectory(prefix="forkpoint-template-") as scratch:
            context = Path(scratch)
            copies = await asyncio.to_thread(self._stage_copies, spec, context)
            base = await asyncio.to_thread(self._base, spec, report)
            plan = to_dockerfile(spec, base, copies)
            steps.names = plan.steps
            dockerfile = context / "Dockerfile"
            await asyncio.to_thread(dockerfile.write_text, plan.text)
            report("source", f"building from {base}: {len(spec.steps)} steps")
            image = await asyncio.to_thread(
                build_oci_image, image_name(build.template_id), dockerfile=dockerfile,
                context=context, no_cache=spec.force or any(s.force for s in spec.steps),
                progress=report,
            )  # fmt: skip
        return image.hash, image.source.get("digest", "")

    def _stage_copies(self, spec: TemplateSpec, context: Path) -> dict[int, tuple[str, str]]:
        """Each ``COPY`` step's files as a tar in ``context`` and where it unpacks."""
        copies: dict[int, tuple[str, str]] = {}
        for number, step in enumerate(spec.steps, start=1):
            if step.type != "COPY":
                continue
            if len(step.args) < 2 or step.filesHash is None:
                raise InvalidInput(f"step {number}: COPY needs a source, a target and files")
            unpacked = context / "uploads" / step.filesHash
            if not unpacked.is_dir():
                self._unpack(step.filesHash, unpacked)
            mode = step.args[3] if len(step.args) > 3 and step.args[3] else None
            archive = f"copy-{number}.tar"
            target = stage_copy(unpacked, step.args[0], step.args[1], mode, context / archive)
            copies[number] = (archive, target)
        return copies

    def _unpack(self, files_hash: str, target: Path) -> None:
        path = self._file(files_hash)
        if not path.is_file():
            raise InvalidInput(f"files {files_hash} were not uploaded")
        target.mkdir(parents=True)
        try:
            with tarfile.open(path, "r:*") as tar:
                tar.extractall(target, filter="tar")
        except (tarfile.TarError, OSError) as error:
            raise InvalidInput(f"files {files_hash}: not a tar archive: {error}") from None

    def _base(self, spec: TemplateSpec, report: Report) -> str:
        """What the Dockerfile starts ``FROM``: an image name (pulled through the mirror if
        need be), or a forkpoint image's podman image for ``fromTemplate``."""
        if spec.fromTemplate is None and spec.fromImage not in E2B_BASE_REFS:
            if not spec.fromImage:
                raise InvalidInput("the template names no base: fromImage or fromTemplate")
            if spec.fromImageRegistry is not None:
                raise InvalidInput("images from private registries are not supported: mirror it")
            return spec.fromImage
        name = spec.fromTemplate or E2B_BASE_IMAGE
        build = self.store.resolve(name)
        try:
            image = get_image(build.image_hash if build and build.image_hash else name)
        except NotFound:
            raise NotFound(f"template {name} not found") from None
        return podman_base(image, log=lambda line: report("source", line))

    # -- removal --------------------------------------------------------------------------

    async def delete(self, name_or_id: str) -> None:
        """Forget a template and the uploads only it copied; its images go unless a sandbox
        or snapshot still uses them."""
        template_id, unused = await asyncio.to_thread(self.store.delete, name_or_id)
        for files_hash in unused:
            await asyncio.to_thread(self._file(files_hash).unlink, missing_ok=True)
        with contextlib.suppress(ForkpointError):
            await self.runtime.remove_image(image_name(template_id))


def _open_new(path: Path) -> BinaryIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("wb")


def image_name(template_id: str) -> str:
    """The forkpoint image a template's builds make."""
    return f"e2b-{template_id}"


class _StepTracker:
    """Which SDK step podman is at (its ``STEP n/m`` lines, mapped through the plan)."""

    def __init__(self) -> None:
        self.current: str = BASE_STEP
        self.names: list[str] = []

    def see(self, line: str) -> None:
        match = _STEP_RE.match(line)
        if match and self.names:
            number = int(match.group(1))
            self.current = self.names[number - 1] if number <= len(self.names) else BASE_STEP

    def failure(self, message: str, spec: TemplateSpec) -> str:
        """E2B's wording for a failed command: ``failed to run command '…': …``."""
        if self.current in (BASE_STEP, FINALIZE_STEP) or not self.current.isdigit():
            return message
        step = spec.steps[int(self.current) - 1]
        if step.type != "RUN" or not step.args:
            return message
        missing = _NO_USER_RE.search(message)
        if missing:
            detail = f"unauthenticated: invalid username: '{missing.group(1) or missing.group(2)}'"
        else:
            why = _STEP_ERROR_RE.search(message)
            detail = why.group(1) if why else message
            # podman 4.3: "exit status 3"; podman 5: "while running runtime: exit status 3"
            status = _EXIT_RE.search(detail)
            detail = status.group(0) if status else detail
        return f"failed to run command '{step.args[0]}': command failed: {detail}"
