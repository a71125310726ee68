"""The root filesystem: mmdebstrap a minimal Debian, add the guest files, make a qcow2.

The mmdebstrap result is cached as a tarball in ``$FORKPOINT_HOME/cache/`` keyed by suite
and packages only, so a change to the guest files (the agent) rebuilds in seconds.

mmdebstrap runs in a private mount namespace (``unshare -m``) so the /proc, /sys and
/dev it mounts in its chroot vanish with it, even if it is killed; and with a parent
death signal, so it never outlives the build that started it.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Final

from forkpoint.errors import ImageBuildError, UnknownPackage
from forkpoint.images.account import add_guest_user
from forkpoint.images.recipe import GUEST_HELPER, Recipe, guest_files, host_suite
from forkpoint.images.tmpdirs import remove_tree

__all__ = [
    "AGENT_ROOT",
    "base_key",
    "base_tarball",
    "build_rootfs",
    "install_guest_files",
    "make_disk",
    "mmdebstrap",
    "validate_packages",
]

#: Where the guest's copy of the ``forkpoint`` package lives (its PYTHONPATH).
AGENT_ROOT = "opt/forkpoint"

_UNKNOWN_RES = (
    re.compile(r"Unable to locate package (\S+)"),
    re.compile(r"Package '?([^' ]+)'? has no installation candidate"),
    re.compile(r"Couldn't find any package by (?:glob|regex) '([^']+)'"),
)
# Docs, man pages and translations are dead weight in a sandbox image.
_DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)

Log = Callable[[str], None]


def _apt_candidates(packages: list[str]) -> dict[str, bool] | None:
    """Per package: does the host's apt have an installable candidate? None if no apt.

    One ``apt-cache policy`` call (each apt-cache run costs ≈ 1.5 s here). Unknown names
    get no block at all; purely virtual packages get ``Candidate: (none)``.
    """
    try:
        proc = subprocess.run(
            ["apt-cache", "policy", *packages],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError:
        return None
    if proc.returncode != 0:
        return None
    found = dict.fromkeys(packages, False)
    current = ""
    for line in proc.stdout.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = line[:-1]
        elif line.strip().startswith("Candidate:") and current in found:
            found[current] = line.split(":", 1)[1].strip() != "(none)"
    return found


def validate_packages(recipe: Recipe) -> bool:
    """Check every package of ``recipe`` exists, before any slow work.

    Uses the host's apt lists when the recipe's suite is the host's (and those lists are
    populated). Returns False when it could not check (mmdebstrap's own error is then
    parsed instead). Raises :class:`UnknownPackage` naming the first missing package.
    """
    if recipe.suite != host_suite():
        return False
    found = _apt_candidates(["base-files", recipe.kernel_package, *recipe.packages])
    if found is None or not found["base-files"]:
        return False  # no usable apt lists on this host (apt-get update never ran)
    for package in (recipe.kernel_package, *recipe.packages):
        if not found[package]:
            raise UnknownPackage(package)
    return True


def _unknown_package(lines: collections.deque[str]) -> str | None:
    for line in lines:
        for pattern in _UNKNOWN_RES:
            match = pattern.search(line)
            if match:
                return match.group(1)
    return None


def _wrapped(argv: list[str]) -> list[str]:
    prefix: list[str] = []
    if shutil.which("setpriv"):
        prefix += ["setpriv", "--pdeathsig", "TERM"]
    if os.geteuid() == 0 and shutil.which("unshare"):
        prefix += ["unshare", "--mount", "--propagation", "private"]
    return prefix + argv


def mmdebstrap(
    recipe: Recipe, target: Path, log: Log | None = None, tmpdir: Path | None = None
) -> None:
    """Run ``mmdebstrap --variant=minbase`` for ``recipe`` into ``target``.

    ``target`` is a directory, or a tarball if it ends in ``.tar``; ``tmpdir`` is where
    mmdebstrap keeps its scratch chroot for tarball targets.

    ``log`` receives each output line as it comes. Raises :class:`UnknownPackage` when
    apt cannot find a package, :class:`ImageBuildError` (with ``log_tail``) otherwise.
    On any exception (including KeyboardInterrupt) mmdebstrap is stopped and reaped.
    """
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError("mmdebstrap is not installed: apt-get install mmdebstrap")
    argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}"]
    argv += [f"--dpkgopt={opt}" for opt in _DPKG_EXCLUDES]
    # Root's home is 0700: apt's _apt sandbox user could not write there anyway.
    argv += ["--aptopt=APT::Sandbox::User root"]
    argv += [recipe.suite, str(target)]
    tail: collections.deque[str] = collections.deque(maxlen=60)
    env = dict(os.environ)
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)  # its scratch chroot then dies with our build dir
    with subprocess.Popen(
        _wrapped(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        # Own process group: a terminal's Ctrl-C reaches only us, and we stop it in order.
        start_new_session=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip()
                if not line:
                    continue
                tail.append(line)
                if log is not None:
                    log(line)
            code = proc.wait()
        finally:
            if proc.poll() is None:
                _stop(proc)
    if code != 0:
        unknown = _unknown_package(tail)
        if unknown is not None:
            raise UnknownPackage(unknown)
        raise ImageBuildError(
            f"mmdebstrap failed (exit {code}): {tail[-1] if tail else 'no output'}",
            log_tail="\n".join(tail),
        )


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM (mmdebstrap cleans its chroot mounts), then SIGKILL the group if needed."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


# Where an image's Pythons look for modules: Debian's (every 3.x) and python.org builds'.
_SITE_DIRS: Final = (
    "usr/lib/python3/dist-packages",
    "usr/lib/python3*/site-packages",
    "usr/local/lib/python3*/site-packages",
    "usr/local/lib/python3*/dist-packages",
)


def _expose_guest_library(tree: Path) -> list[str]:
    """A ``forkpoint.pth`` naming ``forkpoint_guest``'s directory in each of the image's
    site directories, so its own Python imports it. A directory whose path leaves the
    tree (an image's absolute symlink) is skipped, never written through."""
    root = tree.resolve()
    written = []
    for pattern in _SITE_DIRS:
        for site in sorted(tree.glob(pattern)):
            if not site.is_dir() or not site.resolve().is_relative_to(root):
                continue
            pth = site / "forkpoint.pth"
            pth.unlink(missing_ok=True)
            pth.write_text(f"/{AGENT_ROOT}/forkpoint/guest/lib\n")
            written.append(f"/{pth.relative_to(tree)}")
    return written


def install_guest_files(tree: Path, hostname: str = "forkpoint") -> list[str]:
    """Copy the guest files into ``tree`` and write the basic /etc files.

    Python files go to ``/opt/forkpoint/forkpoint/...``; ``guest/init.sh`` becomes
    ``/sbin/forkpoint-init`` and the restore helper ``/usr/local/bin/forkpoint-guest``
    (mode 755); the image's Pythons find ``forkpoint_guest`` (see
    :func:`_expose_guest_library`). Returns the guest paths written.
    """
    written: list[str] = []
    scripts = {
        "forkpoint/guest/init.sh": "sbin/forkpoint-init",
        f"forkpoint/guest/lib/{GUEST_HELPER}": f"usr/local/bin/{GUEST_HELPER}",
    }
    for rel, source in guest_files():
        dest = tree / scripts.get(rel, f"{AGENT_ROOT}/{rel}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)  # never write through an image's symlink
        shutil.copyfile(source, dest)
        dest.chmod(0o755 if rel in scripts else 0o644)
        written.append(f"/{dest.relative_to(tree)}")
    if "/sbin/forkpoint-init" not in written:
        raise ImageBuildError("forkpoint/guest/init.sh is missing from the installed package")
    written += _expose_guest_library(tree)
    hooks = tree / "etc/forkpoint/restore.d"  # where restore hooks go (guest/restore.py)
    hooks.mkdir(parents=True, exist_ok=True)
    written.append("/etc/forkpoint/restore.d")
    etc = tree / "etc"
    (etc / "hostname").write_text(f"{hostname}\n")
    (etc / "hosts").write_text(
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
    resolv = etc / "resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("nameserver 10.0.2.3\n")
    written += ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf"]
    if _quicker_login_profile(etc / "profile"):
        written.append("/etc/profile")
    return written


def _quicker_login_profile(profile: Path) -> bool:
    """Debian's ``/etc/profile`` runs ``id -u`` to pick PATH: a process per login shell,
    ≈ 40 ms of E2B's every command (``bash -l -c``) under TCG. bash knows its ``EUID``;
    other shells still ask ``id``. Returns whether the file changed."""
    if profile.is_symlink() or not profile.is_file():
        return False
    text = profile.read_text(errors="surrogateescape")
    quicker = text.replace('"$(id -u)"', '"${EUID:-$(id -u)}"')
    if quicker == text:
        return False
    profile.write_text(quicker, errors="surrogateescape")
    return True


def _run(argv: list[str], what: str) -> None:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed") from exc
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout).strip()
        last = out.splitlines()[-1] if out else f"exit code {proc.returncode}"
        raise ImageBuildError(f"{what} failed: {last}", log_tail=out[-4000:])


def make_disk(tree: Path, out: Path, size: int) -> None:
    """``mkfs.ext4 -d tree`` into a sparse raw file of ``size`` bytes, then qcow2 ``out``.

    The raw file is removed afterwards (also on failure).
    """
    raw = out.with_suffix(".raw")
    try:
        with raw.open("wb") as f:
            f.truncate(size)
        _run(
            ["mkfs.ext4", "-q", "-F", "-d", str(tree), "-L", "root", str(raw), f"{size // 1024}k"],
            "mkfs.ext4",
        )
        _run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(out)], "qemu-img")
    finally:
        raw.unlink(missing_ok=True)


def base_key(recipe: Recipe) -> str:
    """Key of the mmdebstrap output: depends on suite and packages, not on guest files."""
    blob = json.dumps(
        {
            "suite": recipe.suite,
            "packages": sorted(recipe.packages),
            "dpkg": list(_DPKG_EXCLUDES),
            "format": recipe.format_version,
        },
        sort_keys=True,
    )
    return f"{recipe.suite}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def base_tarball(recipe: Recipe, cache: Path, work: Path, log: Log | None = None) -> Path:
    """The cached mmdebstrap tarball for ``recipe``'s suite and packages, made if absent.

    Editing guest files then rebuilds an image in seconds instead of re-running
    mmdebstrap. Written under ``work`` first and renamed in, so it is never partial.
    """
    final = cache / f"rootfs-{base_key(recipe)}.tar"
    if final.is_file():
        if log is not None:
            log(f"reusing cached base system {final.name}")
        return final
    if log is not None:
        log(f"mmdebstrap {recipe.suite} (about 40 s)")
    partial = work / "base.tar"
    mmdebstrap(recipe, partial, log, tmpdir=work)
    cache.mkdir(parents=True, exist_ok=True)
    staged = cache / f".{final.name}.{os.getpid()}"
    try:
        try:
            os.link(partial, staged)
        except OSError:  # another filesystem
            shutil.copyfile(partial, staged)
        os.replace(staged, final)
    finally:
        staged.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return final


def build_rootfs(
    recipe: Recipe, work: Path, out: Path, cache: Path, log: Log | None = None
) -> None:
    """The rootfs step: base system (cached tarball), guest files, qcow2 ``out``.

    Works in ``work``/tree, deleted afterwards (also on failure).
    """
    tree = work / "tree"
    try:
        base = base_tarball(recipe, cache, work, log)
        tree.mkdir()
        _run(
            ["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xpf", str(base)]
            + ["-C", str(tree)],
            "unpacking the base system",
        )
        install_guest_files(tree)
        add_guest_user(tree)
        if log is not None:
            log("creating ext4 filesystem and qcow2 disk")
        make_disk(tree, out, recipe.disk_size)
    finally:
        remove_tree(tree)
