"""The dependency arrows of docs/architecture.md, enforced: each package imports only what it
may; and no async def blocks its event loop."""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path

import forkpoint

SRC = Path(forkpoint.__file__).parent

# package -> forkpoint packages it may import (leaf modules errors/config/polling are listed too)
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "guest": {"protocol"},
    "errors": set(),
    # the home's layout; mounts its XFS image after a reboot (storage)
    "config": {"storage"},
    "storage": {"errors"},
    "polling": set(),
    "threads": set(),  # the worker pool of the loops forkpoint runs (cli, server, e2b)
    "models": {"protocol"},
    # the egress rules: a value the doors check and the engine enforces (pure, a leaf)
    "egress": {"errors"},
    "requests": {"models", "errors", "egress", "volume_fs"},
    # a volume's files, reached without leaving its directory (a leaf the runtime uses)
    "volume_fs": {"errors", "models"},
    # the host side of guests' volume mounts: a process of its own (vm starts it by name)
    "volume_server": {"protocol", "volume_fs", "models", "errors"},
    "faults": set(),
    "vm": {"errors", "config", "polling", "faults", "egress"},
    "agent_client": {"protocol", "errors", "polling"},
    "images": {"errors", "config"},
    "store": {"errors", "config", "models", "polling"},
    "browser": {"errors"},
    "runtime": {
        "egress",
        "storage",
        "volume_fs",
        "models",
        "requests",
        "vm",
        "agent_client",
        "images",
        "store",
        "protocol",
        "errors",
        "config",
        "polling",
        "faults",
    },
    # many hosts on Ray: node daemons hold a runtime each; clients hold ClusterRuntime;
    # store: the E2B gateway's row of a sandbox, kept beside its session's record
    "cluster": {
        "runtime",
        "store",
        "vm",
        "models",
        "requests",
        "errors",
        "config",
        "agent_client",
        "threads",
    },
    # the operations, declared once; the runtime only for the calls' types
    "api": {"models", "requests", "runtime", "errors", "config"},
    # sdk imports runtime, cluster and server only for its embedded mode, lazily (test_sdk).
    "sdk": {"api", "models", "runtime", "cluster", "server", "protocol", "errors", "config"},
    # browser: the web page's screenshot thumbnails (server/ui.py), imported when asked
    "server": {
        "api",
        "models",
        "requests",
        "runtime",
        "protocol",
        "errors",
        "config",
        "browser",
        "threads",
    },
    # the E2B gateway: like server, plus its own table in the store (store/e2b.py) and
    # the name of E2B's base image (its default template)
    "e2b": {
        "models",
        "requests",
        "egress",
        "runtime",
        "store",
        "errors",
        "config",
        "threads",
        "images",
    },  # fmt: skip
    "mcp": {
        "api",
        "models",
        "requests",
        "runtime",
        "sdk",
        "agent_client",
        "protocol",
        "errors",
        "config",
    },  # fmt: skip
    "demo": {"models", "runtime", "sdk", "browser", "agent_client", "protocol", "errors", "config"},
    "bench": {
        "cluster",
        "e2b",
        "server",
        "models",
        "runtime",
        "vm",
        "images",
        "store",
        "agent_client",
        "protocol",
        "errors",
        "config",
        "polling",
    },
}
# The shells on top may use everything below them.
ALLOWED["cli"] = set(ALLOWED) | {"cli"}


def _package_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    own = _package_of(path)
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: stays inside the package unless it climbs out
                if node.level > 1 and node.module:
                    names = [f"forkpoint.{node.module}"]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "forkpoint" and len(parts) > 1 and parts[1] != own:
                found.add(parts[1])
    return found


def test_every_package_respects_the_dependency_rules() -> None:
    violations = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent == SRC and path.name == "__init__.py":
            continue
        package = _package_of(path)
        assert package in ALLOWED, f"new package {package!r}: add it to ALLOWED"
        for imported in _imported_packages(path) - ALLOWED[package]:
            violations.append(f"{path.relative_to(SRC)} imports forkpoint.{imported}")
    assert not violations, "\n".join(violations)


# A known image's service may use what that image installs (images/recipe.py KNOWN_IMAGES);
# the agent and the protocol run in every guest, so they may not.
IMAGE_SERVICES = {"guest/interpreter.py": {"jupyter_client"}}


def test_guest_code_is_stdlib_only() -> None:
    import sys

    for path in [*(SRC / "guest").rglob("*.py"), *(SRC / "protocol").rglob("*.py")]:
        allowed = IMAGE_SERVICES.get(path.relative_to(SRC).as_posix(), set())
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                assert root in {"forkpoint", *allowed} or root in sys.stdlib_module_names, (
                    f"{path.relative_to(SRC)} imports non-stdlib {root}"
                )


# -- nothing blocks an event loop ------------------------------------------------------

# What an ``async def`` may not call itself (awaited calls are coroutines and fine; work
# handed to ``asyncio.to_thread``/the pool is passed, not called): the store (SQLite),
# files and subprocesses.
_BLOCKING_MODULE_CALLS = {
    "subprocess": {"run", "check_output", "check_call", "call", "Popen"},
    "time": {"sleep"},
    "shutil": {"copy", "copy2", "copyfile", "copytree", "move", "rmtree"},
    "os": {
        "open", "read", "write", "remove", "unlink", "rename", "replace", "listdir",
        "scandir", "makedirs", "mkdir", "rmdir", "truncate", "fsync", "walk",
    },
}  # fmt: skip
_BLOCKING_METHODS = {
    "read_text", "write_text", "read_bytes", "write_bytes", "unlink", "mkdir", "rmdir",
    "iterdir", "glob", "rglob", "rename", "touch", "chmod", "stat", "exists", "is_file",
    "is_dir", "symlink_to", "open",
}  # fmt: skip
# Objects whose every method reads or writes the store (forkpoint's SQLite database): the
# store itself, the E2B gateway's table of it and its sandboxes.
_STORE_NAMES = {"store", "records", "sandboxes"}


def _dotted(node: ast.expr) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append("()")
    return parts[::-1]


def _blocking(call: ast.Call) -> str | None:
    """What ``call`` blocks on, if it does (a name for the message), else None."""
    name = _dotted(call.func)
    if name == ["open"]:
        return "open"
    if len(name) == 2 and name[1] in _BLOCKING_MODULE_CALLS.get(name[0], ()):
        return ".".join(name)
    if len(name) >= 2 and name[-1] in _BLOCKING_METHODS and name[0] not in _BLOCKING_MODULE_CALLS:
        return ".".join(name)
    if len(name) >= 2 and name[-2] in _STORE_NAMES:
        return ".".join(name)
    if len(name) >= 2 and name[-2] in ("runtime", "rt") and name[-1] in _runtime_blocking():
        return ".".join(name)
    return None


# Runtime methods that are neither coroutines nor blocking: they name paths, or set how a
# long-lived door's runtime runs.
_RUNTIME_PURE = {"files", "checkpoint_files", "serve_long_lived"}


@functools.cache
def _runtime_blocking() -> frozenset[str]:
    """The Runtime's plain methods — its own and those of the services whose operations it
    offers under the same names: each reads the store or files (queries, listings), so an
    ``async def`` hands them to a thread. Not: coroutines, and methods giving an async
    iterator or context manager (their work happens when awaited)."""
    from forkpoint.runtime import runtime as facade

    def is_async(member: object) -> bool:
        returns = str(getattr(member, "__annotations__", {}).get("return", ""))
        unwrapped = inspect.unwrap(member)  # type: ignore[arg-type]
        return (
            inspect.iscoroutinefunction(member)
            or inspect.isasyncgenfunction(unwrapped)
            or any(kind in returns for kind in ("AsyncIterator", "AsyncContextManager"))
        )

    services = [
        cls
        for _, cls in inspect.getmembers(facade, inspect.isclass)
        if cls.__module__.startswith("forkpoint.runtime.")
    ]
    assert len(services) > 8, services  # the façade and the services it binds
    return frozenset(
        name
        for cls in services
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not is_async(member) and not name.startswith("_") and name not in _RUNTIME_PURE
    )


def _own_blocking_functions(tree: ast.Module) -> set[str]:
    """The module's plain functions and methods that block themselves: an ``async def``
    calling ``self.get(...)`` that reads the store blocks as surely as reading it."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            calls = [c for c in _direct_calls(node) if _blocking(c) is not None]
            if calls:
                names.add(node.name)
    return names


def _direct_calls(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
    """The calls in ``function``'s own body (not in the functions and lambdas it defines),
    except those awaited."""
    found: list[ast.Call] = []
    awaited: set[int] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Await) and isinstance(child.value, ast.Call):
                awaited.add(id(child.value))
            if isinstance(child, ast.Call) and id(child) not in awaited:
                found.append(child)
            visit(child)

    visit(function)
    return found


def blocking_calls_in_async(source: str) -> list[tuple[int, str]]:
    """(line, call) for each blocking call made directly in an ``async def``."""
    tree = ast.parse(source)
    own = _own_blocking_functions(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.AsyncFunctionDef):
            continue
        for call in _direct_calls(node):
            name = _dotted(call.func)
            what = _blocking(call)
            if what is None and name[-1:] and name[-1] in own and name[0] in ("self", name[-1]):
                what = ".".join(name)
            if what is not None:
                found.append((call.lineno, what))
    return sorted(found)


def test_nothing_blocks_an_event_loop() -> None:
    """No store, file or subprocess call inside an ``async def``: it belongs in
    ``asyncio.to_thread`` (or the pool), or the loop's other requests wait for it."""
    violations = [
        f"{path.relative_to(SRC)}:{line}: {what}"
        for path in sorted(SRC.rglob("*.py"))
        for line, what in blocking_calls_in_async(path.read_text())
    ]
    assert not violations, "\n".join(violations)


def test_the_blocking_check_sees_what_it_must() -> None:
    source = """
async def handler(runtime, path):
    record = runtime.store.get_session("s")
    data = path.read_bytes()
    subprocess.run(["true"])
    with open(path) as f:
        pass
    await asyncio.to_thread(runtime.store.get_session, "s")
    await asyncio.to_thread(lambda: path.read_text())
    await runtime.stat("s", "/x")
    self.lookup("s")
    await asyncio.to_thread(self.lookup, "s")

    def later():
        return path.read_text()

def lookup(self, name):
    return self.records.get(name)
"""
    found = [what for _, what in blocking_calls_in_async(source)]
    assert found == [
        "runtime.store.get_session",
        "path.read_bytes",
        "subprocess.run",
        "open",
        "self.lookup",
    ]


# -- no import cycle -----------------------------------------------------------------------


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that module ``name`` (at ``path``) imports when it is
    loaded: its top-level imports (not those in functions, nor under ``if
    TYPE_CHECKING``), ``from package import submodule`` counted as the submodule."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return {m for m in found if m in modules and m != name}


def import_cycles(files: dict[str, Path]) -> list[list[str]]:
    """The strongly connected groups (of two or more) of the top-level import graph."""
    graph = {name: _top_level_imports(name, path, set(files)) for name, path in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_itself_through_others() -> None:
    """No cycle among the imports made when modules load (lazy ones inside functions and
    TYPE_CHECKING ones aside: the runtime's helpers still reach back into it that way)."""
    files = {_module_name(p, SRC.parent): p for p in SRC.rglob("*.py")}
    assert import_cycles(files) == []


def test_the_cycle_check_sees_one(tmp_path: Path) -> None:
    package = tmp_path / "forkpoint" / "demo_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from forkpoint.demo_pkg.b import x\ny = 1\n")
    (package / "b.py").write_text("from .a import y\nx = 2\n")
    (package / "c.py").write_text("from forkpoint.demo_pkg import a\n")
    files = {_module_name(p, tmp_path): p for p in package.glob("*.py")}
    assert import_cycles(files) == [["forkpoint.demo_pkg.a", "forkpoint.demo_pkg.b"]]


# -- no private access across modules ---------------------------------------------------------

# A namedtuple's public API is spelled with an underscore (to stay out of its fields' way).
_NAMEDTUPLE_API = {"_fields", "_replace", "_asdict", "_make"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in _NAMEDTUPLE_API


def private_access_across_modules(source: str) -> list[tuple[int, str]]:
    """(line, what) for each private name this module uses but does not define: an
    ``obj._name`` (``obj`` not ``self``/``cls``) whose ``_name`` the module never defines
    or assigns, and each ``from x import _name``. What a module defines it may use on
    any object of its own classes."""
    tree = ast.parse(source)
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _is_private(a.name)]
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr not in defined:
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_no_module_uses_another_modules_private_names() -> None:
    """A service is used through what it publishes: a helper calling another module's
    ``_private`` method is a hidden dependency (the runtime's helpers used to)."""
    violations = [
        f"{path.relative_to(SRC)}:{line}: {what}"
        for path in sorted(SRC.rglob("*.py"))
        for line, what in private_access_across_modules(path.read_text())
    ]
    assert not violations, "\n".join(violations)


def test_the_private_access_check_sees_what_it_must() -> None:
    source = """
from .runtime import _helper, Runtime

class Pool:
    def __init__(self):
        self._rows = []

    def merge(self, other):
        return self._rows + other._rows + other._gone

async def diff(runtime):
    await runtime._fork_target(None)
    return runtime.store._read(), point._replace(x=1)
"""
    found = [what for _, what in private_access_across_modules(source)]
    assert found == ["import _helper", "other._gone", "runtime._fork_target", "runtime.store._read"]
