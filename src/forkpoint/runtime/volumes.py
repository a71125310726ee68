"""Volumes: directories on the host that outlive sessions (``Home.volumes/<id>``), created,
listed and removed by name, their files read and written through the confined operations
of :mod:`forkpoint.volume_fs`.

A volume is outside every checkpoint: a fork sees the same files, a rollback does not undo
what was written to it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import shutil
from pathlib import Path

from forkpoint import volume_fs
from forkpoint.errors import InvalidInput
from forkpoint.models import (
    MAX_VOLUME_FILE_BYTES,
    VOLUME_UID,
    Volume,
    VolumeEntry,
    VolumeFile,
)
from forkpoint.runtime.context import RuntimeContext
from forkpoint.store.models import validate_name
from forkpoint.store.volumes import VolumesStore

__all__ = ["Volumes"]


def _size(root: Path) -> int:
    """What the files under ``root`` take on disk (bytes)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # removed while we walked
    return total


#: Who owns what forkpoint writes into volumes, unless asked otherwise: the volumes' user
#: (as root; a user's own forkpoint writes as that user).
_OWNER = VOLUME_UID if os.geteuid() == 0 else None


def _owned(uid: int | None, gid: int | None) -> tuple[int | None, int | None]:
    return (_OWNER if uid is None else uid), (_OWNER if gid is None else gid)


class Volumes:
    """The volumes of one home."""

    def __init__(self, context: RuntimeContext) -> None:
        self.rows = VolumesStore(context.store)
        self.root = context.home.volumes

    def files(self, volume: Volume) -> Path:
        """The directory holding ``volume``'s files."""
        return self.root / volume.id

    async def create_volume(self, name: str) -> Volume:
        validate_name(name, "volume")
        volume = await asyncio.to_thread(self.rows.add, name)
        await asyncio.to_thread(self._make_root, self.files(volume))
        return volume

    @staticmethod
    def _make_root(root: Path) -> None:
        root.mkdir(0o755, parents=True, exist_ok=True)
        if _OWNER is not None:  # the guests' server writes as the volumes' own user
            os.chown(root, _OWNER, _OWNER)

    def records(self) -> list[Volume]:
        """Every volume, without walking its files (``size_bytes`` 0)."""
        return self.rows.all()

    def record(self, ref: str) -> Volume:
        """The volume ``ref`` (id or name), without walking its files."""
        return self.rows.get(ref)

    def list_volumes(self) -> list[Volume]:
        return [self._sized(v) for v in self.rows.all()]

    def get_volume(self, ref: str) -> Volume:
        return self._sized(self.rows.get(ref))

    async def remove_volume(self, ref: str) -> None:
        volume = await asyncio.to_thread(self.rows.get, ref)
        await asyncio.to_thread(self.rows.remove, volume.id)
        await asyncio.to_thread(shutil.rmtree, self.files(volume), True)

    def _sized(self, volume: Volume) -> Volume:
        return dataclasses.replace(volume, size_bytes=_size(self.files(volume)))

    # -- content -------------------------------------------------------------------------

    def _root(self, ref: str) -> Path:
        return self.files(self.rows.get(ref))

    async def volume_stat(self, ref: str, path: str) -> VolumeEntry:
        return await asyncio.to_thread(lambda: volume_fs.stat_path(self._root(ref), path))

    async def volume_list(self, ref: str, path: str, depth: int = 1) -> list[VolumeEntry]:
        return await asyncio.to_thread(lambda: volume_fs.list_dir(self._root(ref), path, depth))

    async def volume_read(self, ref: str, path: str) -> bytes:
        return await asyncio.to_thread(
            lambda: volume_fs.read_file(self._root(ref), path, MAX_VOLUME_FILE_BYTES)
        )

    async def volume_read_file(self, ref: str, path: str) -> VolumeFile:
        """A file's content as base64 with its entry (the JSON doors' read)."""
        data = await self.volume_read(ref, path)
        entry = await self.volume_stat(ref, path)
        return VolumeFile(entry=entry, data=base64.b64encode(data).decode())

    async def volume_write(
        self, ref: str, path: str, data: bytes, *, force: bool = False,
        mode: int | None = None, uid: int | None = None, gid: int | None = None,
    ) -> VolumeEntry:  # fmt: skip
        if len(data) > MAX_VOLUME_FILE_BYTES:
            raise InvalidInput(f"a volume file is at most {MAX_VOLUME_FILE_BYTES} bytes")
        uid, gid = _owned(uid, gid)
        return await asyncio.to_thread(
            lambda: volume_fs.write_file(
                self._root(ref), path, data, force=force, mode=mode, uid=uid, gid=gid
            )
        )

    async def volume_make_dir(
        self, ref: str, path: str, *, force: bool = False, mode: int | None = None,
        uid: int | None = None, gid: int | None = None,
    ) -> VolumeEntry:  # fmt: skip
        uid, gid = _owned(uid, gid)
        return await asyncio.to_thread(
            lambda: volume_fs.make_dir(
                self._root(ref), path, force=force, mode=mode, uid=uid, gid=gid
            )
        )

    async def volume_set_metadata(
        self, ref: str, path: str, *, mode: int | None = None, uid: int | None = None,
        gid: int | None = None,
    ) -> VolumeEntry:  # fmt: skip
        return await asyncio.to_thread(
            lambda: volume_fs.set_metadata(self._root(ref), path, mode=mode, uid=uid, gid=gid)
        )

    async def volume_remove(self, ref: str, path: str) -> None:
        await asyncio.to_thread(lambda: volume_fs.remove(self._root(ref), path))
