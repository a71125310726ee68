"""Ending a session's processes and collecting the disk layers nothing uses any more.

Everything here blocks (process waits, /proc scans, SQLite, file deletion): async callers
run it in a thread.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence

from forkpoint import faults
from forkpoint.config import Home
from forkpoint.errors import Conflict, ForkpointError, NotFound
from forkpoint.models import Network
from forkpoint.runtime.housekeeping.orphans import sweep_orphans
from forkpoint.store import SessionRecord, Store, global_lock
from forkpoint.vm import VmFiles
from forkpoint.vm.disk import blank_overlay_of
from forkpoint.vm.net import passt_log, remove_passt_log
from forkpoint.vm.process import Dying, kill, pids_with_arg

__all__ = [
    "collect_layers",
    "destroy_session",
    "kill_session_processes",
    "remove_session_files",
]


def destroy_session(home: Home, store: Store, files: VmFiles, record: SessionRecord) -> None:
    """Kill the session's processes, drop its egress rules, forget it, delete its files
    and unused layers (the caller holds its lock)."""
    kill_session_processes(files, record)
    faults.point("rm.processes-killed")
    if record.network == Network.USER:
        from forkpoint.runtime.sessions.egress import (
            remove_filter,  # here: queries (upkeep) must not load nftables
        )

        remove_filter(record)
        faults.point("rm.egress-removed")
    with contextlib.suppress(NotFound):
        store.delete_session(record.id)
    faults.point("rm.row-deleted")
    remove_session_files(files)
    faults.point("rm.files-removed")
    collect_layers(home, store)


def kill_session_processes(
    files: VmFiles, record: SessionRecord, spare: str | None = None, *, wait_vm: bool = True
) -> Dying:
    """Kill the session's QEMU and passt: those recorded, and those never recorded (a
    forkpoint process killed while restoring the VM), found by their command lines; also
    its rollback standbys but ``spare`` (a standby's tag, see :mod:`.standby`). See
    :func:`kill_vm_processes` for ``wait_vm``."""
    return kill_vm_processes(files, record.qemu_pid, record.aux_pids, spare, wait_vm=wait_vm)


def kill_vm_processes(
    files: VmFiles,
    qemu_pid: int | None,
    aux_pids: Sequence[int] = (),
    spare: str | None = None,
    *,
    wait_vm: bool = True,
) -> Dying:
    """Kill a VM's QEMU and passt: ``qemu_pid``, ``aux_pids`` and any other process whose
    command line names the VM or one of its standbys but ``spare`` (see
    :func:`kill_session_processes`), all at once. Returns once all are gone, but with
    ``wait_vm=False`` the QEMU ``qemu_pid`` may still be exiting (killed: its guest never
    runs again; freeing its memory takes milliseconds): wait for the result then."""
    vm = kill([(qemu_pid, files.name)])
    helpers = kill((pid, files.name) for pid in aux_pids)  # exiting while the sweep looks
    ours = {files.name, str(passt_log(files))}
    standbys = f"{files.name}."  # VmFiles.standby: a QEMU that replaced it is named so
    kept = files.standby(spare).name if spare else None

    def named(arg: str) -> bool:
        return arg in ours or (arg.startswith(standbys) and arg != kept)

    recorded = {qemu_pid, *aux_pids}
    kill((pid, arg) for pid, arg in pids_with_arg(named) if pid not in recorded).wait()
    helpers.wait()
    if wait_vm:
        vm.wait()
    return vm


def remove_session_files(files: VmFiles) -> None:
    """Everything a session leaves on the host once its processes are gone: its
    directories, passt's log and its cgroup."""
    from forkpoint.runtime.sessions.limits import (
        remove_cgroup,  # here: queries load this module, never cgroups'
    )

    remove_cgroup(files.dir.name)
    shutil.rmtree(files.dir, ignore_errors=True)
    shutil.rmtree(files.sock_dir, ignore_errors=True)
    remove_passt_log(files)  # under /tmp, not in the session's directory (AppArmor)


def collect_layers(home: Home, store: Store) -> list[str]:
    """Delete the disk layers nothing depends on any more, and the files a killed
    forkpoint process left without a record (see :mod:`.orphans`); returns their names.

    Opportunistic: skipped while another process builds an image template (its base
    layer has no referrer until the template checkpoint exists).
    """
    removed: list[str] = []
    tried: set[str] = set()  # one that cannot be deleted must not loop forever
    try:
        with global_lock(home, "gc", timeout_s=0):
            while names := [n for n in store.unreferenced_layers() if n not in tried]:
                for name in names:
                    tried.add(name)
                    try:
                        store.delete_layer(name)
                    except ForkpointError:
                        continue
                    faults.point("gc.layer-row-deleted")
                    (home.layers / name).unlink(missing_ok=True)
                    blank_overlay_of(home.layers / name).unlink(missing_ok=True)
                    faults.point("gc.layer-file-deleted")
                    removed.append(name)
            removed += sweep_orphans(home, store)
    except Conflict:
        pass  # busy: the next gc collects
    return removed
