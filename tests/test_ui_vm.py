"""The web page in a real browser (Playwright + Debian's chromium) against ``forkpoint ui``:
log in with the one-time URL, checkpoint and fork by clicking, see the tree grow, open a
diff, roll back with the preview shown. ``FORKPOINT_UI_SCREENSHOT=PATH`` saves the page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkpoint.browser import find_chromium
from forkpoint.browser.screenshot import CHROMIUM_ARGS
from forkpoint.errors import ForkpointError

try:
    find_chromium()
except ForkpointError as error:  # pragma: no cover - depends on the machine
    pytest.skip(f"{error.message}", allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

FORKPOINT = str(Path(sys.executable).with_name("forkpoint"))


def cli(*args: str) -> object:
    argv = [FORKPOINT, args[0], "--json", *args[1:]]  # before a `--` command
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def login_url() -> Iterator[str]:
    with subprocess.Popen(
        [FORKPOINT, "ui", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as server:
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            assert "/ui/login?token=" in url
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)


def node(page: Page, node_id: str) -> object:
    return page.locator(f'button.node[data-id="{node_id}"]')


def test_page_checkpoint_fork_diff_and_rollback(login_url: str) -> None:
    session = cli("create")
    assert isinstance(session, dict)
    sid = session["id"]
    cli("exec", sid, "--", "sh", "-c", "echo hello > /root/hello.txt")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(find_chromium()), headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(120_000)
            # A second visit of the login URL is refused: it works once.
            page.goto(login_url)
            expect(page.locator("#sessions")).to_contain_text(sid)
            again = browser.new_page()
            again.goto(login_url)
            expect(again.locator("body")).to_contain_text("Not logged in")

            # Checkpoint by clicking: the session gets a checkpoint node.
            page.locator(f'button.node[data-id="{sid}"]').click()
            page.get_by_role("button", name="Checkpoint", exact=True).click()
            own = page.locator(
                f'li.session:has(> button.node[data-id="{sid}"]) > ul > li.checkpoint'
            )
            expect(own).to_have_count(1)
            checkpoint_id = own.locator("> button.node").get_attribute("data-id")
            assert checkpoint_id

            # Fork it twice: two sessions appear under the checkpoint.
            own.locator("> button.node").click()
            page.locator("#fork-count").fill("2")
            page.get_by_role("button", name="Fork", exact=True).click()
            forks = page.locator(
                f'li.checkpoint:has(> button.node[data-id="{checkpoint_id}"]) > ul > li.session'
            )
            expect(forks).to_have_count(2, timeout=120_000)
            # What happened, newest first.
            events = page.locator("#events")
            expect(events.locator("li").first).to_contain_text("forked")
            expect(events).to_contain_text(f"checkpointed {sid} ← {checkpoint_id}")

            # A change after the checkpoint shows in the session's diff.
            cli("exec", sid, "--", "sh", "-c", "rm /root/hello.txt")
            page.locator(f'button.node[data-id="{sid}"]').click()
            diff = page.get_by_label("diff against its parent")
            expect(diff).to_contain_text("- /root/hello.txt", timeout=180_000)

            # Rollback: the preview comes first, then the confirmation rolls back.
            page.get_by_role("button", name="Rollback…").click()
            preview = page.get_by_role("region", name="rollback preview")
            expect(preview).to_contain_text("would undo")
            expect(preview).to_contain_text("- /root/hello.txt", timeout=180_000)
            shot = os.environ.get("FORKPOINT_UI_SCREENSHOT")
            if shot:
                page.screenshot(path=shot, full_page=True)
            preview.get_by_role("button", name="Confirm rollback").click()
            expect(page.locator("#status")).to_contain_text("rollback: done", timeout=180_000)
        finally:
            browser.close()
    done = subprocess.run(
        [FORKPOINT, "exec", sid, "--", "cat", "/root/hello.txt"], capture_output=True, text=True
    )
    assert done.stdout == "hello\n"
    for fork in set(forks_of(checkpoint_id)) - {sid}:  # sid runs from it too, after the rollback
        subprocess.run([FORKPOINT, "rm", fork], check=True, capture_output=True)
    subprocess.run([FORKPOINT, "rm", sid], check=True, capture_output=True)
    subprocess.run([FORKPOINT, "checkpoint", "rm", checkpoint_id], check=True, capture_output=True)


def forks_of(checkpoint_id: str) -> list[str]:
    sessions = cli("ls")
    assert isinstance(sessions, list)
    return [s["id"] for s in sessions if s["parent_checkpoint"] == checkpoint_id]
