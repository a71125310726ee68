"""schemathesis hooks for ``test_api_fuzz.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

Every other generated create keeps a short history (``history``, ``history_keep``: 2
checkpoints) unless the fuzzer chose itself: a link can carry an id, not a body field, so
this is how ``history`` and ``undo`` meet sessions that have steps.

Four failures that are the fuzzer's model, not the API, are dropped — each as narrowly as
the hooks can see (pushes are pointed at the test's S3 server, see ``map_body``, and the
sessions' events' waits are cut short, see ``map_query``):

A session created (or given) a ``timeout_s`` is removed when it expires, as asked; a 404
for it afterwards is not ``ensure_resource_availability``'s "created resource not found".

A watcher made on a random path answers 404 for the missing directory, which the
stateful check reads as the session it was linked from having vanished (ST302).

A watcher's events and the sessions' events are long polls: asked to ``wait`` up to N s
for a change, one answers after N s when nothing changed. Past the fuzzer's response-time
limit but within its own ``wait`` (plus a second), that is the answer asked for, not a
slow one.

``use_after_free`` knows a resource by its URL path, but a guest file is named by the
``?path=`` query: removing ``/a`` and then reading ``/b`` of the same session looks to it
like a use after free. The failure is dropped only when the two paths differ; a file read
with 200 after that very file was removed still fails the run.
"""

from __future__ import annotations

import os
import re
from itertools import count
from typing import Any

import schemathesis

from forkpoint.requests import PushRequest

_removed: dict[str, str] = {}  # case id of a DELETE .../files -> the path it removed
_expiring: set[str] = set()  # sessions made or set to expire
_creates = count()


def _guest_path(case: Any) -> str | None:
    query = case.query or {}
    path = query.get("path")
    return path if isinstance(path, str) else None


def _expires(case: Any, response: Any) -> str | None:
    """The session a successful create or set_timeout with a ``timeout_s`` made expire."""
    body = case.body if isinstance(case.body, dict) else {}
    if body.get("timeout_s") is None or not 200 <= response.status_code < 300:
        return None
    if case.path.endswith("/timeout"):
        return str((case.path_parameters or {}).get("session_id"))
    if case.method.upper() == "POST" and case.path == "/v1/sessions":
        answer = response.json()
        return str(answer.get("id")) if isinstance(answer, dict) else None
    return None


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    if case.method.upper() == "DELETE" and case.path.endswith("/files"):
        path = _guest_path(case)
        if path is not None:
            _removed[case.id] = path
    session = _expires(case, response)
    if session is not None:
        _expiring.add(session)


def _long_poll_wait(case: Any) -> float | None:
    """The ``wait`` a long poll asked for: a watcher's events (in the body) or the
    sessions' events (in the query string); None for anything else."""
    if str(case.path).endswith("/watchers/{watcher_id}/events"):
        wait = case.body.get("wait") if isinstance(case.body, dict) else None
    elif str(case.path).endswith("/events"):  # GET /v1/events
        wait = (case.query or {}).get("wait")
    else:
        return None
    try:
        return float(wait) if wait is not None and not isinstance(wait, bool) else None
    except (TypeError, ValueError):
        return None


@schemathesis.hook
def map_query(context: Any, query: Any) -> Any:
    """Valid waits of the sessions' events are cut to at most 1 s: with nothing happening,
    a long poll answers after its ``wait``, and fuzzed waits of up to 60 s spent the run's
    time budget before it reached the other operations. Invalid ones stay, for the checks."""
    operation = getattr(context, "operation", None)
    if str(getattr(operation, "path", "")).endswith("/events") and isinstance(query, dict):
        wait = query.get("wait")
        if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 <= wait <= 60:
            return {**query, "wait": min(wait, 1)}
    return query


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    code = getattr(failure, "code", None)
    if code == "ST112" and (wait := _long_poll_wait(case)) is not None:
        return not failure.elapsed <= wait + 1
    if code == "ST302":
        if _missing_guest_path(case, response):
            return False  # the 404 names the watched directory, not the session
        return (case.path_parameters or {}).get("session_id") not in _expiring
    if code != "ST301" or not str(failure.free).endswith("/files"):
        return True
    removed = _removed.get(str(failure.deleted_case_id))
    return removed is None or removed == _guest_path(case)


def _missing_guest_path(case: Any, response: Any) -> bool:
    """A watcher asked for a directory the guest lacks (a 404 of the path, not the id)."""
    if not str(case.path).endswith("/watchers") or getattr(response, "status_code", 0) != 404:
        return False
    return "no such file or directory" in str(getattr(response, "text", ""))


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    operation = context.operation
    if operation is None or not isinstance(body, dict):
        return body
    if (operation.method.upper(), operation.path) == ("POST", "/v1/sessions"):
        return _with_history(body)
    if str(operation.path).endswith("/push"):
        return _to_test_bucket(body)
    return body


def _with_history(body: dict[str, Any]) -> dict[str, Any]:
    """Every other create keeps a 2-step history, unless the fuzzer chose itself."""
    if "history" not in body and next(_creates) % 2:
        return {**body, "history": True, "history_keep": 2}
    return body


def _to_test_bucket(body: dict[str, Any]) -> dict[str, Any]:
    """A push goes to the test's S3 server (``$FORKPOINT_FUZZ_S3``), the only bucket that
    exists: a generated ``s3://`` URL names one that does not (404), and push would never
    answer 2xx. Pulls keep theirs (a link carries a push's digest and location)."""
    target = os.environ.get("FORKPOINT_FUZZ_S3")
    # Only a valid URL is replaced: a negative case must stay invalid (ST201).
    if target and isinstance(body.get("to"), str) and re.fullmatch(_S3_URL, body["to"]):
        return {**body, "to": target}
    return body


_S3_URL = PushRequest.model_json_schema()["properties"]["to"]["pattern"]
