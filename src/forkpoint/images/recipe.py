"""What an image is made of: the :class:`Recipe` and its content hash.

A recipe pins everything that changes the bytes of an image: the Debian suite, the
packages, the kernel package, the disk size, the guest files baked into the root
filesystem (hashed by content) and a format version. Two builds of recipes with the
same :meth:`Recipe.hash` are interchangeable, so the hash names the image on disk.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from forkpoint.errors import InvalidInput, UnknownPackage

__all__ = [
    "DEFAULT_DISK_SIZE",
    "DEFAULT_KERNEL_PACKAGE",
    "DEFAULT_PACKAGES",
    "CODE_INTERPRETER_IMAGE",
    "E2B_BASE_IMAGE",
    "E2B_BASE_PACKAGES",
    "KNOWN_IMAGES",
    "KnownImage",
    "FORMAT_VERSION",
    "Recipe",
    "guest_files",
    "guest_files_digest",
    "host_suite",
    "parse_packages",
]

#: Bump when the layout or build steps change in a way the other fields do not capture.
FORMAT_VERSION = 2
# sudo: the guest's ``user`` account (images/account.py) has passwordless sudo, as on E2B.
# e2fsprogs: ``resize2fs`` grows the root filesystem (``create --disk``); Debian 13's
# minimal root no longer brings it.
DEFAULT_PACKAGES: tuple[str, ...] = ("python3", "iproute2", "procps", "sudo", "e2fsprogs")
#: The image named ``base`` is E2B's base: what E2B code assumes is there (``python``
#: 3.11+ with pip and venv, node with npm, curl, git, sudo) on top of the default packages.
E2B_BASE_IMAGE = "base"
E2B_BASE_PACKAGES: tuple[str, ...] = (
    "python3-pip", "python-is-python3", "python3-venv", "nodejs", "npm", "curl", "git",
    "ca-certificates",
)  # fmt: skip
#: E2B's code-interpreter template: base + Jupyter's Python kernel and the data packages
#: its users reach for first, served on port 49999 by ``guest/interpreter.py``.
CODE_INTERPRETER_IMAGE = "code-interpreter-v1"


@dataclass(frozen=True)
class KnownImage:
    """An image forkpoint knows by name: its packages beyond the default ones, and the
    service its template starts (``start``, an argv) and waits for (``ready``, a shell
    command that exits 0 once the service answers)."""

    packages: tuple[str, ...]
    start: tuple[str, ...] = ()
    ready: str | None = None


KNOWN_IMAGES: dict[str, KnownImage] = {
    E2B_BASE_IMAGE: KnownImage(E2B_BASE_PACKAGES),
    CODE_INTERPRETER_IMAGE: KnownImage(
        E2B_BASE_PACKAGES
        + ("python3-ipykernel", "python3-jupyter-client", "python3-matplotlib",
           "python3-numpy", "python3-pandas"),
        # Where rootfs.AGENT_ROOT puts the guest files; -P keeps the script's directory
        # (the agent's modules) off sys.path.
        start=("python3", "-P", "/opt/forkpoint/forkpoint/guest/interpreter.py"),
        ready="curl -sf -o /dev/null http://127.0.0.1:49999/health",
    ),
}  # fmt: skip
DEFAULT_KERNEL_PACKAGE = "linux-image-cloud-amd64"
#: Size of the root filesystem in bytes (2 GiB).
DEFAULT_DISK_SIZE = 2 * 1024**3

# Debian policy 5.6.1: lowercase letters, digits, + - . ; at least two chars, alnum first.
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def host_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """The host's Debian codename (``VERSION_CODENAME``); ``bookworm`` if it has none."""
    try:
        text = os_release.read_text()
    except OSError:
        return "bookworm"
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "VERSION_CODENAME" and value.strip():
            return value.strip().strip("\"'")
    return "bookworm"


def _package_root() -> Path:
    # Located through the installed package, not the repository, so this works from a
    # wheel too. ``forkpoint/__init__.py`` is import-free, so this costs nothing.
    import forkpoint

    return Path(forkpoint.__file__).resolve().parent


#: The restore contract's shell helper (``guest/lib/``), on the guest's PATH.
GUEST_HELPER: Final = "forkpoint-guest"


def guest_files() -> list[tuple[str, Path]]:
    """The files baked into every guest, as ``(path relative to site-packages, source)``.

    ``forkpoint/__init__.py``, every ``*.py`` under ``forkpoint/protocol/`` and
    ``forkpoint/guest/`` (the guest library ``guest/lib/forkpoint_guest.py`` too),
    ``forkpoint/guest/init.sh`` and the shell helper; sorted by relative path.
    """
    root = _package_root()
    found: dict[str, Path] = {"forkpoint/__init__.py": root / "__init__.py"}
    for sub in ("protocol", "guest"):
        for path in (root / sub).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            found["forkpoint/" + path.relative_to(root).as_posix()] = path
    for script in (root / "guest" / "init.sh", root / "guest" / "lib" / GUEST_HELPER):
        if script.is_file():
            found["forkpoint/" + script.relative_to(root).as_posix()] = script
    return sorted(found.items())


# The builder modules whose code decides what lands in an image (initramfs modules and
# /init, rootfs layout): editing them must give a new hash, like editing the agent does.
_BUILDER_MODULES = ("account.py", "cpio.py", "initramfs.py", "kernel.py", "rootfs.py")


def guest_files_digest() -> str:
    """sha256 (hex) over :func:`guest_files` and the image builder's own code."""
    digest = hashlib.sha256()
    builder = Path(__file__).parent
    files = [*guest_files(), *((f"images/{n}", builder / n) for n in _BUILDER_MODULES)]
    for rel, path in files:
        digest.update(rel.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest()


def parse_packages(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    """Split ``"a,b"`` (or an iterable of such) into valid package names.

    Raises :class:`UnknownPackage` for a name that cannot be a Debian package.
    """
    if spec is None:
        return ()
    parts = [spec] if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for part in parts:
        for raw in part.split(","):
            name = raw.strip()
            if not name:
                continue
            if not _PACKAGE_RE.match(name):
                raise UnknownPackage(name)
            if name not in names:
                names.append(name)
    return tuple(names)


@dataclass(frozen=True)
class Recipe:
    """Everything that determines an image's bytes. Immutable; build with :meth:`create`.

    ``disk_size`` is in bytes. ``guest_digest`` is :func:`guest_files_digest` at the time
    the recipe was made, so editing the agent yields a new hash (and a rebuild).
    """

    name: str = "default"
    suite: str = field(default_factory=host_suite)
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    kernel_package: str = DEFAULT_KERNEL_PACKAGE
    disk_size: int = DEFAULT_DISK_SIZE
    guest_digest: str = field(default_factory=guest_files_digest)
    format_version: int = FORMAT_VERSION
    #: An OCI image's root filesystem instead of mmdebstrap's: ``oci-<n>:<config digest>``
    #: (``images/oci.py``); ``packages`` is then empty. None for Debian images.
    base: str | None = None
    #: Start the OCI image's ``ENTRYPOINT``/``CMD`` when its template boots.
    start: bool = False
    #: The Python the agent brings along into an OCI image (``images/agent_python.py``).
    agent_python: str | None = None
    #: A Debian image's service (:class:`KnownImage`): started when its template boots,
    #: and the shell command that says it is ready.
    start_command: tuple[str, ...] = ()
    ready_command: str | None = None

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name) or self.name in {"names"}:
            raise InvalidInput(
                f"invalid image name {self.name!r}: use letters, digits, '_', '.', '-'"
            )
        for package in (*self.packages, self.kernel_package):
            if not _PACKAGE_RE.match(package):
                raise UnknownPackage(package)
        if self.disk_size < 64 * 1024**2:
            raise InvalidInput(f"disk size too small: {self.disk_size} bytes (min 64 MiB)")

    @classmethod
    def create(
        cls,
        name: str = "default",
        packages: str | Iterable[str] | None = None,
        *,
        suite: str | None = None,
    ) -> Recipe:
        """The default recipe, named ``name``, plus the extra ``packages`` (``"a,b"``);
        a name in :data:`KNOWN_IMAGES` also brings that image's packages and service."""
        known = KNOWN_IMAGES.get(name, KnownImage(()))
        extra = known.packages + parse_packages(packages)
        merged = DEFAULT_PACKAGES + tuple(
            p for i, p in enumerate(extra) if p not in DEFAULT_PACKAGES and p not in extra[:i]
        )
        return cls(
            name=name, suite=suite or host_suite(), packages=merged,
            start_command=known.start, ready_command=known.ready,
        )  # fmt: skip

    @classmethod
    def for_oci(cls, name: str, base: str, *, start: bool = True) -> Recipe:
        """An OCI image's recipe: ``base`` is ``OciSource.base`` (its content digest)."""
        from forkpoint.images.agent_python import identity

        return cls(name=name, packages=(), base=base, start=start, agent_python=identity())

    def with_packages(self, packages: str | Iterable[str]) -> Recipe:
        """A copy with ``packages`` added (order kept, duplicates dropped)."""
        extra = parse_packages(packages)
        return replace(
            self, packages=self.packages + tuple(p for p in extra if p not in self.packages)
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["packages"] = list(self.packages)
        if self.base is None:  # Debian images: the same JSON, so the same hash, as before
            for key in ("base", "start", "agent_python"):
                del data[key]
        if self.start_command:
            data["start_command"] = list(self.start_command)
        else:  # only images with a service say so: the others keep their hash
            del data["start_command"], data["ready_command"]
        return data

    def image_config(self) -> dict[str, Any] | None:
        """A Debian image's ``config`` in its manifest (as an OCI image's; None: none)."""
        if not self.start_command:
            return None
        return {
            "env": {}, "cwd": None, "user": None, "start": list(self.start_command),
            "ready": self.ready_command,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recipe:
        return cls(
            name=str(data["name"]),
            suite=str(data["suite"]),
            packages=tuple(str(p) for p in data["packages"]),
            kernel_package=str(data["kernel_package"]),
            disk_size=int(data["disk_size"]),
            guest_digest=str(data["guest_digest"]),
            format_version=int(data["format_version"]),
            base=None if data.get("base") is None else str(data["base"]),
            start=bool(data.get("start", False)),
            agent_python=None if data.get("agent_python") is None else str(data["agent_python"]),
            start_command=tuple(str(a) for a in data.get("start_command") or ()),
            ready_command=None if data.get("ready_command") is None else str(data["ready_command"]),
        )

    def hash(self) -> str:
        """Short (16 hex chars) sha256 of the recipe as canonical JSON."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
