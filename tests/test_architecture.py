"""The dependency arrows of DESIGN.md, enforced: each package imports only what it may."""

from __future__ import annotations

import ast
from pathlib import Path

import forkpoint

SRC = Path(forkpoint.__file__).parent

# package -> forkpoint packages it may import (leaf modules errors/config/polling are listed too)
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "guest": {"protocol"},
    "errors": set(),
    "config": set(),
    "polling": set(),
    "threads": set(),  # the worker pool of the loops forkpoint runs (cli, server, e2b)
    "models": {"protocol"},
    "requests": {"models", "errors"},
    "faults": set(),
    "vm": {"errors", "config", "polling", "faults"},
    "agent_client": {"protocol", "errors", "polling"},
    "images": {"errors", "config"},
    "store": {"errors", "config", "models", "polling"},
    "browser": {"errors"},
    "runtime": {
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
    # sdk imports runtime and server only for its embedded mode, lazily (see test_sdk).
    "sdk": {"models", "runtime", "server", "protocol", "errors", "config"},
    # browser: the web page's screenshot thumbnails (server/ui.py), imported when asked
    "server": {
        "models",
        "requests",
        "runtime",
        "protocol",
        "errors",
        "config",
        "browser",
        "threads",
    },
    # the E2B gateway: like server, plus its own table in the store (store/e2b.py)
    "e2b": {"models", "requests", "runtime", "store", "errors", "config", "threads"},
    "mcp": {"models", "requests", "runtime", "sdk", "agent_client", "protocol", "errors", "config"},
    "demo": {"models", "runtime", "sdk", "browser", "agent_client", "protocol", "errors", "config"},
    "bench": {
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


def test_guest_code_is_stdlib_only() -> None:
    import sys

    for path in [*(SRC / "guest").rglob("*.py"), *(SRC / "protocol").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                assert root == "forkpoint" or root in sys.stdlib_module_names, (
                    f"{path.relative_to(SRC)} imports non-stdlib {root}"
                )
