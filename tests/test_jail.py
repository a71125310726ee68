"""The jail: every VM's QEMU and passt run as the session's own unprivileged uid, with no
capabilities, no way to gain any, and (QEMU) an empty root — and checkpoint, fork and
rollback still work through the descriptors forkpoint hands over."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from forkpoint.models import Session
from forkpoint.runtime import Runtime
from forkpoint.vm.jail import jails_processes

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(not jails_processes(), reason="only root can start a VM as another uid"),
]


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _open_files(pid: int) -> list[str]:
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found.append(os.readlink(fd))
        except OSError:
            continue  # closed meanwhile
    return found


def _assert_jailed(pid: int, uid: int) -> None:
    status = _status(pid)
    assert status["Uid"].split() == [str(uid)] * 4, status["Uid"]
    assert status["Gid"].split() == [str(uid)] * 4, status["Gid"]
    assert status["CapEff"] == status["CapPrm"] == "0000000000000000"
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"


@pytest.mark.smoke
def test_each_vm_runs_unprivileged_as_its_own_uid_and_sees_an_empty_root() -> None:
    async def scenario() -> None:
        rt = Runtime.open()
        first = await rt.create(ports=[8000])
        second = await rt.create()
        try:
            records = [rt.store.get_session(s.id) for s in (first, second)]
            uids = [r.uid for r in records]
            assert len(set(uids)) == 2
            assert all(u is not None and u in rt.store.uids for u in uids)
            for record in records:
                assert record.uid is not None and record.qemu_pid is not None
                _assert_jailed(record.qemu_pid, record.uid)
                root = Path(f"/proc/{record.qemu_pid}/root")
                assert os.readlink(root) == str(rt.files(record.id).empty_root)
                assert list(root.iterdir()) == []  # nothing of the host to open by path
                for passt in record.aux_pids:
                    _assert_jailed(passt, record.uid)
            # What QEMU holds open is its own: not the store, the token, or other sessions.
            mine = _open_files(records[0].qemu_pid or 0)
            assert not any(f in (str(rt.home.db), str(rt.home.token)) for f in mine), mine
            assert not any(records[1].id in f for f in mine), mine

            # Checkpoint, fork and rollback work through fd sets; the new VMs are jailed too.
            await rt.exec(first.id, ["sh", "-c", "echo kept > /root/mark; sync"])
            checkpoint = await rt.checkpoint(first.id)
            await rt.exec(first.id, ["sh", "-c", "echo changed > /root/mark; sync"])
            (fork,) = await rt.fork(checkpoint.id, 1)
            assert isinstance(fork, Session), fork
            try:
                forked = rt.store.get_session(fork.id)
                assert forked.uid not in uids
                _assert_jailed(forked.qemu_pid or 0, forked.uid or 0)
                assert (await rt.exec(fork.id, ["cat", "/root/mark"])).stdout == "kept\n"
            finally:
                await rt.remove(fork.id)
            await rt.rollback(first.id, checkpoint.id)
            rolled = rt.store.get_session(first.id)
            assert rolled.uid == records[0].uid  # same session, same uid
            _assert_jailed(rolled.qemu_pid or 0, rolled.uid or 0)
            assert (await rt.exec(first.id, ["cat", "/root/mark"])).stdout == "kept\n"
            await rt.checkpoint(first.id)  # a restored VM writes new layers too
        finally:
            for session in (first, second):
                await rt.remove(session.id)
            rt.close()

    asyncio.run(scenario())
