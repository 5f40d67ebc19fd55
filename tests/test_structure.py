"""The shape of the code: no import cycle in gencli/, small core modules, a CLI that starts without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gencli"
CORE_MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_time_nodes(tree: ast.AST):
    """The import statements that run when the module is imported: not inside functions (deferred on purpose,
    to keep torch out of CLI start-up) nor under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *import_time_nodes(child)])
            continue
        yield node
        yield from import_time_nodes(node)


def imported_modules(name: str, path: Path) -> set[str]:
    """The gencli modules that importing ``name`` imports (``from pkg import mod`` names ``pkg.mod`` when it is a
    module, else ``pkg``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in import_time_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from ..core import y
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert imported_modules("gencli.core.stamp.loss", MODULES["gencli.core.stamp.loss"]) >= {
        "gencli.core.stamp.sap", "gencli.core.lm.loss"}
    deferred = ast.parse("import gencli.a\nif TYPE_CHECKING:\n    import gencli.b\ndef f():\n    import gencli.c\n")
    assert [ast.unparse(n) for n in import_time_nodes(deferred) if isinstance(n, ast.Import)] == ["import gencli.a"]


def test_the_import_graph_of_gencli_has_no_cycle():
    graph = {name: imported_modules(name, path) for name, path in MODULES.items()}
    assert sum(len(v) for v in graph.values()) > 50  # the graph was really read
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_no_core_module_is_over_400_lines():
    sizes = {str(p.relative_to(PACKAGE.parent)): len(p.read_text(encoding="utf-8").splitlines())
             for p in (PACKAGE / "core").rglob("*.py")}
    assert len(sizes) > 20
    assert {p: n for p, n in sizes.items() if n > CORE_MAX_LINES} == {}


@pytest.mark.parametrize("module", ["gencli", "gencli.cli"])
def test_importing_gencli_does_not_import_torch(module):
    code = (f"import sys, {module}; heavy = sorted(m for m in ('torch', 'transformers', 'sentence_transformers') "
            "if m in sys.modules); print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == ""
