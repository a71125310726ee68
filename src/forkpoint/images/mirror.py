"""A registry mirror for machines that cannot pull public images (air-gapped installs).

``forkpoint image mirror start`` runs Debian's ``docker-registry`` on 127.0.0.1 with its
storage under ``$FORKPOINT_HOME/mirror`` and writes a ``registries.conf`` that makes it
``docker.io``'s mirror. forkpoint's podman builds use that file
(``CONTAINERS_REGISTRIES_CONF``, :func:`registries_env`); the host's own podman
configuration is left alone. The operator fills the mirror with images built here
(``mirror push``); ``mirror standins`` builds Debian stand-ins for the public images E2B's
templates start from (``ubuntu:22.04``, ``ubuntu:24.04``, ``node:24``) from Debian's archive.
A stand-in is Debian under another name: a build that checks the distribution itself sees
Debian.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from forkpoint.config import home
from forkpoint.errors import Conflict, ImageBuildError, InvalidInput

__all__ = [
    "DEFAULT_MIRROR_PORT",
    "STAND_INS",
    "MirrorStatus",
    "build_stand_ins",
    "docker_hub_path",
    "mirror_status",
    "push",
    "registries_env",
    "start_mirror",
    "stop_mirror",
]

DEFAULT_MIRROR_PORT: Final = 5000
#: Public image -> the Debian packages its stand-in adds to a minimal Debian.
STAND_INS: Final[dict[str, tuple[str, ...]]] = {
    "ubuntu:22.04": (),
    "ubuntu:24.04": (),
    "node:24": ("nodejs", "npm"),
}
_START_WAIT_S: Final = 15.0

Log = Callable[[str], None]


def _dir() -> Path:
    return home().root / "mirror"


def _registries_conf() -> Path:
    return _dir() / "registries.conf"


def registries_env() -> dict[str, str]:
    """The environment that points podman and skopeo at the mirror ({} if none is set up)."""
    conf = _registries_conf()
    return {"CONTAINERS_REGISTRIES_CONF": str(conf)} if conf.is_file() else {}


@dataclass(frozen=True)
class MirrorStatus:
    configured: bool
    running: bool
    address: str | None
    images: list[str]

    def to_dict(self) -> dict[str, object]:
        return {
            "configured": self.configured, "running": self.running,
            "address": self.address, "images": self.images,
        }  # fmt: skip


def _address() -> str | None:
    path = _dir() / "address"
    return path.read_text().strip() if path.is_file() else None


def _pid() -> int | None:
    try:
        pid = int((_dir() / "registry.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _get(address: str, path: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as answer:
            data = json.loads(answer.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return data if isinstance(data, dict) else None


def start_mirror(port: int = DEFAULT_MIRROR_PORT) -> MirrorStatus:
    """Run the registry on ``127.0.0.1:port`` (already running: nothing changes) and make it
    ``docker.io``'s mirror for forkpoint's builds.

    :raises ImageBuildError: ``docker-registry`` is not installed or did not answer.
    :raises Conflict: it runs on another port.
    """
    if not 0 < port < 65536:
        raise InvalidInput(f"port {port} is not a TCP port")
    registry = shutil.which("docker-registry")
    if registry is None:
        raise ImageBuildError(
            "docker-registry is not installed: apt-get install docker-registry (make setup)"
        )
    directory = _dir()
    directory.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{port}"
    if _pid() is not None:
        if _address() != address:
            raise Conflict(
                f"the mirror already runs on {_address()}: `forkpoint image mirror stop`"
            )
        return mirror_status()
    config = directory / "registry.yml"
    # Loopback only: the mirror serves this host's builds, nobody else.
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {directory / 'data'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: {address}\n"
    )
    log = open(directory / "registry.log", "ab")  # noqa: SIM115 - handed to the child
    with log:
        proc = subprocess.Popen(
            [registry, "serve", str(config)], stdin=subprocess.DEVNULL, stdout=log,
            stderr=log, start_new_session=True,
        )  # fmt: skip
    (directory / "registry.pid").write_text(str(proc.pid))
    (directory / "address").write_text(address)
    deadline = time.monotonic() + _START_WAIT_S
    while _get(address, "/v2/") is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (directory / "registry.log").read_text(errors="replace").strip()
            last = tail.splitlines()[-1] if tail else "no output"
            stop_mirror()
            raise ImageBuildError(f"the registry mirror did not start on {address}: {last}")
        time.sleep(0.1)
    _registries_conf().write_text(
        'unqualified-search-registries = ["docker.io"]\n'
        'short-name-mode = "permissive"\n\n'
        '[[registry]]\nprefix = "docker.io"\nlocation = "docker.io"\n\n'
        f'[[registry.mirror]]\nlocation = "{address}"\ninsecure = true\n'
    )
    return mirror_status()


def stop_mirror() -> None:
    """Stop the registry and stop using it (its images stay for the next start)."""
    pid = _pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
    for name in ("registry.pid", "registries.conf"):
        (_dir() / name).unlink(missing_ok=True)


def mirror_status() -> MirrorStatus:
    address = _address()
    running = _pid() is not None and address is not None
    images: list[str] = []
    if running and address is not None:
        catalog = _get(address, "/v2/_catalog") or {}
        for repo in catalog.get("repositories") or []:
            tags = (_get(address, f"/v2/{repo}/tags/list") or {}).get("tags") or []
            images += [f"{repo}:{tag}" for tag in tags]
    return MirrorStatus(_registries_conf().is_file(), running, address, sorted(images))


def docker_hub_path(name: str) -> str:
    """``ubuntu:22.04`` -> ``library/ubuntu:22.04``; ``e2bdev/base`` -> ``e2bdev/base:latest``
    (the path under ``docker.io`` a pull of ``name`` asks the mirror for).

    :raises InvalidInput: a name of another registry, or not an image name.
    """
    bare = name.removeprefix("docker.io/")
    first, slash, _ = bare.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        raise InvalidInput(f"{name}: the mirror stands in for docker.io images only")
    if not bare or any(c.isspace() for c in bare):
        raise InvalidInput(f"{name!r} is not an image name")
    if "/" not in bare:
        bare = f"library/{bare}"
    if ":" not in bare.rsplit("/", 1)[-1]:
        bare += ":latest"
    return bare


def push(source: str, name: str) -> str:
    """Copy ``source`` (an image in the local container storage) into the mirror as
    ``docker.io``'s ``name``; returns the mirror's reference.

    :raises Conflict: the mirror is not running.
    """
    address = _address()
    if _pid() is None or address is None:
        raise Conflict("the registry mirror is not running: `forkpoint image mirror start`")
    target = f"{address}/{docker_hub_path(name)}"
    proc = subprocess.run(
        ["skopeo", "copy", "-q", "--dest-tls-verify=false",
         f"containers-storage:{source}", f"docker://{target}"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ImageBuildError(f"pushing {source} to the mirror failed: {last}")
    return target


def build_stand_ins(names: list[str] | None = None, log: Log | None = None) -> list[str]:
    """Build Debian stand-ins for public images (default: all of :data:`STAND_INS`) and push
    them to the mirror; returns the names pushed."""
    from forkpoint.images.recipe import Recipe, host_suite
    from forkpoint.images.rootfs import base_tarball

    wanted = names or list(STAND_INS)
    unknown = [n for n in wanted if n not in STAND_INS]
    if unknown:
        raise InvalidInput(f"no stand-in for {', '.join(unknown)} (known: {', '.join(STAND_INS)})")
    pushed = []
    for name in wanted:
        # forkpoint's own minimal Debian (its mmdebstrap tarball is cached) + the packages.
        recipe = Recipe.create("stand-in", STAND_INS[name])
        with tempfile.TemporaryDirectory(prefix="forkpoint-standin-") as work:
            tarball = base_tarball(recipe, home().cache, Path(work), log)
        # Not named like the image it stands for: podman would take it for that short name.
        local = f"localhost/forkpoint-standin:{name.replace(':', '-').replace('/', '-')}"
        if log is not None:
            log(f"{name}: Debian {host_suite()} {' '.join(STAND_INS[name])}".rstrip())
        subprocess.run(
            ["podman", "import", "-q", "--change", 'CMD ["/bin/bash"]', str(tarball), local],
            check=True, capture_output=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        push(local, name)
        pushed.append(name)
    return pushed
