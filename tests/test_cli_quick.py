"""The CLI's quick path: which forms it takes, and that it loads no CLI framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forkpoint.cli.quick import recognise


@pytest.mark.parametrize(
    ("argv", "as_json"),
    [
        (["ls", "--json"], True),
        (["show", "s-1", "--json"], True),
        (["show", "--json", "s-1"], True),
        (["exec", "s-1", "--", "echo", "-n", "hi"], False),
        (["exec", "s-1", "--json", "--cwd", "/tmp", "-e", "A=1", "--env=B=2", "--", "env"], True),
        (["exec", "s-1", "-b", "--timeout", "5", "sleep", "9"], False),
        (["exec", "s-1", "uname"], False),
    ],
)
def test_plain_forms_take_the_quick_path(argv: list[str], as_json: bool) -> None:
    recognised = recognise(argv)
    assert recognised is not None and recognised[1] is as_json


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["ls"],  # the human-readable table is typer + rich
        ["ls", "--help"],
        ["show", "s-1"],
        ["exec", "--help"],
        ["exec", "s-1"],  # no command: typer reports the usage error
        ["exec", "s-1", "--unknown", "--", "true"],
        ["exec", "s-1", "echo", "-n"],  # without `--`, typer would parse -n as an option
        ["exec", "s-1", "--timeout", "soon", "--", "true"],
        ["create", "--json"],
    ],
)
def test_everything_else_goes_to_typer(argv: list[str]) -> None:
    assert recognise(argv) is None


def test_ls_and_show_load_no_cli_framework_nor_asyncio(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from forkpoint.cli.quick import run_quick\n"
        "code = run_quick(sys.argv[1:])\n"
        "heavy = {'typer', 'click', 'rich', 'pydantic', 'asyncio', 'qemu'}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "print(code, loaded, file=sys.stderr)\n"
    )
    env = {**os.environ, "FORKPOINT_HOME": str(tmp_path)}
    for argv in (["ls", "--json"], ["show", "nope", "--json"]):
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env
        )
        report = done.stderr.strip().splitlines()[-1]
        if argv[0] == "ls":
            assert json.loads(done.stdout) == [] and report == "0 []", report
        else:  # an error is reported by the rich path: only then is rich loaded
            assert json.loads(done.stdout)["error"]["code"] == "not_found"
            assert report.startswith("3 ") and "asyncio" not in report, report
