"""Where the page's lineage hangs a session, and which sessions a checkpoint's grid shows:
one rule, in ``server.ui_shots`` (the page takes it from ``/ui/state``)."""

from dataclasses import replace

from forkpoint.models import Checkpoint, CheckpointKind, Network, Session, SessionState
from forkpoint.server.ui_shots import grid_sessions, origin

PARENT = Session(
    id="s-0000000001", name=None, image="default", state=SessionState.RUNNING,
    created_at="2026-01-01T00:00:00.000Z", parent_checkpoint="c-template", memory_mib=512,
    cpus=1, network=Network.USER,
)  # fmt: skip
TAKEN = Checkpoint(
    id="c-0000000001", session_id=PARENT.id, name=None, kind=CheckpointKind.USER,
    created_at=PARENT.created_at, parent_checkpoint="c-template", image="default", size_bytes=1,
    duration_ms=1.0, pause_ms=1.0,
)  # fmt: skip


def test_a_fork_hangs_under_its_checkpoint_even_after_rolling_back_to_its_own() -> None:
    fork = replace(PARENT, id="s-0000000002", parent_checkpoint=TAKEN.id)
    own = replace(TAKEN, id="c-0000000002", session_id=fork.id, parent_checkpoint=TAKEN.id)
    rolled_back = replace(fork, parent_checkpoint=own.id)
    stranger = replace(PARENT, id="s-0000000003", parent_checkpoint="c-template")
    checkpoints = {c.id: c for c in (TAKEN, own)}

    assert origin(fork, checkpoints) == TAKEN.id
    assert origin(rolled_back, checkpoints) == TAKEN.id
    assert origin(PARENT, checkpoints) == "c-template"  # not listed: the page makes it a root
    sessions = [PARENT, rolled_back, stranger]
    assert grid_sessions(TAKEN, sessions, [TAKEN, own]) == (PARENT.id, [PARENT, rolled_back])
    # The parent gone: its forks alone.
    assert grid_sessions(TAKEN, [rolled_back], [TAKEN, own]) == (None, [rolled_back])


def test_a_cycle_of_own_checkpoints_ends() -> None:
    session = replace(PARENT, parent_checkpoint="c-a")
    a = replace(TAKEN, id="c-a", parent_checkpoint="c-b")
    b = replace(TAKEN, id="c-b", parent_checkpoint="c-a")
    assert origin(session, {"c-a": a, "c-b": b}) in ("c-a", "c-b")
