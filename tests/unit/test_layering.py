"""The dependency graph is a tree of layers: core (gpupool) below billing below api below the CLI.

Read from the source with ``ast``: every module-level import, ``TYPE_CHECKING``
blocks aside (they run only under a type checker).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("gpupool", "billing", "api", "gpupool_cli")  # each may import only those before it


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for layer in LAYERS:
        for path in (REPO / layer).rglob("*.py"):
            if "migrations" not in path.parts:
                found[module_name(path)] = path
    return found


KNOWN = set(modules())


def imports_of(path: Path, name: str) -> set[str]:
    """The modules `path` imports when it is loaded, resolved to absolute names."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for child in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else ():
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from package import submodule` loads the submodule; a name from a module, the module.
                submodules = {f"{base}.{alias.name}" for alias in child.names} & KNOWN
                found.update(submodules or {base})
                if len(submodules) < len(child.names):
                    found.add(base)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {target for target in imports_of(path, name) if target in known and target != name} for name, path in known.items()}


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = []
    for name, path in modules().items():
        own = LAYERS.index(name.split(".")[0])
        for target in imports_of(path, name):
            top = target.split(".")[0]
            if top in LAYERS and LAYERS.index(top) > own:
                upward.append(f"{name} imports {target}")
    assert upward == []


def test_billing_and_the_core_never_import_flask() -> None:
    flask_users = [
        name for name, path in modules().items()
        if name.split(".")[0] in ("gpupool", "billing") and any(target.split(".")[0] == "flask" for target in imports_of(path, name))
    ]
    assert flask_users == []


def test_there_is_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target):], target] if target in path else [node, target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_checks_see_an_upward_import(tmp_path: Path) -> None:
    """The reader resolves what it must: a core module importing the API would be found."""
    probe = tmp_path / "probe.py"
    probe.write_text("from api.context import AppState\nimport billing.meter\nfrom . import parse\n")
    assert {"api.context", "billing.meter", "gpupool.slurm.parse"} <= imports_of(probe, "gpupool.slurm.probe")
