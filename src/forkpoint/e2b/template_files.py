"""A template's ``COPY`` step as a tar podman's ``ADD`` unpacks where the files belong.

The SDK uploads a step's files as a tar of the paths its source pattern matches, relative
to the build's context. podman's ``COPY`` would follow the symlinks among them (a link to
an absolute path on the SDK's machine then fails the build); ``ADD`` of a local tar keeps
every entry as it is. So the matches are repacked relative to the target: a directory
named as the source gives its contents, what a pattern matches goes into the target by
name (directories with their tree), and one file sent to a target that does not end with
``/`` becomes that file. ``mode`` is set on the entries themselves.
"""

from __future__ import annotations

import glob
import os
import posixpath
import tarfile
from pathlib import Path

from forkpoint.errors import InvalidInput

__all__ = ["stage_copy"]


def stage_copy(files: Path, src: str, dest: str, mode: str | None, archive: Path) -> str:
    """Write ``archive`` with what ``src`` (a path or pattern under ``files``, the upload
    unpacked) puts at ``dest``; returns the directory to ``ADD`` it to.

    :raises InvalidInput: ``src`` matches nothing.
    """
    pattern = src.lstrip("/").rstrip("/") or "."
    matches = sorted(glob.glob(pattern, root_dir=files, recursive=False))
    if not matches:
        raise InvalidInput(f"COPY {src}: no such file in the uploaded files")
    into = dest or "."
    single_file = len(matches) == 1 and not (files / matches[0]).is_dir()
    if single_file and not into.endswith("/"):
        target_dir, names = posixpath.dirname(into) or ".", {matches[0]: posixpath.basename(into)}
    else:
        target_dir, names = into, {m: posixpath.basename(m.rstrip("/")) for m in matches}
    bits = int(mode, 8) if mode else None
    pattern_has_glob = any(c in pattern for c in "*?[")
    with tarfile.open(archive, "w") as tar:
        for match, name in names.items():
            path = files / match
            if path.is_dir() and not path.is_symlink():
                # A directory named as the source gives its contents; one a pattern
                # matched keeps its name.
                prefix = Path(name) if pattern_has_glob else Path()
                if pattern_has_glob:
                    _add(tar, path, name, bits)
                for root, dirs, leaves in os.walk(path):
                    for entry in sorted(dirs + leaves):
                        full = Path(root) / entry
                        _add(tar, full, str(prefix / full.relative_to(path)), bits)
            else:
                _add(tar, path, name, bits)
    return target_dir.rstrip("/") + "/"


def _add(tar: tarfile.TarFile, path: Path, name: str, mode: int | None) -> None:
    info = tar.gettarinfo(str(path), arcname=name)
    if mode is not None and not info.issym():
        info.mode = mode
    if info.isreg():
        with path.open("rb") as data:
            tar.addfile(info, data)
    else:
        tar.addfile(info)
