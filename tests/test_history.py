"""Diffs and histories without a VM: the guest's walk on a host directory, the comparison,
patches, the scan cache, the history rows, and the CLI's dispatch of ``diff``."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from forkpoint.config import Home
from forkpoint.errors import InvalidInput
from forkpoint.guest import scan as guest_scan
from forkpoint.models import to_json_data
from forkpoint.models.history import DEFAULT_DIFF_EXCLUDE
from forkpoint.protocol import (
    ListeningSocket,
    ProcessInfo,
    ScanArgs,
    ScanResult,
    from_wire,
    to_wire,
)
from forkpoint.runtime.inspection.diffs import (
    ScanCache,
    compare,
    exclusions,
    parse_scan,
    patch_candidates,
    unified_patch,
)
from forkpoint.store import Store
from forkpoint.store.history import HistoryStore, StepRecord


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _scan(root: Path, processes: list[ProcessInfo], listening: list[ListeningSocket]) -> ScanResult:
    import base64
    import zlib

    paths, numbers, count = guest_scan.walk([str(root)], [str(root / "skipped")])
    packed = zlib.compress(paths), zlib.compress(numbers)
    return ScanResult(
        paths=base64.b64encode(packed[0]).decode(), numbers=base64.b64encode(packed[1]).decode(),
        paths_bytes=len(packed[0]), numbers_bytes=len(packed[1]),
        count=count, processes=processes, listening=listening,
    )  # fmt: skip


def test_walk_and_compare_find_exactly_what_changed(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "dir").mkdir(parents=True)
    (root / "skipped").mkdir()
    (root / "skipped" / "inside").write_text("never listed")
    (root / "dir" / "same.txt").write_text("same\n")
    (root / "dir" / "edit.txt").write_text("one\n")
    (root / "gone.txt").write_text("bye\n")
    (root / "chmod.sh").write_text("#!/bin/sh\n")
    os.symlink("dir/same.txt", root / "link")
    server = ProcessInfo(pid=40, ppid=1, cmd="python3 -m http.server 8000")
    before = _scan(
        root, [ProcessInfo(1, 0, "init"), server], [ListeningSocket("0.0.0.0", 8000, 40)]
    )
    (root / "dir" / "edit.txt").write_text("one\ntwo\n")
    (root / "gone.txt").unlink()
    (root / "new").mkdir()
    (root / "new" / "file.bin").write_bytes(b"\0\1")
    (root / "chmod.sh").chmod(0o755)
    after = _scan(root, [ProcessInfo(1, 0, "init"), ProcessInfo(41, 1, "sleep 9")], [])

    excluded = exclusions(False)
    diff = compare(
        parse_scan(before, excluded), parse_scan(after, excluded),
        source="c-0000000001", target="s-0000000001", excluded=excluded, duration_ms=1.0,
    )  # fmt: skip
    got = {(Path(c.path).relative_to(root).as_posix(), c.change, c.type) for c in diff.files}
    assert got == {
        ("dir/edit.txt", "modified", "file"),
        ("gone.txt", "removed", "file"),
        ("new", "added", "dir"),
        ("new/file.bin", "added", "file"),
        ("chmod.sh", "modified", "file"),
    }
    chmod = next(c for c in diff.files if c.path.endswith("chmod.sh"))
    assert (chmod.old_mode, chmod.mode) == (f"{0o666 & ~_umask():04o}", "0755")
    edit = next(c for c in diff.files if c.path.endswith("edit.txt"))
    assert (edit.old_size, edit.size) == (4, 8)
    assert [(p.change, p.pid, p.command) for p in diff.processes] == [
        ("gone", 40, "python3 -m http.server 8000"),
        ("started", 41, "sleep 9"),
    ]
    assert [(p.change, p.port, p.pid, p.command) for p in diff.ports] == [
        ("closed", 8000, 40, "python3 -m http.server 8000")
    ]
    assert not any("skipped/" in c.path for c in diff.files)
    assert to_json_data(diff)["files"][0]["path"].startswith(str(root))
    assert {c.path for c in patch_candidates(diff)} >= {edit.path}


def test_scan_result_crosses_the_protocol_and_the_cache(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a").write_text("a")
    result = _scan(tmp_path / "t", [ProcessInfo(1, 0, "init")], [ListeningSocket("::", 22, 0)])
    assert from_wire(ScanResult, to_wire(result)) == result
    cache = ScanCache(tmp_path / "scans")
    assert cache.get("c-0000000001", ["/"], ("/proc",)) is None
    cache.put("c-0000000001", ["/"], ("/proc",), result)
    assert cache.get("c-0000000001", ["/"], ("/proc",)) == result
    assert cache.get("c-0000000001", ["/"], ()) is None  # another walk: not the same scan
    cache.forget("c-0000000001")
    assert cache.get("c-0000000001", ["/"], ("/proc",)) is None
    with pytest.raises(ValueError):
        ScanArgs(roots=["relative"])


def test_exclusions_and_patches() -> None:
    assert "/tmp" in exclusions(False) and "/tmp" not in exclusions(True)
    assert set(DEFAULT_DIFF_EXCLUDE) - {"/tmp"} <= set(exclusions(True, ("/var/cache/",)))
    assert "/var/cache" in exclusions(False, ("/var/cache/",))
    with pytest.raises(InvalidInput):
        exclusions(False, ("relative/path",))
    patch = unified_patch("/etc/x", b"a\nb\n", b"a\nc\n")
    assert patch is not None and "-b\n+c\n" in patch and patch.startswith("--- a/etc/x")
    assert unified_patch("/x", None, b"new") == (
        "--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+new\n\\ No newline at end of file\n"
    )
    assert unified_patch("/bin/x", b"\0ELF", b"\0ELF2") is None


def test_listening_address_decoding() -> None:
    assert guest_scan._address("0100007F") == "127.0.0.1"
    assert guest_scan._address("00000000000000000000000000000000") == "::"
    assert guest_scan._address("0000000000000000FFFF00000100007F") == "::ffff:127.0.0.1"


def test_history_rows_follow_their_checkpoint(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    with Store.open(home) as store:
        history = HistoryStore(store)
        assert history.keep("s-0000000001") is None
        with pytest.raises(sqlite3.IntegrityError):
            history.add(StepRecord("c-0000000009", "s-0000000001", "true", automatic=True))
        assert history.steps("s-0000000001") == {}


def test_cli_diff_of_two_images_is_still_a_pixel_diff(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from forkpoint.cli.app import _register_all, app

    pytest.importorskip("PIL")
    from PIL import Image

    a, b = tmp_path / "a.png", tmp_path / "b.png"
    Image.new("RGB", (4, 4), "white").save(a)
    Image.new("RGB", (4, 4), "black").save(b)
    _register_all()
    result = CliRunner().invoke(app, ["diff", str(a), str(b), "--json"])
    assert result.exit_code == 0, result.output
    assert '"differing_pixels": 16' in result.output


def test_rest_routes_validate_and_report_errors(tmp_path: Path) -> None:
    import asyncio

    import httpx

    from forkpoint.runtime import Runtime
    from forkpoint.server import create_app

    async def scenario() -> None:
        rt = Runtime.open(Home(tmp_path / "home"))
        try:
            transport = httpx.ASGITransport(app=create_app(rt))
            async with httpx.AsyncClient(transport=transport, base_url="http://fp") as api:
                missing = await api.post("/v1/diff", json={"a": "nope"})
                assert missing.status_code == 404
                assert missing.json()["error"]["code"] == "not_found"
                history = await api.get("/v1/sessions/s-0000000000/history")
                assert history.status_code == 404
                undo = await api.post("/v1/sessions/s-0000000000/undo", json={"steps": 0})
                assert undo.status_code == 422
                preview = await api.post("/v1/sessions/s-0000000000/rollback/preview", json={})
                assert preview.status_code == 404
                spec = (await api.get("/v1/openapi.json")).json()
                assert {"StateDiff", "HistoryStep", "FileChange"} <= set(
                    spec["components"]["schemas"]
                )
                assert (
                    "history" in spec["components"]["schemas"]["CreateSessionRequest"]["properties"]
                )
        finally:
            rt.close()

    asyncio.run(scenario())


def test_cli_errors_are_one_line_with_their_exit_codes(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "FORKPOINT_HOME": str(tmp_path / "home")}
    exe = str(Path(sys.executable).with_name("forkpoint"))
    for args, code in (
        (["history", "nope"], 3),
        (["undo", "nope"], 3),
        (["diff", "nope"], 3),
        (["rollback", "nope", "--dry-run"], 3),
        (["undo", "nope", "--steps", "0"], 2),
    ):
        done = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == code, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_page_login_works_once_and_guards_writes(tmp_path: Path) -> None:
    import asyncio

    import httpx

    from forkpoint.runtime import Runtime
    from forkpoint.server import create_app

    async def scenario() -> None:
        rt = Runtime.open(Home(tmp_path / "home"))
        try:
            app = create_app(rt, token="api-token", login_token="once")
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://fp") as browser:
                assert (await browser.get("/ui")).status_code == 401
                assert (
                    await browser.get("/ui/login", params={"token": "wrong"})
                ).status_code == 401
                login = await browser.get("/ui/login", params={"token": "once"})
                assert login.status_code == 303 and login.headers["location"] == "/ui"
                assert "HttpOnly" in login.headers["set-cookie"]
                page = await browser.get("/ui")
                assert page.status_code == 200 and '<h2 id="tree-h">Lineage</h2>' in page.text
                state = (await browser.get("/ui/state")).json()
                host = state.pop("host")
                assert state == {"sessions": [], "checkpoints": [], "steps": {}, "events": []}
                assert host["sessions_running"] == 0 and host["memory_total_mib"] > 0
                # A write with the cookie needs the page's header (no cross-site forms).
                assert (await browser.post("/v1/diff", json={"a": "x"})).status_code == 403
                headers = {"X-Forkpoint-UI": "1"}
                found = await browser.post("/v1/diff", json={"a": "x"}, headers=headers)
                assert found.status_code == 404
            async with httpx.AsyncClient(transport=transport, base_url="http://fp") as other:
                again = await other.get("/ui/login", params={"token": "once"})
                assert again.status_code == 401  # used up
                assert (await other.get("/v1/sessions")).status_code == 401
                bearer = {"Authorization": "Bearer api-token"}
                assert (await other.get("/v1/sessions", headers=bearer)).status_code == 200
        finally:
            rt.close()

    asyncio.run(scenario())
