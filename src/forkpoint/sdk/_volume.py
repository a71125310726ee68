"""The async SDK's volumes: :class:`AsyncVolume`, a directory on the host that outlives
sessions. Every method is one REST call (``api/table.py``'s volume operations)."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from forkpoint.models import Volume as VolumeInfo  # `Volume` is the sync twin
from forkpoint.models import VolumeEntry

from ._client import ApiClient

if TYPE_CHECKING:
    from forkpoint.runtime import Runtime

__all__ = ["AsyncVolume"]


class AsyncVolume:
    """A volume: its files outlive every session and are outside every checkpoint (a
    fork sees the same files; a rollback does not undo what was written to it)."""

    def __init__(self, client: ApiClient, info: VolumeInfo) -> None:
        self._client = client
        self._info = info
        self._closed = False
        client.retain()

    @classmethod
    async def create(
        cls, name: str, *, base_url: str | None = None, token: str | None = None,
        runtime: Runtime | None = None,
    ) -> AsyncVolume:  # fmt: skip
        """A new, empty volume. :raises Conflict: the name is taken."""
        async with ApiClient.held(base_url, token, runtime) as client:
            return cls(client, await client.call("create_volume", body={"name": name}))

    @classmethod
    async def get(
        cls, volume: str, *, base_url: str | None = None, token: str | None = None,
        runtime: Runtime | None = None,
    ) -> AsyncVolume:  # fmt: skip
        """An existing volume by id or name. :raises NotFound:"""
        async with ApiClient.held(base_url, token, runtime) as client:
            return cls(client, await client.call("get_volume", volume))

    @classmethod
    async def list_volumes(
        cls, *, base_url: str | None = None, token: str | None = None,
        runtime: Runtime | None = None,
    ) -> list[VolumeInfo]:  # fmt: skip
        """Every volume, with the space its files take."""
        async with ApiClient.held(base_url, token, runtime) as client:
            listed: list[VolumeInfo] = await client.call("list_volumes")
            return listed

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def name(self) -> str:
        return self._info.name

    @property
    def info(self) -> VolumeInfo:
        return self._info

    async def _call(self, name: str, **body: Any) -> Any:
        return await self._client.call(name, self.id, body=body)

    async def write(
        self, path: str, data: str | bytes, *, force: bool = False, mode: int | None = None,
        uid: int | None = None, gid: int | None = None,
    ) -> VolumeEntry:  # fmt: skip
        """Write file ``path`` (its directory must exist; ``force`` replaces a file)."""
        raw = data.encode() if isinstance(data, str) else data
        entry: VolumeEntry = await self._call(
            "write_volume_file", path=path, data=base64.b64encode(raw).decode(), force=force,
            mode=mode, uid=uid, gid=gid,
        )  # fmt: skip
        return entry

    async def read(self, path: str) -> bytes:
        """The bytes of file ``path``. :raises NotFound:"""
        file = await self._call("read_volume_file", path=path)
        return base64.b64decode(file.data)

    async def list_dir(self, path: str = "/", depth: int = 1) -> list[VolumeEntry]:
        """The entries below directory ``path``, ``depth`` levels deep."""
        entries: list[VolumeEntry] = await self._call("volume_entries", path=path, depth=depth)
        return entries

    async def stat(self, path: str) -> VolumeEntry:
        """What is at ``path``. :raises NotFound:"""
        entry: VolumeEntry = await self._call("volume_stat", path=path)
        return entry

    async def exists(self, path: str) -> bool:
        from forkpoint.errors import NotFound

        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def make_dir(
        self, path: str, *, force: bool = False, mode: int | None = None,
        uid: int | None = None, gid: int | None = None,
    ) -> VolumeEntry:  # fmt: skip
        """Make directory ``path``; ``force``: its parents too, existing is fine."""
        entry: VolumeEntry = await self._call(
            "volume_make_dir", path=path, force=force, mode=mode, uid=uid, gid=gid
        )
        return entry

    async def set_metadata(
        self, path: str, *, mode: int | None = None, uid: int | None = None,
        gid: int | None = None,
    ) -> VolumeEntry:  # fmt: skip
        """Change the mode and/or owner of ``path``."""
        entry: VolumeEntry = await self._call(
            "volume_set_metadata", path=path, mode=mode, uid=uid, gid=gid
        )
        return entry

    async def remove(self, path: str) -> None:
        """Remove file ``path``, or directory ``path`` with everything in it."""
        await self._call("volume_remove", path=path)

    async def destroy(self) -> None:
        """Remove the volume and every file in it."""
        await self._client.call("remove_volume", self.id)
        await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.release()

    async def __aenter__(self) -> AsyncVolume:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.id})>"
