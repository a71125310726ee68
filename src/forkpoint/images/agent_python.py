"""The agent's own Python for OCI images, and busybox for the tools init may not find.

A container image may have no Python (Alpine, distroless, a plain Debian base), an old
one, or a musl one; forkpoint's agent should not depend on any of that. So an OCI image
gets the host's interpreter (the same Debian Python the default image runs), its standard
library and every shared library those load, *with their own dynamic loader*, under
``/opt/forkpoint/python``. ``/opt/forkpoint/bin/python3`` starts it through that loader
(``ld.so --library-path``): nothing of it is on the image's library path, and the image's
libc (glibc, musl or none) never meets it. ≈ 40 MB per image.

``/opt/forkpoint/sbin`` holds the host's static busybox as ``ip``, ``mount``, ``mkdir``
and ``sleep``: init appends it to its ``PATH``, so an image's own tools win and an image
without them (most Debian-based container images lack ``ip``) still gets its network up.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from forkpoint.errors import ImageBuildError

__all__ = ["BUSYBOX_APPLETS", "PYTHON_WRAPPER", "identity", "install_agent_python"]

_ROOT: Final = "opt/forkpoint/python"
#: The command init runs the agent with, when it exists.
PYTHON_WRAPPER: Final = "opt/forkpoint/bin/python3"
_SBIN: Final = "opt/forkpoint/sbin"
BUSYBOX_APPLETS: Final = ("ip", "mount", "mkdir", "sleep")
_LOADER: Final = "ld-linux-x86-64.so.2"
# Parts of the standard library the agent never imports: tests, GUIs, installers, docs.
_SKIP: Final = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "site-packages",
        "dist-packages",
        "venv",
        "unittest",
        "distutils",
    }  # fmt: skip
)
_LDD_RE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(")
_LOADER_RE = re.compile(r"^\s*(/\S*ld-linux\S*)\s+\(")


_SYSTEM_PYTHON: Final = "/usr/bin/python3"
_QUERY: Final = (
    "import sys, sysconfig; print(sys.version.split()[0]); print(sys.executable); "
    "print(sysconfig.get_path('stdlib')); print(sysconfig.get_path('platstdlib'))"
)


@dataclass(frozen=True)
class _Python:
    version: str  # e.g. 3.11.2
    binary: Path
    stdlib: Path
    dynload: Path

    @property
    def short(self) -> str:
        return "python" + ".".join(self.version.split(".")[:2])


@functools.cache
def _system_python() -> _Python:
    """Debian's ``/usr/bin/python3``: the Python of the default image (same release), not
    whatever interpreter (a venv, pyenv) runs forkpoint itself."""
    try:
        proc = subprocess.run(
            [_SYSTEM_PYTHON, "-S", "-c", _QUERY], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ImageBuildError(
            f"{_SYSTEM_PYTHON} is needed for the agent of OCI images: apt-get install python3"
        ) from exc
    version, binary, stdlib, platstdlib = proc.stdout.split("\n")[:4]
    return _Python(version, Path(binary).resolve(), Path(stdlib), Path(platstdlib) / "lib-dynload")


def identity() -> str:
    """Names the interpreter that goes into images (part of the recipe hash)."""
    python = _system_python()
    digest = hashlib.sha256(python.binary.read_bytes()).hexdigest()[:12]
    return f"{python.version} {python.binary} {digest}"


def _libraries(objects: list[Path]) -> dict[str, Path]:
    """soname → host file of every library ``objects`` load, the loader included."""
    found: dict[str, Path] = {}
    for start in range(0, len(objects), 64):
        proc = subprocess.run(
            ["ldd", *map(str, objects[start : start + 64])],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in proc.stdout.splitlines():
            if match := _LDD_RE.match(line):
                found[match.group(1)] = Path(match.group(2))
            elif match := _LOADER_RE.match(line):
                found[_LOADER] = Path(match.group(1))
    if _LOADER not in found:
        raise ImageBuildError("cannot find the host Python's dynamic loader (ldd)")
    return found


def _skipped(directory: str, names: list[str]) -> list[str]:
    del directory
    return [
        n for n in names
        if n in _SKIP or n.startswith(("config-", "_test", "_tkinter", "_ctypes_test"))
        or n.endswith((".a", ".opt-1.pyc", ".opt-2.pyc"))
    ]  # fmt: skip


def install_agent_python(tree: Path) -> None:
    """Copy the host's Python (binary, standard library, libraries, loader) and busybox
    into the root filesystem at ``tree``, and write the ``python3`` wrapper."""
    python = _system_python()
    root = tree / _ROOT
    stdlib = root / "lib" / python.short
    (root / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(python.binary, root / "bin" / python.short)
    # copy2 keeps mtimes, so the bytecode in __pycache__ stays valid (no recompiling at boot)
    shutil.copytree(python.stdlib, stdlib, symlinks=True, ignore=_skipped, dirs_exist_ok=True)
    if not (stdlib / "lib-dynload").is_dir():  # elsewhere on some builds
        shutil.copytree(python.dynload, stdlib / "lib-dynload", ignore=_skipped)
    objects = [python.binary, *sorted((stdlib / "lib-dynload").glob("*.so"))]
    for soname, source in _libraries(objects).items():
        shutil.copy2(source.resolve(), root / "lib" / soname)
    wrapper = tree / PYTHON_WRAPPER
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    lib = f"/{_ROOT}/lib"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# forkpoint's agent Python: the host's, through its own loader (images/agent_python.py)\n"
        f"PYTHONHOME=/{_ROOT} exec {lib}/{_LOADER} --library-path {lib} "
        f'/{_ROOT}/bin/{python.short} "$@"\n'
    )
    wrapper.chmod(0o755)
    _install_busybox(tree)


def _install_busybox(tree: Path) -> None:
    busybox = shutil.which("busybox")
    if busybox is None:
        raise ImageBuildError("busybox is not installed: apt-get install busybox-static")
    sbin = tree / _SBIN
    sbin.mkdir(parents=True, exist_ok=True)
    shutil.copy2(Path(busybox).resolve(), sbin / "busybox")
    for applet in BUSYBOX_APPLETS:
        link = sbin / applet
        link.unlink(missing_ok=True)
        link.symlink_to("busybox")
