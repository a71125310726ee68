"""xterm.js for the page's terminal: fetched from the npm registry at build time
(``make setup`` runs :func:`main`), checked against the integrity
hash pinned here, unpacked into the package (``server/vendor/``, not in git) and served by
the page from ``/ui/vendor/`` — the browser fetches nothing from elsewhere."""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from forkpoint.errors import ForkpointError

__all__ = ["VENDOR_DIR", "fetch_all", "main", "vendored"]

VENDOR_DIR = Path(__file__).with_name("vendor")
_REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True)
class _Package:
    name: str  # "@scope/name"
    version: str
    integrity: str  # the registry's dist.integrity
    files: dict[str, str]  # path in the package -> name served under /ui/vendor/

    @property
    def url(self) -> str:
        return f"{_REGISTRY}/{self.name}/-/{self.name.split('/')[-1]}-{self.version}.tgz"


PACKAGES = (
    _Package(
        "@xterm/xterm", "6.0.0",
        "sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==",
        {"lib/xterm.js": "xterm.js", "css/xterm.css": "xterm.css", "LICENSE": "xterm.LICENSE"},
    ),
    _Package(
        "@xterm/addon-fit", "0.11.0",
        "sha512-jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g==",
        {"lib/addon-fit.js": "addon-fit.js"},
    ),
)  # fmt: skip
SERVED = frozenset(name for package in PACKAGES for name in package.files.values())
_STAMP = VENDOR_DIR / "versions"


def _stamp_text() -> str:
    return "".join(f"{p.name}@{p.version}\n" for p in PACKAGES)


def vendored(name: str) -> Path | None:
    """The vendored file served as ``name``, if the build fetched it."""
    path = VENDOR_DIR / name
    return path if name in SERVED and path.is_file() else None


def _fetch(package: _Package, client: httpx.Client) -> None:
    tarball = client.get(package.url).raise_for_status().content
    algorithm, _, expected = package.integrity.partition("-")
    digest = base64.b64encode(hashlib.new(algorithm, tarball).digest()).decode()
    if digest != expected:
        raise ForkpointError(f"{package.url}: integrity mismatch (got {algorithm}-{digest})")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        for member, served in package.files.items():
            data = archive.extractfile(f"package/{member}")
            if data is None:
                raise ForkpointError(f"{package.url} has no file {member}")
            (VENDOR_DIR / served).write_bytes(data.read())


def fetch_all() -> bool:
    """Fetch what is missing or of another version; False if nothing had to be fetched."""
    if _STAMP.is_file() and _STAMP.read_text() == _stamp_text():
        return False
    VENDOR_DIR.mkdir(exist_ok=True)
    with httpx.Client(timeout=60, follow_redirects=True) as client:
        for package in PACKAGES:
            _fetch(package, client)
    _STAMP.write_text(_stamp_text())
    return True


def main() -> None:
    """``make vendor``: fetch what is missing, one line of output, a one-line error."""
    try:
        if fetch_all():
            print(f"vendored {', '.join(f'{p.name}@{p.version}' for p in PACKAGES)}")
    except (httpx.HTTPError, ForkpointError) as error:
        sys.exit(f"vendor: {error}")
