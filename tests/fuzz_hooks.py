"""schemathesis hooks for ``test_api_fuzz.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

``use_after_free`` knows a resource by its URL path, but a guest file is named by the
``?path=`` query: removing ``/a`` and then reading ``/b`` of the same session looks to it
like a use after free. The failure is dropped only when the two paths differ; a file read
with 200 after that very file was removed still fails the run.
"""

from __future__ import annotations

from typing import Any

import schemathesis

_removed: dict[str, str] = {}  # case id of a DELETE .../files -> the path it removed


def _guest_path(case: Any) -> str | None:
    query = case.query or {}
    path = query.get("path")
    return path if isinstance(path, str) else None


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    if case.method.upper() == "DELETE" and case.path.endswith("/files"):
        path = _guest_path(case)
        if path is not None:
            _removed[case.id] = path


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    if getattr(failure, "code", None) != "ST301" or not str(failure.free).endswith("/files"):
        return True
    removed = _removed.get(str(failure.deleted_case_id))
    return removed is None or removed == _guest_path(case)
