"""``make e2b-suite``: E2B's own SDK test suite, unmodified, against a fresh gateway.

Starts ``forkpoint serve --e2b`` on free ports, exports what ``forkpoint e2b env``
prints, runs the suite's ``tests/sync`` and ``tests/async`` (from where it lies: it is
never copied into the project) with the given Python (a venv holding the ``e2b`` version
forkpoint pins), and compares the outcome with ``e2b_suite_expected.txt``: every test
listed there (each with its reason) must fail, every other one must pass. Prints the
counts per folder.

    python tests/e2b_suite.py SUITE_DIR SUITE_PYTHON [pytest args...]
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from e2b_gateway import free_port

EXPECTED = Path(__file__).with_name("e2b_suite_expected.txt")
FOLDERS = ("tests/sync", "tests/async")
_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def expected_failures() -> dict[str, str]:
    """Test id -> why it cannot pass here."""
    listed: dict[str, str] = {}
    for line in EXPECTED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            test, _, reason = line.partition(" # ")
            listed[test.strip()] = reason.strip()
    return listed


def outcomes(output: str) -> dict[str, str]:
    """Test id -> PASSED/FAILED/ERROR/SKIPPED, from pytest's ``-rA`` summary."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        match = _OUTCOME.match(line)
        if match:
            outcome, test = match.groups()
            if found.get(test) != "FAILED":  # a teardown error after a failure
                found[test] = outcome
    return found


def main(argv: list[str]) -> int:
    suite, python, *pytest_args = argv
    port, proxy_port = free_port(), free_port()
    forkpoint = [sys.executable, "-m", "forkpoint.cli.app"]
    gateway_log = tempfile.TemporaryFile()
    gateway = subprocess.Popen(
        [*forkpoint, "serve", "--e2b", "--port", str(port), "--proxy-port", str(proxy_port),
         "--template-builds"],
        stdout=subprocess.DEVNULL, stderr=gateway_log,
    )  # fmt: skip
    stop_mirror = _mirror(forkpoint)
    env_json = subprocess.run(
        [*forkpoint, "e2b", "env", "--json", "--port", str(port),
         "--proxy-port", str(proxy_port)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "E2B_DEBUG"} | json.loads(env_json)
    before: set[str] | None = None
    try:
        before = _template_ids(env)  # also: the gateway answers
        started = time.monotonic()
        run = subprocess.run(
            [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--timeout", "120",
             *pytest_args, *FOLDERS],
            cwd=suite, env=env, capture_output=True, text=True,
        )  # fmt: skip
        minutes = (time.monotonic() - started) / 60
    finally:
        if before is not None:
            _delete_templates(env, keep=before)
        gateway.terminate()
        gateway.wait(timeout=60)
        if stop_mirror:
            subprocess.run([*forkpoint, "image", "mirror", "stop"], check=False)
    results = outcomes(run.stdout)
    if not results:
        sys.stdout.write(run.stdout[-5000:] + run.stderr[-5000:])
        print("e2b-suite: pytest reported no outcomes")
        return 2
    listed = expected_failures()
    verdict = report(results, listed, minutes)
    if verdict:
        for test in unexpected_failures(results, listed):
            print(f"--- {test} ---\n{failure_section(run.stdout, test)[-3000:]}")
        gateway_log.seek(0)
        print("the gateway's log (its end):\n" + gateway_log.read().decode()[-4000:])
    return verdict


def _mirror(forkpoint: list[str]) -> bool:
    """The registry mirror with the stand-in the template tests start from (``ubuntu:22.04``;
    ``from_base_image()`` is forkpoint's ``base``); returns whether it was started here."""
    status = subprocess.run(
        [*forkpoint, "image", "mirror", "status", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    started = not json.loads(status.stdout)["running"]
    if started:
        port = str(free_port())
        subprocess.run([*forkpoint, "image", "mirror", "start", "--port", port], check=True)
    subprocess.run([*forkpoint, "image", "mirror", "standins", "ubuntu:22.04"], check=True)
    return started


def _client(env: dict[str, str]) -> httpx.Client:
    headers = {"X-API-KEY": env["E2B_API_KEY"]}
    return httpx.Client(base_url=env["E2B_API_URL"], headers=headers, timeout=120)


def _template_ids(env: dict[str, str]) -> set[str]:
    """The templates built from code the gateway has (waiting for it to answer)."""
    deadline = time.monotonic() + 60
    with _client(env) as client:
        while True:
            try:
                listed = client.get("/templates")
                listed.raise_for_status()
                return {t["templateID"] for t in listed.json()}
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _delete_templates(env: dict[str, str], keep: set[str]) -> None:
    """The templates the suite built (each a forkpoint image) go, the others stay: a run
    must not fill the disk, nor take what the home had."""
    try:
        with _client(env) as client:
            for template_id in _template_ids(env) - keep:
                client.delete(f"/templates/{template_id}").raise_for_status()
    except (httpx.HTTPError, ValueError) as error:
        print(f"e2b-suite: the templates it built were not all deleted: {error!r}")


def failures(results: dict[str, str]) -> set[str]:
    return {t for t, o in results.items() if o in ("FAILED", "ERROR")}


def unexpected_failures(results: dict[str, str], listed: dict[str, str]) -> list[str]:
    return sorted(failures(results) - set(listed))


def failure_section(output: str, test: str) -> str:
    """What pytest printed about ``test``'s failure (its ``____ name ____`` section)."""
    name = test.split("::")[-1]
    sections = re.split(r"^_{3,} (?:ERROR at \w+ of )?(\S+) _{3,}$", output, flags=re.M)
    found = [
        re.split(r"^={5,}", body, flags=re.M)[0]  # up to pytest's next summary rule
        for header, body in zip(sections[1::2], sections[2::2], strict=True)
        if header == name
    ]
    return "\n".join(found) or "(pytest printed no section for it)"


def report(results: dict[str, str], listed: dict[str, str], minutes: float) -> int:
    per_folder: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for test, outcome in results.items():
        per_folder[test.split("::")[0].rsplit("/", 1)[0]][outcome] += 1
    for folder, counts in sorted(per_folder.items()):
        print(f"{folder}: " + ", ".join(f"{n} {k.lower()}" for k, n in sorted(counts.items())))
    failed = failures(results)
    unexpected = unexpected_failures(results, listed)
    fixed = sorted(t for t in listed if results.get(t) == "PASSED")
    for test in unexpected:
        print(f"UNEXPECTED FAILURE {test}")
    for test in fixed:
        print(f"UNEXPECTED PASS {test} (remove it from {EXPECTED.name})")
    print(
        f"e2b-suite: {sum(o == 'PASSED' for o in results.values())} passed, {len(failed)} "
        f"failed ({len(failed & set(listed))} expected, listed with reasons in "
        f"{EXPECTED.name}) in {minutes:.1f} min"
    )
    return 1 if unexpected or fixed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
