"""Templates built from code through the E2B gateway (schema v15, see
:func:`~.e2b_schema.migrate_e2b_templates`): names, builds and the tags that name builds."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass

from forkpoint.errors import NotFound

from .db import Store

__all__ = ["E2bTemplatesStore", "TemplateBuildRecord", "TemplateTagRecord"]

DEFAULT_TAG = "default"


@dataclass(frozen=True)
class TemplateBuildRecord:
    build_id: str
    template_id: str
    name: str
    status: str
    tags: list[str]
    cpus: int
    memory_mib: int
    image_hash: str | None
    oci_id: str | None
    reason: str | None
    step: str | None
    created_at: float


@dataclass(frozen=True)
class TemplateTagRecord:
    tag: str
    build_id: str
    created_at: float


_BUILD = (
    "SELECT b.*, t.name FROM e2b_template_builds b "
    "JOIN e2b_templates t ON t.template_id = b.template_id"
)


def _build(row: sqlite3.Row) -> TemplateBuildRecord:
    return TemplateBuildRecord(
        build_id=row["build_id"], template_id=row["template_id"], name=row["name"],
        status=row["status"], tags=json.loads(row["tags"]), cpus=row["cpus"],
        memory_mib=row["memory_mib"], image_hash=row["image_hash"],
        oci_id=row["oci_id"], reason=row["reason"], step=row["step"],
        created_at=row["created_at"],
    )  # fmt: skip


class E2bTemplatesStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    def request(
        self, name: str, tags: list[str], cpus: int, memory_mib: int
    ) -> TemplateBuildRecord:
        """A new build (``waiting``) of template ``name``, made if it is new."""
        now = time.time()
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT template_id FROM e2b_templates WHERE name = ?", (name,)
            ).fetchone()
            template_id = row["template_id"] if row else f"tpl_{uuid.uuid4().hex[:20]}"
            if row is None:
                conn.execute(
                    "INSERT INTO e2b_templates (template_id, name, created_at) VALUES (?, ?, ?)",
                    (template_id, name, now),
                )
            build_id = str(uuid.uuid4())
            conn.execute(
                "INSERT INTO e2b_template_builds (build_id, template_id, status, tags, cpus, "
                "memory_mib, created_at) VALUES (?, ?, 'waiting', ?, ?, ?, ?)",
                (build_id, template_id, json.dumps(tags or [DEFAULT_TAG]), cpus, memory_mib, now),
            )
        return self.build(template_id, build_id)

    def build(self, template_id: str, build_id: str) -> TemplateBuildRecord:
        """:raises NotFound: no such build of that template (id or name)."""
        with self.store.transaction() as conn:
            row = conn.execute(
                f"{_BUILD} WHERE b.build_id = ? AND (t.template_id = ? OR t.name = ?)",
                (build_id, template_id, template_id),
            ).fetchone()
        if row is None:
            raise NotFound(f"build {build_id} of template {template_id} not found")
        return _build(row)

    def set_status(
        self,
        build_id: str,
        status: str,
        *,
        reason: str | None = None,
        step: str | None = None,
        image_hash: str | None = None,
        oci_id: str | None = None,
    ) -> None:
        """A build's new status; a ``ready`` one takes its tags."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE e2b_template_builds SET status = ?, reason = ?, step = ?, "
                "image_hash = COALESCE(?, image_hash), oci_id = COALESCE(?, oci_id) "
                "WHERE build_id = ?",
                (status, reason, step, image_hash, oci_id, build_id),
            )
            if status == "ready":
                row = conn.execute(
                    "SELECT template_id, tags FROM e2b_template_builds WHERE build_id = ?",
                    (build_id,),
                ).fetchone()
                self._tag(conn, row["template_id"], build_id, json.loads(row["tags"]))

    def start(self, build_id: str, files: list[str]) -> None:
        """A build starts (``building``), copying the uploads ``files``."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE e2b_template_builds SET status = 'building', files = ? WHERE build_id = ?",
                (json.dumps(sorted(set(files))), build_id),
            )

    def fail_unfinished(self, reason: str) -> None:
        """Builds a stopped gateway left running end in ``error``."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE e2b_template_builds SET status = 'error', reason = ? "
                "WHERE status IN ('waiting', 'building')",
                (reason,),
            )

    @staticmethod
    def _tag(conn: sqlite3.Connection, template_id: str, build_id: str, tags: list[str]) -> None:
        now = time.time()
        for tag in tags:
            conn.execute(
                "INSERT INTO e2b_template_tags (template_id, tag, build_id, created_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (template_id, tag) DO UPDATE SET "
                "build_id = excluded.build_id, created_at = excluded.created_at",
                (template_id, tag, build_id, now),
            )

    def latest_builds(self) -> list[TemplateBuildRecord]:
        """Each template's newest build, oldest template first."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"{_BUILD} WHERE b.created_at = (SELECT MAX(created_at) FROM "
                "e2b_template_builds WHERE template_id = b.template_id) ORDER BY t.created_at"
            ).fetchall()
        return [_build(r) for r in rows]

    def template_id(self, name_or_id: str) -> str | None:
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT template_id FROM e2b_templates WHERE name = ? OR template_id = ?",
                (name_or_id, name_or_id),
            ).fetchone()
        return row["template_id"] if row else None

    def resolve(self, reference: str) -> TemplateBuildRecord | None:
        """The ready build ``name[:tag]`` (or a template id) names: the tag's, else
        ``default``'s, else the newest ready one."""
        name, _, tag = reference.partition(":")
        template_id = self.template_id(name)
        if template_id is None:
            return None
        with self.store.transaction() as conn:
            row = conn.execute(
                f"{_BUILD} JOIN e2b_template_tags g ON g.build_id = b.build_id "
                "WHERE g.template_id = ? AND g.tag = ?",
                (template_id, tag or DEFAULT_TAG),
            ).fetchone()
            if row is None and not tag:
                row = conn.execute(
                    f"{_BUILD} WHERE b.template_id = ? AND b.status = 'ready' "
                    "ORDER BY b.created_at DESC LIMIT 1",
                    (template_id,),
                ).fetchone()
        return _build(row) if row else None

    def assign_tags(self, target: str, tags: list[str]) -> TemplateBuildRecord:
        """:raises NotFound: ``target`` names no ready build."""
        build = self.resolve(target)
        if build is None:
            raise NotFound(f"template {target} not found")
        with self.store.transaction() as conn:
            self._tag(conn, build.template_id, build.build_id, tags)
        return build

    def remove_tags(self, name: str, tags: list[str]) -> None:
        """:raises NotFound: no template ``name``."""
        template_id = self.template_id(name)
        if template_id is None:
            raise NotFound(f"template {name} not found")
        with self.store.transaction() as conn:
            conn.executemany(
                "DELETE FROM e2b_template_tags WHERE template_id = ? AND tag = ?",
                [(template_id, tag) for tag in tags],
            )

    def tags(self, name_or_id: str) -> list[TemplateTagRecord]:
        """:raises NotFound: no such template."""
        template_id = self.template_id(name_or_id)
        if template_id is None:
            raise NotFound(f"template {name_or_id} not found")
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT tag, build_id, created_at FROM e2b_template_tags "
                "WHERE template_id = ? ORDER BY created_at, tag",
                (template_id,),
            ).fetchall()
        return [TemplateTagRecord(r["tag"], r["build_id"], r["created_at"]) for r in rows]

    def delete(self, name_or_id: str) -> tuple[str, set[str]]:
        """Forget a template and its builds; returns its id and the uploads no remaining
        build copies.

        :raises NotFound: no such template."""
        template_id = self.template_id(name_or_id)
        if template_id is None:
            raise NotFound(f"template {name_or_id} not found")
        with self.store.transaction() as conn:
            rows = conn.execute("SELECT template_id, files FROM e2b_template_builds").fetchall()
            conn.execute("DELETE FROM e2b_templates WHERE template_id = ?", (template_id,))
        mine = {f for r in rows if r["template_id"] == template_id for f in json.loads(r["files"])}
        kept = {f for r in rows if r["template_id"] != template_id for f in json.loads(r["files"])}
        return template_id, mine - kept
