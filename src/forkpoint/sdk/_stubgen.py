"""Writes ``_sync.pyi``: the blocking twin's types, derived from the async core.

The twin itself is generated at import time (``_sync.py``), which type checkers cannot
follow; this stub gives them the same surface with precise types, so
``Sandbox.create()`` is a ``Sandbox`` and ``sb.commands.runn(...)`` is an error. It is
made from the async core (``_async.py``, ``_volume.py``) by rules, never by hand
(httpcore's *unasync* idea):
``async def`` → ``def``, ``__aenter__``/``__aexit__`` → ``__enter__``/``__exit__``,
``AsyncX`` → ``X`` for every twin, bodies dropped. ``tests/test_sdk_types.py`` fails when
the stub is stale. Regenerate with ``python -m forkpoint.sdk._stubgen``.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

__all__ = ["TWINS", "render"]

# "AsyncSandbox" -> "Sandbox", as _sync.py declares them (imported by name: type
# checkers read its stub, which this module writes).
TWINS = {
    async_cls.__name__: twin.__name__
    for async_cls, twin in importlib.import_module("forkpoint.sdk._sync").TWINS.items()
}
#: The async core's modules.
_CORE = ("_async.py", "_volume.py")
_DUNDERS = {"__aenter__": "__enter__", "__aexit__": "__exit__"}
_KEPT_DECORATORS = {"classmethod", "staticmethod", "property", "overload"}
_HERE = Path(__file__).parent
_HEADER = (
    "# Generated from _async.py by `python -m forkpoint.sdk._stubgen`: do not edit.\n"
    "# The types of the blocking twin that _sync.py builds at import time.\n"
)


class _Rename(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(TWINS.get(node.id, node.id), node.ctx)


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.FunctionDef | None:
    name = _DUNDERS.get(fn.name, fn.name)
    if name.startswith("_") and name not in _DUNDERS.values():
        return None
    stub = ast.FunctionDef(**{field: getattr(fn, field) for field in fn._fields})
    stub.name = name
    stub.body = [ast.Expr(ast.Constant(...))]
    stub.decorator_list = [
        d for d in fn.decorator_list if isinstance(d, ast.Name) and d.id in _KEPT_DECORATORS
    ]
    return stub


def _twin_class(cls: ast.ClassDef) -> ast.ClassDef:
    body: list[ast.stmt] = []
    overloaded = {
        item.name
        for item in cls.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(isinstance(d, ast.Name) and d.id == "overload" for d in item.decorator_list)
    }
    for item in cls.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            stub = _signature(item)
            # A stub declares an overloaded function by its overloads alone.
            if stub is not None and (item.name not in overloaded or stub.decorator_list):
                body.append(stub)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if not item.target.id.startswith("_"):
                body.append(ast.AnnAssign(item.target, item.annotation, None, simple=1))
    twin = ast.parse(f"class {TWINS[cls.name]}(SyncTwin): ...").body[0]
    assert isinstance(twin, ast.ClassDef)
    twin.body = body or twin.body
    return twin


def _used_imports(
    imports: list[ast.Import | ast.ImportFrom], used: set[str]
) -> list[ast.Import | ast.ImportFrom]:
    """``imports`` narrowed to the names the stub uses (unused ones would be lint)."""
    kept: list[ast.Import | ast.ImportFrom] = []
    for node in imports:
        names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
        if names:
            node.names = names
            kept.append(node)
    return kept


def render() -> str:
    """The stub's text, from the async core as it is now."""
    source = ast.Module(
        body=[node for name in _CORE for node in ast.parse((_HERE / name).read_text()).body],
        type_ignores=[],
    )
    top_level = [
        *source.body,
        # the `if TYPE_CHECKING:` imports are plain imports in a stub
        *(n for i in source.body if isinstance(i, ast.If) for n in i.body),
    ]
    imports: list[ast.Import | ast.ImportFrom] = [
        node
        for node in top_level
        if isinstance(node, ast.Import)
        or (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__")
    ]
    classes = [
        _twin_class(node)
        for node in source.body
        if isinstance(node, ast.ClassDef) and node.name in TWINS
    ]
    classes = [_Rename().visit(cls) for cls in classes]
    used = {n.id for cls in classes for n in ast.walk(cls) if isinstance(n, ast.Name)}
    module = ast.Module(
        body=[
            *_used_imports(imports, used),
            ast.parse("class SyncTwin: ...").body[0],
            *classes,
            ast.parse(f"__all__ = {sorted([*TWINS.values(), 'SyncTwin'])!r}").body[0],
        ],
        type_ignores=[],
    )
    ast.fix_missing_locations(module)
    return _format(_HEADER + ast.unparse(module) + "\n")


def _format(text: str) -> str:
    """Imports sorted and ``ruff format``: the stub reads like the rest of the code (the
    full path lets ruff find the project's settings, as a ``ruff format`` of the tree does)."""
    stub = str(_HERE / "_sync.pyi")
    for command in (["check", "--select", "I", "--fix", "--quiet"], ["format"]):
        text = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--stdin-filename", stub, "-"],
            input=text, capture_output=True, text=True, check=True, cwd=_HERE,
        ).stdout  # fmt: skip
    return text


if __name__ == "__main__":
    (_HERE / "_sync.pyi").write_text(render())
