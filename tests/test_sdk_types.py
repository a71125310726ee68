"""The blocking SDK's types: its stub is current, and mypy sees precise types through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from forkpoint.sdk import _stubgen

TESTS = Path(__file__).parent


def test_sync_stub_is_generated_from_the_current_async_core() -> None:
    stub = Path(_stubgen.__file__).with_name("_sync.pyi")
    assert stub.read_text() == _stubgen.render(), (
        "src/forkpoint/sdk/_sync.pyi is stale: run `python -m forkpoint.sdk._stubgen`"
    )


@pytest.mark.timeout(300)
def test_mypy_sees_the_sdk_types() -> None:
    """``tests/typing/sdk_surface.py`` passes mypy --strict: assert_type holds, and each
    misuse marked ``type: ignore`` really is an error (an unneeded ignore fails)."""
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(TESTS / "typing" / "sdk_surface.py")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
