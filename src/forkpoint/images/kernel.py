"""The guest kernel: Debian's cloud kernel package, fetched with apt and unpacked.

Never the host's kernel: the metapackage (``linux-image-cloud-amd64``) is resolved to
the concrete ``linux-image-<abi>-cloud-amd64``, whose ``.deb`` is downloaded once into
``$FORKPOINT_HOME/cache/`` and reused by later builds.
"""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from forkpoint.errors import ImageBuildError, UnknownPackage

__all__ = [
    "ExtractedKernel",
    "download_package",
    "extract_kernel",
    "read_module",
    "resolve_kernel_package",
]

_APT_OPTS = ("-o", "APT::Sandbox::User=root")


def _run(argv: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()
        last = tail.splitlines()[-1] if tail else f"exit code {proc.returncode}"
        raise ImageBuildError(f"{what} failed: {last}", log_tail=tail[-4000:])
    return proc.stdout


def resolve_kernel_package(metapackage: str) -> str:
    """The concrete ``linux-image-<abi>-…`` package that ``metapackage`` depends on.

    A concrete package name (one that depends on no other ``linux-image-*``) resolves to
    itself. Raises :class:`UnknownPackage` if apt does not know it.
    """
    proc = subprocess.run(
        ["apt-cache", "depends", metapackage],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise UnknownPackage(metapackage)
    for line in proc.stdout.splitlines():
        kind, _, dep = line.strip().partition(":")
        dep = dep.strip()
        if kind.lstrip("|") == "Depends" and dep.startswith("linux-image-"):
            return dep
    return metapackage


def _candidate_version(package: str) -> str:
    out = _run(["apt-cache", "show", "--no-all-versions", package], f"apt-cache show {package}")
    for line in out.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise UnknownPackage(package)


def download_package(package: str, cache_dir: Path) -> Path:
    """The ``.deb`` of apt's candidate ``package`` in ``cache_dir``, downloading if absent.

    Downloads into a private temp dir first, then renames, so a killed download never
    leaves a truncated ``.deb`` that a later build would trust.
    """
    version = _candidate_version(package)
    # apt encodes the epoch colon in file names.
    deb = cache_dir / f"{package}_{version.replace(':', '%3a')}_amd64.deb"
    if deb.is_file():
        return deb
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache_dir) as tmp:
        _run(
            ["apt-get", *_APT_OPTS, "download", f"{package}={version}"],
            "apt-get download",
            Path(tmp),
        )
        got = list(Path(tmp).glob("*.deb"))
        if len(got) != 1:
            raise ImageBuildError(f"apt-get download {package} produced no .deb")
        os.replace(got[0], deb)
    return deb


@dataclass(frozen=True)
class ExtractedKernel:
    """An unpacked kernel package: ``vmlinuz`` and its ``lib/modules/<version>`` tree."""

    version: str
    vmlinuz: Path
    modules_dir: Path

    def find_module(self, name: str) -> Path | None:
        """The file of module ``name`` (``.ko``, ``.ko.xz`` or ``.ko.zst``), or None.

        ``-`` and ``_`` are interchangeable in module names, as for modprobe.
        """
        wanted = name.replace("-", "_")
        for path in sorted(self.modules_dir.rglob("*.ko*")):
            stem = path.name.split(".ko", 1)[0].replace("-", "_")
            if stem == wanted:
                return path
        return None

    def is_builtin(self, name: str) -> bool:
        """Whether ``name`` is compiled into the kernel (listed in ``modules.builtin``)."""
        builtin = self.modules_dir / "modules.builtin"
        if not builtin.is_file():
            return False
        wanted = name.replace("-", "_")
        for line in builtin.read_text().splitlines():
            if Path(line.strip()).name.split(".ko", 1)[0].replace("-", "_") == wanted:
                return True
        return False


def extract_kernel(deb: Path, dest: Path) -> ExtractedKernel:
    """``dpkg-deb -x`` ``deb`` into ``dest`` and locate ``boot/vmlinuz-*`` and the modules."""
    dest.mkdir(parents=True, exist_ok=True)
    _run(["dpkg-deb", "-x", str(deb), str(dest)], f"dpkg-deb -x {deb.name}")
    kernels = sorted((dest / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise ImageBuildError(f"{deb.name} contains no boot/vmlinuz-*")
    vmlinuz = kernels[-1]
    version = vmlinuz.name.removeprefix("vmlinuz-")
    modules = dest / "lib" / "modules" / version
    if not modules.is_dir():
        # usrmerge'd packages (trixie+) ship modules under usr/lib.
        modules = dest / "usr" / "lib" / "modules" / version
    if not modules.is_dir():
        raise ImageBuildError(f"{deb.name} contains no modules for {version}")
    return ExtractedKernel(version=version, vmlinuz=vmlinuz, modules_dir=modules)


def read_module(path: Path) -> bytes:
    """The bytes of module file ``path``, decompressed (busybox insmod cannot do it).

    Handles ``.ko``, ``.ko.xz`` (stdlib lzma) and ``.ko.zst`` (the ``zstd`` tool, as the
    stdlib lacks zstd before Python 3.14).
    """
    name = path.name
    if name.endswith(".ko"):
        return path.read_bytes()
    if name.endswith(".ko.xz"):
        return lzma.decompress(path.read_bytes())
    if name.endswith(".ko.zst"):
        zstd = shutil.which("zstd")
        if zstd is None:
            raise ImageBuildError(f"{name} is zstd-compressed and zstd is not installed")
        proc = subprocess.run([zstd, "-dc", str(path)], capture_output=True, check=False)
        if proc.returncode != 0:
            raise ImageBuildError(f"zstd -d {name} failed: {proc.stderr.decode().strip()}")
        return proc.stdout
    raise ImageBuildError(f"unknown module compression: {name}")
