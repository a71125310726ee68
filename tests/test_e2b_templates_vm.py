"""Templates built from code with the real ``e2b`` SDK through the gateway: a public image
pulled through forkpoint's registry mirror (a Debian stand-in for ``ubuntu:22.04``), files
uploaded by hash, the log line by line, the start command serving before the first
sandbox, a failing step named with its line, tags, and removal."""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import (
    BuildException,
    LogEntry,
    Sandbox,
    SandboxException,
    Template,
    wait_for_port,
)

from e2b_gateway import Gateway, free_port, running_gateway
from forkpoint.config import home

pytestmark = pytest.mark.vm

_FP = [sys.executable, "-m", "forkpoint.cli.app"]


def _fp(*args: str) -> str:
    return subprocess.run([*_FP, *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def mirror() -> Iterator[dict[str, object]]:
    """The mirror in the test home, holding the stand-in; podman's own copy of the image
    loses its name, so the build pulls it through the mirror."""
    _fp("image", "mirror", "start", "--port", str(free_port()))
    try:
        _fp("image", "mirror", "standins", "ubuntu:22.04")
        subprocess.run(["podman", "untag", "docker.io/library/ubuntu:22.04"],
                       capture_output=True, check=False)  # fmt: skip
        yield json.loads(_fp("image", "mirror", "status", "--json"))
    finally:
        _fp("image", "mirror", "stop")


@pytest.fixture(scope="module")
def gateway(mirror: dict[str, object]) -> Iterator[Gateway]:
    with running_gateway("--e2b-timeout", "600", "--template-builds") as gw:
        yield gw


def test_a_template_from_code_serves_from_its_first_sandbox(
    gateway: Gateway, mirror: dict[str, object], tmp_path: Path
) -> None:
    assert mirror["running"] and "library/ubuntu:22.04" in mirror["images"]  # type: ignore[operator]
    run = uuid.uuid4().hex  # new files and steps: no cache from an earlier run
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text(f"<h1>built from code</h1> {run}\n")
    template = (
        Template(file_context_path=str(tmp_path))
        .from_image("ubuntu:22.04")
        .copy("site/*", "/srv/site/")
        .set_envs({"GREETING": "hello from the template"})
        .run_cmd(f"echo building as $(whoami) in $(pwd) {run}")
        .set_workdir("/srv/site")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    uploads = home().root / "e2b-template-files"
    uploaded_before = set(uploads.iterdir()) if uploads.is_dir() else set()
    logs: list[LogEntry] = []
    info = Template.build(template, "fp-served:v1", on_build_logs=logs.append)
    assert set(uploads.iterdir()) - uploaded_before  # the files, under their hash
    messages = [entry.message for entry in logs]
    assert any("building as user in /home/user" in m for m in messages), messages
    assert any(m.startswith("STEP ") for m in messages)  # podman's steps, line by line
    assert "Uploaded 'site/*'" in messages
    assert Template.exists("fp-served") and info.tags == ["v1"]
    assert _fp("image", "ls", "--json").count(f"e2b-{info.template_id}") >= 1

    try:
        first, second = Sandbox.create("fp-served:v1"), Sandbox.create("fp-served:v1")
        try:
            fetch = (
                'python3 -c "import urllib.request as u;'
                "print(u.urlopen('http://127.0.0.1:8000/index.html').read().decode())\""
            )
            # the server was started and found ready before the template's checkpoint:
            # it answers at once, at the same PID in every sandbox
            assert "built from code" in first.commands.run(fetch).stdout
            pids = [
                sb.commands.run("pgrep -f 'http.server 8000'").stdout.split()
                for sb in (first, second)
            ]
            assert pids[0] == pids[1] and pids[0]
            assert first.commands.run("echo $GREETING").stdout.strip() == "hello from the template"
        finally:
            first.kill()
            second.kill()

        # The same files again: the upload is skipped (its hash is already here).
        again: list[LogEntry] = []
        Template.build(template, "fp-served:v2", on_build_logs=again.append)
        assert any("already cached" in e.message for e in again)
        Template.assign_tags("fp-served:v2", ["production"])
        assert {t.tag for t in Template.get_tags("fp-served")} >= {"v1", "v2", "production"}
        Template.remove_tags("fp-served", "v1")
        assert "v1" not in {t.tag for t in Template.get_tags("fp-served")}
    finally:
        _delete_template(gateway, info.template_id)
    assert not Template.exists("fp-served")
    assert set(uploads.iterdir()) <= uploaded_before  # no other template copies them
    assert f"e2b-{info.template_id}" not in _fp("image", "ls", "--json")
    with pytest.raises(SandboxException, match="404: template 'fp-served:v2' not found"):
        Sandbox.create("fp-served:v2")


def _delete_template(gateway: Gateway, template_id: str) -> None:
    answer = httpx.delete(
        f"{gateway.url}/templates/{template_id}", headers={"X-API-KEY": gateway.api_key}
    )
    assert answer.status_code == 204, answer.text


def test_a_failing_step_is_reported_with_its_line(gateway: Gateway) -> None:
    template = (
        Template()
        .from_image("ubuntu:22.04")
        .run_cmd("true")
        .run_cmd("exit 3")  # the failing step: its line is in the traceback
    )
    with pytest.raises(BuildException) as failed:
        Template.build(template, "fp-failing")
    assert "failed to run command 'exit 3': command failed: exit status 3" in str(failed.value)
    frames = traceback.extract_tb(failed.value.__traceback__)
    assert any(f.filename == __file__ and '.run_cmd("exit 3")' in (f.line or "") for f in frames)

    nobody = Template().from_image("ubuntu:22.04").run_cmd("whoami", user="nobody123")
    with pytest.raises(BuildException, match="invalid username: 'nobody123'"):
        Template.build(nobody, "fp-failing")
    with pytest.raises(BuildException, match="template this-template-does-not-exist not found"):
        Template.build(Template().from_template("this-template-does-not-exist"), "fp-failing")
    _delete_template(gateway, "fp-failing")
