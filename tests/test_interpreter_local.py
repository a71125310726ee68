"""The code interpreter's server (guest/interpreter.py) run on the host, over real Jupyter
kernels from PyPI's ipykernel: its routes and NDJSON lines, as E2B's code-interpreter SDK
reads them. The SDK itself drives it inside a VM in test_e2b_vm."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import forkpoint.guest.interpreter as interpreter

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    home = tmp_path_factory.mktemp("interpreter")
    env = {**os.environ, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    log = home / "interpreter.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-P", interpreter.__file__, str(port)],
            env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the interpreter never listened"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def run(url: str, code: str, **fields: object) -> list[dict[str, object]]:
    response = httpx.post(f"{url}/execute", json={"code": code, **fields}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in response.text.splitlines()]


def test_results_streams_and_state_across_runs(server: str) -> None:
    run(server, "x = 41")
    lines = run(server, "import sys\nprint('out')\nprint('err', file=sys.stderr)\nx + 1")
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "number_of_executions"
    assert {"type": "stdout", "text": "out\n"}.items() <= next(
        line for line in lines if line["type"] == "stdout"
    ).items()
    assert next(line for line in lines if line["type"] == "stderr")["text"] == "err\n"
    result = next(line for line in lines if line["type"] == "result")
    assert result == {"type": "result", "is_main_result": True, "text": "42"}
    assert run(server, "'a string'")[-1]["text"] == "a string"  # E2B shows a str unquoted


def test_rich_outputs_and_errors(server: str) -> None:
    code = "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))"
    shown = [line for line in run(server, code) if line["type"] == "result"]
    assert shown[0]["html"] == "<b>hi</b>" and shown[0]["is_main_result"] is False
    error = run(server, "def f():\n    raise ValueError('bad value')\nf()")[-1]
    assert (error["type"], error["name"], error["value"]) == ("error", "ValueError", "bad value")
    assert "bad value" in str(error["traceback"]) and "f()" in str(error["traceback"])


def test_env_vars_last_one_run(server: str) -> None:
    code = "import os; os.environ.get('FP_TEST')"
    assert run(server, code, env_vars={"FP_TEST": "set"})[-1]["text"] == "set"
    assert not [line for line in run(server, code) if line["type"] == "result"]


def test_contexts_are_separate_kernels(server: str, tmp_path: Path) -> None:
    made = httpx.post(f"{server}/contexts", json={"cwd": str(tmp_path)}, timeout=60)
    context = made.json()
    assert context["language"] == "python" and context["cwd"] == str(tmp_path)
    assert context["id"] in [c["id"] for c in httpx.get(f"{server}/contexts").json()]
    run(server, "y = 1", context_id=context["id"])
    assert run(server, "import os; os.getcwd()", context_id=context["id"])[-1]["text"] == str(
        tmp_path
    )
    assert run(server, "'y' in globals()")[-1]["text"] == "False"  # not the default's
    restarted = httpx.post(f"{server}/contexts/{context['id']}/restart", timeout=60)
    assert restarted.status_code == 200
    assert run(server, "'y' in globals()", context_id=context["id"])[-1]["text"] == "False"
    assert httpx.delete(f"{server}/contexts/{context['id']}", timeout=60).status_code == 200
    gone = httpx.post(f"{server}/execute", json={"code": "1", "context_id": context["id"]})
    assert gone.status_code == 404 and context["id"] in gone.text


def test_bad_requests_get_one_line_answers(server: str) -> None:
    assert httpx.post(f"{server}/execute", content=b"{not json").status_code == 400
    wrong = httpx.post(f"{server}/execute", json={"code": "1", "language": "r"})
    assert wrong.status_code == 404 and "Python" in wrong.text
    assert httpx.post(f"{server}/execute", json={"code": 3}).status_code == 400
    assert httpx.get(f"{server}/nowhere").status_code == 404


def test_a_client_that_leaves_interrupts_its_code(server: str) -> None:
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{server}/execute", json={"code": "import time\n"
                      "print('started', flush=True)\ntime.sleep(60)"}) as response,
    ):  # fmt: skip
        next(response.iter_lines())  # it runs
    started = time.monotonic()
    assert run(server, "'free'")[-1]["text"] == "free"
    assert time.monotonic() - started < 20  # not after the 60 s sleep
