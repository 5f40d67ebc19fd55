"""The shape of the code: every import of gencli/ follows docs/architecture.md's table of rooms, no import cycle,
small core modules, a CLI that starts without torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gencli"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
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


def imported_modules(name: str, path: Path, every: bool = False) -> set[str]:
    """The gencli modules that importing ``name`` imports (``from pkg import mod`` names ``pkg.mod`` when it is a
    module, else ``pkg``); with ``every``, also the imports inside functions and under ``if TYPE_CHECKING:``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree) if every else import_time_nodes(tree):
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
    """Not even through an import inside a function: the rooms form a stack."""
    graph = {name: imported_modules(name, path, every=True) for name, path in MODULES.items()}
    assert sum(len(v) for v in graph.values()) > 400  # the graph was really read, deferred imports included
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def rooms(markdown: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """docs/architecture.md's table: (module name -> its room, room -> the rooms it may import)."""
    section = markdown.split("## Layers", 1)[1].split("\n## ", 1)[0]
    owner, allowed = {}, {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        room, modules, _, may = cells
        allowed[room] = {r.strip() for r in may.split(",") if r.strip()}
        owner.update(dict.fromkeys(re.findall(r"`([\w.]+)`", modules), room))
    return owner, allowed


def room_of(module: str, owner: dict[str, str]) -> str | None:
    """The room of the longest table entry that is ``module`` or one of its packages."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in owner:
            return owner[".".join(parts[:n])]
    return None


def arrows_against(table: str) -> list[str]:
    owner, allowed = rooms(table)
    wrong = []
    for name, path in MODULES.items():
        mine = room_of(name, owner)
        if mine is None:
            wrong.append(f"{name} belongs to no room of docs/architecture.md")
            continue
        for target in sorted(imported_modules(name, path, every=True)):
            theirs = room_of(target, owner)
            if theirs != mine and theirs not in allowed[mine]:
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    return wrong


def test_the_layer_check_reads_the_table_and_sees_a_deferred_import():
    owner, allowed = rooms(ARCHITECTURE.read_text(encoding="utf-8"))
    assert room_of("gencli.core.infer.beam", owner) == "core.infer" and room_of("gencli.core.dist", owner) == "core.util"
    assert room_of("gencli", owner) == "api" and room_of("gencli.errors", owner) == "base"
    assert allowed["steps"] == set() and "core.infer" not in allowed["core.lm"]
    # gencli.core.lm.warm imports core.sid (allowed); a table without that arrow makes the check fail
    table = ARCHITECTURE.read_text(encoding="utf-8").replace(
        "| base, config, core.util, core.data, core.sid |", "| base, config, core.util, core.data |")
    assert any(line.startswith("gencli.core.lm.warm (core.lm) imports gencli.core.sid")
               for line in arrows_against(table))
    # gencli.core.infer.bundle imports gencli.core.lm.backbone only inside a function: still an arrow
    bundle = MODULES["gencli.core.infer.bundle"]
    assert "gencli.core.lm.backbone" in imported_modules("gencli.core.infer.bundle", bundle, every=True)


def test_every_import_follows_the_table_of_rooms():
    """Every import, at module level or inside a function, goes within a room or along an arrow of the table."""
    wrong = arrows_against(ARCHITECTURE.read_text(encoding="utf-8"))
    assert wrong == [], "imports against docs/architecture.md's table:\n" + "\n".join(wrong)


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
