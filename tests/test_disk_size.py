"""``create --disk``: the guest's disk and root filesystem are that size, in forks and
after a rollback to the image's template too; a size below the image's makes nothing; the
regrow is forkpoint's own work, not a step of the session's history."""

from __future__ import annotations

import pytest

from cli_run import cli, cli_json, remove_sessions

pytestmark = pytest.mark.vm


def _root_fs_mib(session_id: str) -> int:
    df = cli_json("exec", session_id, "--", "df", "-m", "--output=size", "/")
    return int(df["stdout"].split()[-1])


def test_disk_size_reaches_the_guest_filesystem() -> None:
    before = cli_json("ls")
    refused = cli("create", "--disk", "1G", code=2)
    assert "smaller than image default's disk" in refused.stderr.decode()
    assert cli_json("ls") == before
    s = cli_json("create", "--disk", "3G", "--history")
    made = [s["id"]]
    try:
        assert s["disk_mib"] == 3072
        assert 2900 < _root_fs_mib(s["id"]) <= 3072
        checkpoint = cli_json("checkpoint", s["id"])
        (fork,) = cli_json("fork", checkpoint["id"])
        made.append(fork["id"])
        assert fork["disk_mib"] == 3072 and _root_fs_mib(fork["id"]) > 2900
        # The template it was created from has the image's 2 GiB: it grows again.
        cli("rollback", s["id"], s["parent_checkpoint"])
        assert _root_fs_mib(s["id"]) > 2900
        labels = [step["label"] for step in cli_json("history", s["id"])]
        assert labels and not [label for label in labels if "resize2fs" in label]
    finally:
        remove_sessions(*made)
