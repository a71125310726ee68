"""Images from a Dockerfile or an OCI image (``images/oci.py``), offline.

No registry is reachable here, so base images are made locally: a Debian root filesystem
from mmdebstrap (no Python in it) and a busybox-only one (no libc, no Python: the shape of
Alpine's), each imported into podman's storage. The VM story builds one Dockerfile image
``FROM`` the Debian base (``RUN`` installs a package from the archive, ``COPY``, ``ENV``,
``WORKDIR``, ``USER``, a ``CMD`` serving HTTP) once, into a home of its own under the test
home (never the shared images directory: ``image rm`` is tested there).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from e2b_gateway import running_gateway
from forkpoint.config import home
from forkpoint.errors import InvalidInput, UnusableImage
from forkpoint.images import Recipe
from forkpoint.images.oci import check_guest, check_user, parse_build_args, resolve_ref
from forkpoint.images.recipe import host_suite

FORKPOINT = Path(sys.executable).with_name("forkpoint")
_BUSYBOX = shutil.which("busybox")
_TOOLS = all(shutil.which(t) for t in ("podman", "skopeo", "umoci", "mmdebstrap"))
needs_tools = pytest.mark.skipif(
    not _TOOLS or os.geteuid() != 0, reason="needs root and podman, skopeo, umoci, mmdebstrap"
)
_TEST_REPO = "localhost/forkpoint-test"


# --- the guest check, on synthetic trees (no tools) --------------------------------------


def _busybox_tree(root: Path) -> Path:
    if _BUSYBOX is None:
        pytest.skip("busybox-static is not installed")
    (root / "bin").mkdir(parents=True)
    shutil.copy(_BUSYBOX, root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    return root


def test_check_guest_accepts_a_static_shell_through_absolute_links(tmp_path: Path) -> None:
    tree = _busybox_tree(tmp_path / "t")
    (tree / "usr").mkdir()
    (tree / "usr" / "bin").symlink_to("/bin")  # absolute: must resolve inside the tree
    (tree / "bin" / "sh").unlink()
    (tree / "bin" / "sh").symlink_to("/usr/bin/busybox")
    assert check_guest(tree, "t") == "static"


def test_check_guest_names_what_is_missing(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "etc").mkdir(parents=True)
    with pytest.raises(UnusableImage, match=r"has no shell \(/bin/sh\)"):
        check_guest(empty, "empty")
    # A dynamically linked shell whose loader the image lacks: no C library.
    nolibc = tmp_path / "nolibc"
    (nolibc / "bin").mkdir(parents=True)
    shutil.copy(os.path.realpath("/bin/sh"), nolibc / "bin" / "sh")
    with pytest.raises(UnusableImage, match="has no C library: /bin/sh needs /lib64/ld-linux"):
        check_guest(nolibc, "nolibc")
    (nolibc / "bin" / "sh").write_text("#!/bin/foo\n")
    with pytest.raises(UnusableImage, match="not a 64-bit ELF"):
        check_guest(nolibc, "nolibc")
    # A link out of the tree (../../..) stays inside it and finds nothing.
    escape = tmp_path / "escape"
    (escape / "bin").mkdir(parents=True)
    (escape / "bin" / "sh").symlink_to("../../../../../../bin/sh")
    with pytest.raises(UnusableImage, match="no shell"):
        check_guest(escape, "escape")


def _elf(path: Path, interpreter: str, machine: int = 62) -> None:
    """A minimal 64-bit ELF header with one program header, PT_INTERP naming
    ``interpreter`` (all :func:`check_guest` reads)."""
    interp = interpreter.encode() + b"\0"
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HHI", header, 0x10, 3, machine, 1)  # ET_DYN, e_machine, version
    struct.pack_into("<Q", header, 0x20, 64)  # e_phoff
    struct.pack_into("<HH", header, 0x36, 56, 1)  # e_phentsize, e_phnum
    ph = struct.pack("<IIQQQQQQ", 3, 4, 120, 0, 0, len(interp), len(interp), 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(header) + ph + interp)


def test_check_guest_tells_musl_from_glibc_and_refuses_other_machines(tmp_path: Path) -> None:
    musl = tmp_path / "alpine"
    _elf(musl / "bin" / "busybox", "/lib/ld-musl-x86_64.so.1")
    (musl / "bin" / "sh").symlink_to("/bin/busybox")
    with pytest.raises(UnusableImage, match="needs /lib/ld-musl-x86_64.so.1, which is missing"):
        check_guest(musl, "alpine")
    (musl / "lib").mkdir()
    (musl / "lib" / "ld-musl-x86_64.so.1").write_bytes(b"")
    assert check_guest(musl, "alpine") == "musl"
    glibc = tmp_path / "debian"
    _elf(glibc / "usr" / "bin" / "dash", "/lib64/ld-linux-x86-64.so.2")
    (glibc / "bin").symlink_to("usr/bin")  # merged /usr, relative as Debian has it
    (glibc / "usr" / "bin" / "sh").symlink_to("dash")
    (glibc / "lib64").mkdir()
    (glibc / "lib64" / "ld-linux-x86-64.so.2").symlink_to("/lib/x86_64-linux-gnu/ld.so")
    with pytest.raises(UnusableImage, match="no C library"):
        check_guest(glibc, "debian")  # the loader link dangles inside the image
    (glibc / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
    (glibc / "lib" / "x86_64-linux-gnu" / "ld.so").write_bytes(b"")
    assert check_guest(glibc, "debian") == "glibc"
    arm = tmp_path / "arm"
    _elf(arm / "bin" / "sh", "/lib/ld-linux-aarch64.so.1", machine=183)
    with pytest.raises(UnusableImage, match="built for aarch64; forkpoint guests are x86-64"):
        check_guest(arm, "arm")


def test_the_images_user_must_have_an_account(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0::/root:/bin/sh\nweb:x:1001:1001::/:/bin/sh\n"
    )
    for fine in (None, "root", "0", "web", "1001", "web:web", "1001:1001"):
        check_user(tmp_path, fine, "img")
    with pytest.raises(UnusableImage, match="its USER nobody has no account in /etc/passwd"):
        check_user(tmp_path, "nobody", "img")
    with pytest.raises(UnusableImage, match="USER 1002:1002 has no account"):
        check_user(tmp_path, "1002:1002", "img")


def test_build_args_and_recipes() -> None:
    assert parse_build_args(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(InvalidInput, match="expected NAME=VALUE"):
        parse_build_args(["novalue"])
    one = Recipe.for_oci("app", "oci-1:sha256:aa")
    assert one.hash() == Recipe.for_oci("app", "oci-1:sha256:aa").hash()
    assert one.hash() != Recipe.for_oci("app", "oci-1:sha256:bb").hash()
    assert one.hash() != Recipe.for_oci("app", "oci-1:sha256:aa", start=False).hash()
    assert Recipe.from_dict(json.loads(json.dumps(one.to_dict()))) == one
    assert "base" not in Recipe.create().to_dict()  # Debian recipes keep their old hash


# --- real tools, no VM -------------------------------------------------------------------


def _podman(*args: str) -> str:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def _has_image(name: str) -> bool:
    return subprocess.run(["podman", "image", "exists", name], check=False).returncode == 0


def _import_tree(tree: Path, name: str) -> str:
    """``podman import`` of a directory tree (as a tarball); returns its reference."""
    if not _has_image(name):
        archive = tree.with_suffix(".tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(tree, arcname=".")
        _podman("import", str(archive), name)
    return name


def _private_home(root: Path) -> dict[str, str]:
    """A home with its own images directory; the download cache is the shared one."""
    root.mkdir(parents=True, exist_ok=True)
    cache = root / "cache"
    if not cache.is_symlink():
        cache.symlink_to(home().cache.resolve())
    return {**os.environ, "FORKPOINT_HOME": str(root)}


def _cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FORKPOINT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@needs_tools
def test_an_image_without_a_shell_fails_in_one_line_and_caches_nothing(tmp_path: Path) -> None:
    tree = tmp_path / "noshell"
    (tree / "data").mkdir(parents=True)
    (tree / "data" / "hello.txt").write_text("no shell here\n")
    ref = _import_tree(tree, f"{_TEST_REPO}/noshell:1")
    env = _private_home(tmp_path / "home")
    started = time.monotonic()
    proc = _cli(env, "image", "build", "broken", "--from-oci", ref)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: image {ref} has no shell (/bin/sh): forkpoint's init needs one"], (
        proc.stderr
    )
    assert time.monotonic() - started < 60  # before any kernel work
    images = tmp_path / "home" / "images"
    assert [p.name for p in images.iterdir() if not p.name.startswith(".lock")] in ([], ["names"])
    assert json.loads(_cli(env, "image", "ls", "--json").stdout) == []


@needs_tools
def test_every_kind_of_reference_names_the_same_content(tmp_path: Path) -> None:
    tree = _busybox_tree(tmp_path / "bb")
    ref = _import_tree(tree, f"{_TEST_REPO}/busybox:1")
    stored = resolve_ref(ref)
    assert stored.kind == "containers-storage" and stored.digest.startswith("sha256:")
    archive = tmp_path / "saved.tar"
    _podman("save", "--format", "docker-archive", "-o", str(archive), ref)
    layout = tmp_path / "layout"
    subprocess.run(
        ["skopeo", "copy", "-q", f"containers-storage:{ref}", f"oci:{layout}:v1"], check=True
    )
    from_archive, from_layout = resolve_ref(str(archive)), resolve_ref(str(layout))
    assert (from_archive.kind, from_layout.kind) == ("docker-archive", "oci-layout")
    assert from_archive.digest == from_layout.digest == stored.digest  # one content, one hash
    with pytest.raises(InvalidInput, match="not an OCI layout"):
        resolve_ref(str(tmp_path))
    with pytest.raises(Exception, match="no image .* in the local container storage"):
        resolve_ref(f"{_TEST_REPO}/absent:0")


# --- the VM story ------------------------------------------------------------------------

_DOCKERFILE = f"""\
FROM {_TEST_REPO}/debian:{host_suite()}
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive \\
    apt-get install -y -q --no-install-recommends busybox && rm -rf /var/lib/apt/lists/*
COPY app /srv/app
ENV GREETING=hello APP_MODE=oci-test
RUN useradd -m -u 1001 web
WORKDIR /srv/app
USER web
CMD ["busybox", "httpd", "-f", "-p", "8000", "-h", "/srv/app"]
"""
_PAGE = "<h1>served by the image's CMD</h1>\n"


def _debian_base(root: Path) -> str:
    """A Debian root filesystem (mmdebstrap minbase: no Python) in podman's storage."""
    name = f"{_TEST_REPO}/debian:{host_suite()}"
    if not _has_image(name):
        tarball = root / "debian-base.tar"
        subprocess.run(
            ["mmdebstrap", "--variant=minbase", "--quiet", "--aptopt=APT::Sandbox::User root",
             host_suite(), str(tarball)],
            check=True,
        )  # fmt: skip
        _podman("import", str(tarball), name)
        tarball.unlink()
    return name


@pytest.fixture(scope="module")
def oci_home() -> Iterator[dict[str, str]]:
    root = home().root / "oci-home"
    env = _private_home(root)
    yield env
    # Leave nothing that pins the images (a failed run's checkpoint would refuse `image rm`).
    for session in json.loads(_cli(env, "ls", "--json").stdout or "[]"):
        _cli(env, "rm", session["id"])
    for checkpoint in json.loads(_cli(env, "checkpoints", "--json").stdout or "[]"):
        _cli(env, "checkpoint", "rm", checkpoint["id"])


def _build_app(
    env: dict[str, str], context: Path
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = _cli(env, "image", "build", "ocitest", "--dockerfile", str(context / "Dockerfile"))
    return proc, time.monotonic() - started


@pytest.fixture(scope="module")
def app_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Dockerfile and its context, ``FROM`` the Debian base (made if podman lacks it)."""
    root = tmp_path_factory.mktemp("oci")
    _debian_base(root)
    context = root / "ctx"
    (context / "app").mkdir(parents=True)
    (context / "app" / "index.html").write_text(_PAGE)
    (context / "Dockerfile").write_text(_DOCKERFILE)
    return context


def _get(url: str, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _json(proc: subprocess.CompletedProcess[str]) -> object:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _sh(env: dict[str, str], session: str, script: str) -> str:
    proc = _cli(env, "exec", session, "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _image_names(env: dict[str, str]) -> list[str]:
    listed = _json(_cli(env, "image", "ls", "--json"))
    assert isinstance(listed, list)
    return [str(i["name"]) for i in listed]


def _pid_of(env: dict[str, str], session: str, needle: str) -> int:
    processes = _json(_cli(env, "ps", session, "--json"))
    assert isinstance(processes, list)
    return next(int(p["pid"]) for p in processes if needle in p["cmd"])


@needs_tools
@pytest.mark.vm
def test_dockerfile_image_story(oci_home: dict[str, str], app_context: Path) -> None:
    env, context = oci_home, app_context
    built, first_s = _build_app(env, context)
    assert built.returncode == 0, built.stderr
    assert "STEP 8/8" in built.stderr  # progress shown
    again, again_s = _build_app(env, context)
    assert again.returncode == 0 and "(cached)" in again.stderr, again.stderr
    assert again_s < 30, again_s  # podman's layer cache + forkpoint's content hash
    # The same content through another kind of reference is the same image: a cache hit.
    layout = context.parent / "layout"
    subprocess.run(
        ["skopeo", "copy", "-q", "containers-storage:localhost/forkpoint/ocitest:latest",
         f"oci:{layout}:v1"],
        check=True,
    )  # fmt: skip
    same = _cli(env, "image", "build", "ocitest", "--from-oci", str(layout))
    assert same.returncode == 0 and "(cached)" in same.stderr, same.stderr
    listed = _json(_cli(env, "image", "ls", "--json"))
    assert isinstance(listed, list)
    (image,) = [i for i in listed if i["name"] == "ocitest" and i["current"]]
    assert image["source"]["kind"] == "dockerfile"
    assert image["config"]["user"] == "web" and image["config"]["cwd"] == "/srv/app"

    session = _json(_cli(env, "create", "--image", "ocitest", "--port", "8000", "--json"))
    assert isinstance(session, dict)
    sid, url = session["id"], session["ports"][0]["url"]
    assert _get(url + "/index.html") == _PAGE  # the CMD runs from the template on
    out = _sh(env, sid, 'id -un; pwd; echo "$GREETING $APP_MODE $HOME"; cat index.html')
    assert out.splitlines() == ["web", "/srv/app", "hello oci-test /home/web", _PAGE.strip()]
    assert _sh(env, sid, "command -v python3 || echo none").strip() == "none"  # agent's own
    server = _pid_of(env, sid, "httpd")

    checkpoint = _json(_cli(env, "checkpoint", sid, "--json"))
    assert isinstance(checkpoint, dict)
    forks = _json(_cli(env, "fork", checkpoint["id"], "--json"))
    assert isinstance(forks, list)
    fork = forks[0]
    assert _get(fork["ports"][0]["url"] + "/index.html") == _PAGE
    assert _pid_of(env, fork["id"], "httpd") == server  # restored, not restarted

    refused = _cli(env, "image", "rm", "ocitest")
    assert refused.returncode == 4
    assert refused.stderr.strip() == (
        f"error: image ocitest is in use by sessions {sid}, {fork['id']}: remove them first"
    )
    assert "ocitest" in _image_names(env)

    assert _cli(env, "exec", sid, "--", "sh", "-c", f"kill {server}").returncode == 0
    back = _json(_cli(env, "rollback", sid, checkpoint["id"], "--json"))
    assert isinstance(back, dict)
    assert _get(url + "/index.html") == _PAGE
    assert _pid_of(env, sid, "httpd") == server
    for s in (sid, fork["id"]):
        assert _cli(env, "rm", s).returncode == 0
    needed = _cli(env, "image", "rm", "ocitest")
    assert needed.returncode == 4 and "needed by checkpoint" in needed.stderr
    assert _cli(env, "checkpoint", "rm", checkpoint["id"]).returncode == 0
    print(f"first build {first_s:.1f} s, cached rebuild {again_s:.1f} s")


@needs_tools
@pytest.mark.vm
def test_busybox_only_image_runs_the_agent_and_is_removed(
    oci_home: dict[str, str], tmp_path: Path
) -> None:
    """No libc, no Python, no bash, no ip (Alpine's shape): the agent still runs."""
    env = oci_home
    ref = _import_tree(_busybox_tree(tmp_path / "bb"), f"{_TEST_REPO}/busybox:1")
    built = _cli(env, "image", "build", "bbtest", "--from-oci", ref, "--json")
    image = _json(built)
    assert isinstance(image, dict) and image["source"]["kind"] == "containers-storage"
    session = _json(_cli(env, "create", "--image", "bbtest", "--json"))
    assert isinstance(session, dict)
    out = _sh(env, session["id"], "busybox ip -4 addr show eth0 | grep -c 10.0.2.15; id -u")
    assert out.split() == ["1", "0"]
    assert _cli(env, "rm", session["id"]).returncode == 0
    removed = _json(_cli(env, "image", "rm", "bbtest", "--json"))
    assert removed == {"name": "bbtest", "removed": [image["hash"]]}
    assert "bbtest" not in _image_names(env)
    assert not (Path(env["FORKPOINT_HOME"]) / "images" / image["hash"]).exists()


@needs_tools
@pytest.mark.vm
def test_an_e2b_template_name_is_the_image(
    oci_home: dict[str, str], app_context: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The official e2b SDK's ``Sandbox.create("ocitest")`` runs the Dockerfile's image:
    its WORKDIR and ENV apply to E2B's commands (which run as ``user``, as on E2B)."""
    built, _ = _build_app(oci_home, app_context)  # cached by the story's build
    assert built.returncode == 0, built.stderr
    monkeypatch.setenv("FORKPOINT_HOME", oci_home["FORKPOINT_HOME"])
    with running_gateway():
        sandbox = Sandbox.create("ocitest")
        try:
            result = sandbox.commands.run('pwd; echo "$GREETING"; id -un; cat index.html')
            assert result.stdout.splitlines() == ["/srv/app", "hello", "user", _PAGE.strip()]
        finally:
            sandbox.kill()
