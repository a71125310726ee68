"""Templates from code, without VMs: the SDK's steps as a Dockerfile, COPY steps' files as
the tars podman unpacks, names and tags, the mirror's names, and images whose symlinks
lead out of their tree."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from forkpoint.e2b.template_builds import check_tags, split_name
from forkpoint.e2b.template_dockerfile import TemplateSpec, to_dockerfile
from forkpoint.e2b.template_files import stage_copy
from forkpoint.errors import InvalidInput, UnusableImage
from forkpoint.images.account import add_guest_user
from forkpoint.images.mirror import docker_hub_path
from forkpoint.images.oci import refuse_links_out


def _spec(**fields: object) -> TemplateSpec:
    return TemplateSpec.model_validate({"fromImage": "ubuntu:22.04", **fields})


def test_steps_become_a_dockerfile_whose_instructions_name_their_step() -> None:
    spec = _spec(
        steps=[
            {"type": "RUN", "args": ["apt-get update"]},
            {"type": "RUN", "args": ["whoami", "root"]},
            {"type": "ENV", "args": ["A", "x y", "B", '"q"']},
            {"type": "COPY", "args": ["app/*", "app", "", ""], "filesHash": "f" * 64},
            {"type": "WORKDIR", "args": ["/srv/my app"]},
            {"type": "USER", "args": ["root"]},
        ],
        startCmd="python3 -m http.server 8000",
        readyCmd="ss -Htln | grep -q :8000",
    )
    plan = to_dockerfile(spec, "ubuntu:22.04", {4: ("copy-4.tar", "app/")})
    text = plan.text
    assert text.startswith("FROM ubuntu:22.04\nUSER root\n")
    assert 'USER root\nRUN ["/bin/sh", "-c", "whoami"]\nUSER user\n' in text
    assert 'ENV A="x y" B="\\"q\\""' in text
    assert 'ADD --chown=user ["copy-4.tar", "app/"]' in text
    assert "mkdir -p '/srv/my app'" in text and 'WORKDIR "/srv/my app"' in text
    assert text.endswith(
        'CMD ["/bin/sh", "-c", "python3 -m http.server 8000"]\n'
        'LABEL dev.forkpoint.ready-cmd="ss -Htln | grep -q :8000"\n'
    )
    # podman's "STEP n" -> the SDK's step: the base's provisioning is "base", the run as
    # root is step 2 (all three of its instructions), the start command "finalize".
    steps = [plan.step_of(n) for n in range(1, len(plan.lines) + 1)]
    assert steps[:5] == ["base"] * 5 and steps[6:9] == ["2"] * 3
    assert steps[-2:] == ["finalize", "finalize"] and plan.step_of(999) == "base"


def test_bad_steps_are_refused() -> None:
    with pytest.raises(InvalidInput, match="COPY needs"):
        to_dockerfile(_spec(steps=[{"type": "COPY", "args": ["a", "b"]}]), "x", {})
    with pytest.raises(InvalidInput, match="ENV needs name and value pairs"):
        to_dockerfile(_spec(steps=[{"type": "ENV", "args": ["A"]}]), "x", {})
    with pytest.raises(InvalidInput, match="RUN without a command"):
        to_dockerfile(_spec(steps=[{"type": "RUN", "args": []}]), "x", {})


def test_a_copy_keeps_links_as_they_are(tmp_path: Path) -> None:
    files = tmp_path / "upload"
    (files / "folder" / "sub").mkdir(parents=True)
    (files / "folder" / "test.txt").write_text("hello")
    (files / "folder" / "sub" / "deep.txt").write_text("deep")
    os.symlink("test.txt", files / "folder" / "relative.txt")
    os.symlink("/somewhere/on/the/sdk/machine", files / "folder" / "absolute.txt")
    os.symlink("missing.txt", files / "folder" / "dangling.txt")

    archive = tmp_path / "copy.tar"
    assert stage_copy(files, "folder/*", "folder", None, archive) == "folder/"
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {
        "test.txt", "relative.txt", "absolute.txt", "dangling.txt", "sub", "sub/deep.txt",
    }  # fmt: skip
    assert members["absolute.txt"].issym()
    assert members["absolute.txt"].linkname == "/somewhere/on/the/sdk/machine"

    # One file to a target that does not end with "/" becomes that file, with its mode.
    assert stage_copy(files, "folder/test.txt", "/app/main.txt", "0755", archive) == "/app/"
    with tarfile.open(archive) as tar:
        (only,) = tar.getmembers()
    assert (only.name, only.mode) == ("main.txt", 0o755)
    with pytest.raises(InvalidInput, match="no such file"):
        stage_copy(files, "nothing/*", "x", None, archive)


def test_names_and_tags() -> None:
    assert split_name("my-env:v1.0") == ("my-env", "v1.0")
    assert split_name("my-env") == ("my-env", None)
    for bad in ("My Env", ":tag", "name:", "name:a:b", ""):
        with pytest.raises(InvalidInput):
            split_name(bad)
    with pytest.raises(InvalidInput, match="invalid tag"):
        check_tags([":invalid-tag"])
    with pytest.raises(InvalidInput, match="invalid tag"):
        check_tags(["e2b-tags-test:"])


def test_mirror_names_are_docker_hub_paths() -> None:
    assert docker_hub_path("ubuntu:22.04") == "library/ubuntu:22.04"
    assert docker_hub_path("e2bdev/base") == "e2bdev/base:latest"
    assert docker_hub_path("docker.io/library/node:24") == "library/node:24"
    for other in ("registry.example.com/x:1", "localhost/x", "127.0.0.1:5000/x"):
        with pytest.raises(InvalidInput, match="docker.io images only"):
            docker_hub_path(other)


def test_an_image_linking_out_of_its_tree_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    (tree / "usr" / "sbin").mkdir(parents=True)
    os.symlink("usr/sbin", tree / "sbin")  # merged /usr: stays inside
    (tree / "etc").mkdir()
    refuse_links_out(tree, "fine")
    victim = tmp_path / "host-shadow"
    victim.write_text("the host's")
    os.symlink(victim, tree / "etc" / "shadow")
    with pytest.raises(UnusableImage, match="/etc/shadow is a symlink out of the image"):
        refuse_links_out(tree, "hostile")
    assert victim.read_text() == "the host's"


def test_the_guest_user_s_home_is_chowned_without_following_links(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    (tree / "etc").mkdir(parents=True)
    (tree / "home" / "user").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_text("not the guest's")
    before = outside.stat()
    os.symlink(outside, tree / "home" / "user" / "link")
    os.symlink("missing", tree / "home" / "user" / "dangling")
    add_guest_user(tree)
    after = outside.stat()
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert os.lstat(tree / "home" / "user" / "dangling").st_uid == 1000
