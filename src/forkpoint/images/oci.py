"""OCI images as a guest's root filesystem: a Dockerfile built with podman, or an existing
image (an OCI layout directory, a ``docker save``/``podman save`` archive, or an image in
the local container storage).

Every source becomes a skopeo transport reference, and the config digest in its manifest
names its content: it goes into the recipe (``Recipe.base``), so an unchanged source is a
cache hit before anything is copied. A miss copies the image into an OCI layout (skopeo)
and unpacks it (umoci, which applies the layers' whiteouts); what the guest needs is
checked before forkpoint's own files go in (one clear error each, nothing cached).

podman builds with ``--isolation chroot``: its OCI runtime (crun) refuses hosts whose
cgroups are half v1, half v2 (as here), and chroot isolation needs no cgroups at all.
``--network host`` lets ``RUN`` reach package archives without a container network;
``--ulimit`` keeps podman 5 from asking for more open files and processes than this
process may have.
"""

from __future__ import annotations

import collections
import json
import os
import re
import resource
import shutil
import struct
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from forkpoint.errors import ImageBuildError, InvalidInput, NotFound, UnusableImage
from forkpoint.images.mirror import registries_env
from forkpoint.images.tmpdirs import remove_tree

__all__ = [
    "IMAGE_CONFIG_PATH",
    "OCI_FORMAT",
    "ImageConfig",
    "READY_LABEL",
    "OciSource",
    "build_dockerfile",
    "check_guest",
    "check_user",
    "parse_build_args",
    "resolve_ref",
    "unpack",
]

#: Bump when the way an OCI image becomes a root filesystem changes (part of the hash).
OCI_FORMAT: Final = 1
#: Where the image's ENV/WORKDIR/USER/start command land in the guest (the agent reads it).
IMAGE_CONFIG_PATH: Final = "opt/forkpoint/image.json"
#: An image label: the shell command that says its service is ready (``LABEL`` in a
#: Dockerfile); the template boot waits for it before the checkpoint.
READY_LABEL: Final = "dev.forkpoint.ready-cmd"

_X86_64: Final = 62  # ELF e_machine
_ELF_MACHINES: Final = {3: "i386", 40: "arm", 183: "aarch64", 243: "riscv64", 62: "x86-64"}
_BUILD_ARG_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_TRANSPORTS = ("oci:", "oci-archive:", "docker-archive:", "containers-storage:")

Log = Callable[[str], None]


@dataclass(frozen=True)
class ImageConfig:
    """What of the OCI image config forkpoint uses: the defaults of commands in the guest,
    the command to start (``ENTRYPOINT`` + ``CMD``) and its ready check (the label
    :data:`READY_LABEL`: a shell command the template boot runs until it exits 0)."""

    env: dict[str, str]
    cwd: str | None
    user: str | None
    start: list[str]
    ready: str | None = None

    @classmethod
    def from_oci(cls, config: Mapping[str, Any]) -> ImageConfig:
        inner = config.get("config") or {}
        env: dict[str, str] = {}
        for item in inner.get("Env") or []:
            key, sep, value = str(item).partition("=")
            if sep and key:
                env[key] = value
        start = [str(a) for a in (inner.get("Entrypoint") or [])]
        start += [str(a) for a in (inner.get("Cmd") or [])]
        return cls(
            env=env,
            cwd=str(inner["WorkingDir"]) if inner.get("WorkingDir") else None,
            user=str(inner["User"]) if inner.get("User") else None,
            start=start,
            ready=(inner.get("Labels") or {}).get(READY_LABEL) or None,
        )

    def to_dict(self) -> dict[str, Any]:
        data = {"env": self.env, "cwd": self.cwd, "user": self.user, "start": self.start}
        return data | ({"ready": self.ready} if self.ready else {})


@dataclass(frozen=True)
class OciSource:
    """An image to turn into a guest: ``transport`` for skopeo, ``digest`` of its config.

    ``kind``: ``dockerfile``, ``oci-layout``, ``oci-archive``, ``docker-archive`` or
    ``containers-storage``; ``ref``: what the user named (a path or an image name).
    """

    kind: str
    ref: str
    transport: str
    digest: str

    @property
    def base(self) -> str:
        """The recipe's ``base``: changes with the content and with :data:`OCI_FORMAT`."""
        return f"oci-{OCI_FORMAT}:{self.digest}"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "ref": self.ref, "digest": self.digest}


def _require(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ImageBuildError(f"{tool} is not installed: apt-get install {package} (make setup)")
    return path


def _run(
    argv: list[str], what: str, log: Log | None = None, env: Mapping[str, str] | None = None
) -> str:
    """Run ``argv`` (with ``env`` added to ours); its output line by line to ``log``; raises
    ImageBuildError naming the last line on failure. Returns the output."""
    tail: collections.deque[str] = collections.deque(maxlen=60)
    lines: list[str] = []
    with subprocess.Popen(
        argv,
        env={**os.environ, **env} if env else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.rstrip()
                lines.append(line)
                if line:
                    tail.append(line)
                    if log is not None:
                        log(line)
            code = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if code != 0:
        last = tail[-1] if tail else f"exit code {code}"
        raise ImageBuildError(f"{what} failed: {last}", log_tail="\n".join(tail))
    return "\n".join(lines)


def parse_build_args(items: Sequence[str]) -> dict[str, str]:
    """``K=V`` strings as a dict. :raises InvalidInput: an item without ``=`` or a bad name."""
    found: dict[str, str] = {}
    for item in items:
        if not _BUILD_ARG_RE.match(item):
            raise InvalidInput(f"invalid --build-arg {item!r}: expected NAME=VALUE")
        key, _, value = item.partition("=")
        found[key] = value
    return found


def build_dockerfile(
    name: str,
    dockerfile: Path,
    context: Path | None = None,
    build_args: Mapping[str, str] | None = None,
    log: Log | None = None,
    *,
    no_cache: bool = False,
) -> OciSource:
    """``podman build`` the Dockerfile (tagged ``localhost/forkpoint/<name>``; podman's layer
    cache makes an unchanged rebuild take seconds, unless ``no_cache``) and return the
    result as a source. Images it names are pulled through the registry mirror if one is
    set up (:mod:`forkpoint.images.mirror`).

    ``context`` defaults to the Dockerfile's directory.
    :raises InvalidInput: no such Dockerfile or context directory.
    :raises ImageBuildError: the build failed (its last line; ``log_tail``).
    """
    if not dockerfile.is_file():
        raise InvalidInput(f"no Dockerfile at {dockerfile}")
    context = context if context is not None else dockerfile.parent
    if not context.is_dir():
        raise InvalidInput(f"build context {context} is not a directory")
    podman = _require("podman", "podman")
    with tempfile.TemporaryDirectory(prefix="forkpoint-build-") as scratch:
        iidfile = Path(scratch) / "iid"
        argv = [podman, "build", "--isolation", "chroot", "--network", "host"]
        argv += _host_ulimits()
        argv += ["--iidfile", str(iidfile), "-f", str(dockerfile.resolve())]
        argv += ["-t", f"localhost/forkpoint/{name.lower()}:latest"]
        argv += ["--no-cache"] if no_cache else []
        for key, value in (build_args or {}).items():
            argv += ["--build-arg", f"{key}={value}"]
        _run([*argv, str(context.resolve())], "podman build", log, env=registries_env())
        image_id = iidfile.read_text().strip()
    source = _inspect("containers-storage:" + image_id.removeprefix("sha256:"))
    return OciSource("dockerfile", str(dockerfile), source.transport, source.digest)


#: podman 4.3 (Debian 12), unable to raise its own process limit to 1,048,576, drops it to
#: 32,768 before a RUN step — and then cannot go back up to the host's ceiling.
_PODMAN_NPROC_FALLBACK = 32768


def _host_ulimits() -> list[str]:
    """podman 5 raises each RUN step's open-file and process limits to 1,048,576 and fails
    where this process may not go that high: ask for the ceilings it already has (for
    processes, no more than podman 4.3 keeps for itself)."""
    argv = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        _, hard = resource.getrlimit(limit)
        if hard == resource.RLIM_INFINITY:
            continue
        if limit == resource.RLIMIT_NPROC:
            hard = min(hard, _PODMAN_NPROC_FALLBACK)
        argv += ["--ulimit", f"{name}={hard}:{hard}"]
    return argv


def _archive_kind(path: Path) -> str:
    """``oci-archive`` or ``docker-archive``, from the members at the archive's top."""
    try:
        with tarfile.open(path) as tar:
            for member in tar:  # headers only: the layers' bytes are skipped
                name = member.name.removeprefix("./")
                if name == "oci-layout":
                    return "oci-archive"
                if name == "manifest.json":
                    return "docker-archive"
    except (tarfile.TarError, OSError) as exc:
        raise InvalidInput(f"{path} is neither an OCI layout nor an image archive: {exc}") from None
    raise InvalidInput(f"{path} is a tar archive but no image (no oci-layout, no manifest.json)")


def resolve_ref(ref: str) -> OciSource:
    """The source ``ref`` names: a path (OCI layout directory, ``docker save``/``podman
    save`` archive, OCI archive), a skopeo reference (``oci:DIR:TAG``, …), or else an image
    in the local container storage.

    :raises InvalidInput: a path that is no image; :raises NotFound: no such image.
    """
    if ref.startswith(_TRANSPORTS):
        return _inspect(ref)
    path = Path(ref)
    if path.is_dir():
        if not (path / "oci-layout").is_file():
            raise InvalidInput(f"{ref} is a directory but not an OCI layout (no oci-layout file)")
        source = _inspect(f"oci:{path.resolve()}")
        return OciSource("oci-layout", ref, source.transport, source.digest)
    if path.is_file():
        kind = _archive_kind(path)
        source = _inspect(f"{kind}:{path.resolve()}")
        return OciSource(kind, ref, source.transport, source.digest)
    if "/" in ref and (ref.startswith((".", "/")) or ref.endswith((".tar", ".tar.gz"))):
        raise NotFound(f"no such file or directory: {ref}")
    return _inspect(f"containers-storage:{ref}", ref=ref)


def _inspect(transport: str, ref: str | None = None) -> OciSource:
    """The source at ``transport``, with its config digest (``skopeo inspect --raw``)."""
    skopeo = _require("skopeo", "skopeo")
    kind = transport.split(":", 1)[0]
    proc = subprocess.run(
        [skopeo, "inspect", "--raw", transport],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if kind == "containers-storage":
            raise NotFound(f"no image {ref or transport} in the local container storage")
        raise InvalidInput(f"cannot read image {ref or transport}: {last}")
    try:
        manifest = json.loads(proc.stdout)
        digest = str(manifest["config"]["digest"])
    except (ValueError, KeyError, TypeError):
        raise InvalidInput(
            f"{ref or transport} is an image index (several platforms): name one image"
        ) from None
    return OciSource(kind, ref or transport, transport, digest)


def unpack(source: OciSource, work: Path, log: Log | None = None) -> tuple[Path, ImageConfig]:
    """Copy ``source`` into an OCI layout under ``work`` and unpack it; returns the root
    filesystem (``work/bundle/rootfs``) and the image's config. The layout is removed."""
    skopeo = _require("skopeo", "skopeo")
    umoci = _require("umoci", "umoci")
    layout = work / "layout"
    remove_tree(layout)
    if log is not None:
        log(f"copying {source.ref} ({source.digest[:19]}) into an OCI layout")
    _run([skopeo, "copy", "-q", source.transport, f"oci:{layout}:image"], "skopeo copy")
    config = ImageConfig.from_oci(_layout_config(layout))
    if log is not None:
        log("unpacking the layers (umoci)")
    bundle = work / "bundle"
    _run([umoci, "unpack", "--image", f"{layout}:image", str(bundle)], "umoci unpack")
    remove_tree(layout)
    return bundle / "rootfs", config


def _blob(layout: Path, digest: str) -> Any:
    algorithm, _, value = digest.partition(":")
    return json.loads((layout / "blobs" / algorithm / value).read_text())


def _layout_config(layout: Path) -> dict[str, Any]:
    index = json.loads((layout / "index.json").read_text())
    manifest = _blob(layout, index["manifests"][0]["digest"])
    config: dict[str, Any] = _blob(layout, manifest["config"]["digest"])
    return config


def _resolve_in(tree: Path, path: str) -> Path | None:
    """``path`` inside ``tree`` with symlinks followed as the guest would (absolute links
    stay inside ``tree``); None if it does not exist."""
    parts = list(PurePosixPath(path).parts[1:])
    current = PurePosixPath("/")
    for _ in range(64):
        if not parts:
            host = tree / str(current).lstrip("/")
            return host if host.exists() or host.is_symlink() else None
        part = parts.pop(0)
        candidate = current.parent if part == ".." else current / part
        host = tree / str(candidate).lstrip("/")
        if host.is_symlink():
            target = PurePosixPath(os.readlink(host))
            if target.is_absolute():
                current = PurePosixPath("/")
                parts = list(target.parts[1:]) + parts
            else:  # relative to the link's directory, which is ``current``
                parts = list(target.parts) + parts
            continue
        if not host.exists():
            return None
        current = candidate
    return None


def _elf_interpreter(path: Path) -> tuple[int, str | None] | None:
    """(machine, PT_INTERP) of a 64-bit little-endian ELF file; None if it is not one."""
    with path.open("rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        machine = struct.unpack_from("<H", head, 0x12)[0]
        phoff = struct.unpack_from("<Q", head, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        for i in range(min(phnum, 128)):
            f.seek(phoff + i * phentsize)
            ph = f.read(56)
            if len(ph) < 56:
                break
            if struct.unpack_from("<I", ph, 0)[0] == 3:  # PT_INTERP
                offset, _, _, size = struct.unpack_from("<QQQQ", ph, 8)
                f.seek(offset)
                return machine, f.read(size).rstrip(b"\0").decode(errors="replace")
        return machine, None


def check_guest(tree: Path, what: str) -> str:
    """Check the root filesystem can run forkpoint's init and the commands of a session:
    a shell at ``/bin/sh``, built for x86-64, with its libc's loader (glibc or musl).
    Returns a one-word description of the libc (``glibc``, ``musl``, ``static``).

    :raises UnusableImage: one line naming what is missing.
    """
    shell = _resolve_in(tree, "/bin/sh")
    if shell is None or not shell.is_file():
        raise UnusableImage(f"image {what} has no shell (/bin/sh): forkpoint's init needs one")
    elf = _elf_interpreter(shell)
    if elf is None:
        raise UnusableImage(f"image {what}: /bin/sh is not a 64-bit ELF program")
    machine, interpreter = elf
    if machine != _X86_64:
        arch = _ELF_MACHINES.get(machine, f"machine {machine}")
        raise UnusableImage(f"image {what} is built for {arch}; forkpoint guests are x86-64")
    if interpreter is None:
        return "static"
    if _resolve_in(tree, interpreter) is None:
        raise UnusableImage(
            f"image {what} has no C library: /bin/sh needs {interpreter}, which is missing"
        )
    return "musl" if "musl" in interpreter else "glibc"


def check_user(tree: Path, user: str | None, what: str) -> None:
    """The image's ``USER`` (a name or uid, ``:group`` ignored) has an account in its
    ``/etc/passwd``: commands run as it. :raises UnusableImage:"""
    if user is None:
        return
    name = user.split(":", 1)[0]
    if name in ("root", "0"):
        return
    passwd = _resolve_in(tree, "/etc/passwd")
    text = passwd.read_text(errors="replace") if passwd is not None and passwd.is_file() else ""
    field = 2 if name.isdigit() else 0
    if not any(line.split(":")[field : field + 1] == [name] for line in text.splitlines()):
        raise UnusableImage(f"image {what}: its USER {user} has no account in /etc/passwd")


def write_image_config(tree: Path, config: ImageConfig, start: bool) -> None:
    """The image's defaults for the agent (``IMAGE_CONFIG_PATH``); ``start`` only if asked."""
    data = config.to_dict()
    if not start:
        data["start"] = []
    dest = tree / IMAGE_CONFIG_PATH
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(data, indent=2) + "\n")
    dest.chmod(0o644)


#: Where forkpoint writes into an image's tree (every directory on the way too).
_WRITTEN_PATHS: Final = (
    "etc/passwd", "etc/group", "etc/shadow", "etc/gshadow", "etc/sudoers.d/user", "etc/skel",
    "etc/hostname", "etc/hosts", "etc/profile", "home/user", IMAGE_CONFIG_PATH,
    "sbin/forkpoint-init", "proc", "sys", "dev", "run", "tmp", "root", "var/log",
    "opt/forkpoint", "usr/local/bin", "etc/forkpoint/restore.d",
)  # fmt: skip


def refuse_links_out(tree: Path, what: str) -> None:
    """An image's symlinks are the guest's: one on a path forkpoint writes to that leads
    out of the tree (an absolute target, or ``..`` too far) would have the build write to
    the host's file.

    :raises UnusableImage: such a link.
    """
    root = tree.resolve()
    for rel in _WRITTEN_PATHS:
        path = tree
        for part in PurePosixPath(rel).parts:
            path = path / part
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise UnusableImage(
                    f"image {what}: /{path.relative_to(tree)} is a symlink out of the image "
                    f"({os.readlink(path)}); forkpoint writes its files there"
                )


def prepare_tree(tree: Path) -> None:
    """What container images often lack and a booted guest needs: the directories init
    mounts on, and root in ``/etc/passwd`` and ``/etc/group`` (scratch/busybox images)."""
    for rel, mode in (("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("run", 0o755),
                      ("tmp", 0o1777), ("root", 0o700), ("sbin", 0o755), ("etc", 0o755),
                      ("var/log", 0o755)):  # fmt: skip
        path = tree / rel
        if path.is_symlink():
            continue
        if not path.exists():
            path.mkdir(parents=True)
            path.chmod(mode)
    for rel, line in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh"), ("etc/group", "root:x:0:")):
        path = tree / rel
        text = path.read_text() if path.is_file() else ""
        if not any(entry.startswith("root:") for entry in text.splitlines()):
            path.write_text(line + "\n" + text)
            path.chmod(0o644)


def build_oci_rootfs(
    source: OciSource, work: Path, out: Path, min_size: int, *, start: bool, log: Log
) -> dict[str, Any]:
    """The rootfs step for an OCI image: unpack, check, add forkpoint (its files, the
    ``user`` account, the agent's Python), write the qcow2 ``out``. Returns what the image
    manifest records (``source``, ``config``, ``libc``). Works in ``work``, cleaned up."""
    from forkpoint.images.account import add_guest_user
    from forkpoint.images.agent_python import install_agent_python
    from forkpoint.images.rootfs import install_guest_files, make_disk

    bundle = work / "bundle"
    try:
        tree, config = unpack(source, work, log)
        libc = check_guest(tree, source.ref)
        check_user(tree, config.user, source.ref)
        log(f"adding forkpoint's init, agent and Python ({libc} image)")
        refuse_links_out(tree, source.ref)
        prepare_tree(tree)
        install_guest_files(tree)
        add_guest_user(tree)
        install_agent_python(tree)
        write_image_config(tree, config, start)
        used = _tree_bytes(tree)
        # Room for the files plus ext4's overhead, at least the recipe's size.
        size = max(min_size, (used * 3 // 2 + (512 << 20)) // (1 << 20) * (1 << 20))
        log(f"creating ext4 filesystem ({size >> 20} MiB) and qcow2 disk")
        make_disk(tree, out, size)
    finally:
        remove_tree(bundle)
    return {"source": source.to_dict(), "config": config.to_dict(), "libc": libc}


def _tree_bytes(tree: Path) -> int:
    total = 0
    for path in tree.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_blocks * 512
        except OSError:
            continue
    return total
