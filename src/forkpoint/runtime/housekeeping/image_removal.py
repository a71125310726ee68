"""``image rm``: delete an image's builds, and their templates, once nothing needs them."""

from __future__ import annotations

from forkpoint.config import Home
from forkpoint.errors import InUse
from forkpoint.images.catalog import images_named, remove_images
from forkpoint.models import CheckpointKind
from forkpoint.runtime.checkpoints.writer import Checkpointer
from forkpoint.store import Store, global_lock

__all__ = ["remove_image"]

_LOCK_TIMEOUT_S = 60.0


def _listed(what: str, ids: list[str]) -> str:
    """``session s-1: remove it first``, ``sessions s-1, s-2: remove them first``."""
    shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    many = len(ids) > 1
    return f"{what}{'s' if many else ''} {shown}: remove {'them' if many else 'it'} first"


def remove_image(home: Home, store: Store, checkpoints: Checkpointer, name: str) -> list[str]:
    """Delete every build of image ``name`` and its template checkpoints (blocking).
    Returns the hashes removed; the caller collects the layers they leave behind.

    :raises NotFound: no image of that name.
    :raises InUse: a session or a (non-template) checkpoint was made from one of its
        builds; nothing is deleted.
    """
    builds = images_named(name, home.images)
    hashes = {image.hash for image in builds}
    # Taken by template boots too: no template of it can appear while we delete.
    with global_lock(home, "gc", _LOCK_TIMEOUT_S):
        sessions = [s.id for s in store.list_sessions() if s.image_hash in hashes]
        if sessions:
            raise InUse(f"image {name} is in use by {_listed('session', sessions)}")
        saved = [
            c.id
            for c in store.list_checkpoints()
            if c.image_hash in hashes and c.kind != CheckpointKind.TEMPLATE
        ]
        if saved:
            raise InUse(f"image {name} is needed by {_listed('checkpoint', saved)}")
        for template in store.list_templates():
            if template.image_hash in hashes:
                checkpoints.delete(template.checkpoint_id)
        remove_images(name, builds, home.images)
    return sorted(hashes)
