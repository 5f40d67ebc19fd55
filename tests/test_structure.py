"""The shape of the code: the import-linter contracts of pyproject.toml hold for every import of gencli/ (at module
level, inside functions, under ``if TYPE_CHECKING:``) and allow exactly the arrows of docs/architecture.md's table of
rooms; no import cycle, small core modules, a CLI that starts without torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gencli"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PYPROJECT = ROOT / "pyproject.toml"
CORE_MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


@pytest.fixture(scope="module")
def graph():
    """gencli's import graph as import-linter reads it (grimp), from this checkout."""
    import grimp

    found = grimp.build_graph("gencli", cache_dir=None)
    assert set(found.modules) == MODULES, "grimp read another gencli than this checkout's"
    return found


def contracts() -> list:
    """pyproject.toml's contracts, as import-linter builds them."""
    from importlinter.api import read_configuration
    from importlinter.contracts.forbidden import ForbiddenContract
    from importlinter.contracts.layers import LayersContract

    kinds = {"layers": LayersContract, "forbidden": ForbiddenContract}
    config = read_configuration(str(PYPROJECT))
    return [kinds[c["type"]](c["name"], config["session_options"],
                             {k: v for k, v in c.items() if k not in ("id", "name", "type")})
            for c in config["contracts_options"]]


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


def test_cycle_finder_finds_a_cycle_and_only_a_cycle(graph):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert graph.find_modules_directly_imported_by("gencli.core.stamp.loss") >= {
        "gencli.core.stamp.sap", "gencli.core.lm.loss"}
    # gencli imports core.infer only inside a function and under TYPE_CHECKING: still an arrow
    assert "gencli.core.infer.recommend" in graph.find_modules_directly_imported_by("gencli")


def test_the_import_graph_of_gencli_has_no_cycle(graph):
    """Not even through an import inside a function: the rooms form a stack."""
    edges = {name: graph.find_modules_directly_imported_by(name) for name in graph.modules}
    assert sum(len(v) for v in edges.values()) > 400  # the graph was really read, deferred imports included
    cycle = find_cycle(edges)
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


def test_the_table_names_every_module_and_its_room():
    owner, allowed = rooms(ARCHITECTURE.read_text(encoding="utf-8"))
    assert room_of("gencli.core.infer.beam", owner) == "core.infer" and room_of("gencli.core.dist", owner) == "core.util"
    assert room_of("gencli", owner) == "api" and room_of("gencli.errors", owner) == "base"
    assert allowed["steps"] == set() and "core.infer" not in allowed["core.lm"]
    assert [m for m in sorted(MODULES) if room_of(m, owner) is None] == []


def test_lint_imports_keeps_every_contract_of_pyproject():
    """What CI and a developer run: `lint-imports` on this checkout, every contract kept."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--no-logo", str(PYPROJECT)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and " 0 broken" in done.stdout, done.stdout + done.stderr


def test_the_contracts_allow_exactly_the_arrows_of_the_table(graph):
    """Room by room, on gencli's modules without their imports: one import the table allows keeps every contract,
    any other breaks one. A room stands in by each of its modules that holds no other room (core.util by
    gencli.core.artifacts and its siblings, not by the package gencli.core; api by the package gencli)."""
    import grimp

    owner, allowed = rooms(ARCHITECTURE.read_text(encoding="utf-8"))
    members = {room: [m for m, r in owner.items() if r == room and not any(
        o.startswith(m + ".") and owner[o] != room for o in owner)] or [m for m, r in owner.items() if r == room]
        for room in allowed}
    blank = grimp.ImportGraph()
    for name in graph.modules:
        blank.add_module(name)
    checks = contracts()

    def broken(importer: str, imported: str) -> list[str]:
        blank.add_import(importer=importer, imported=imported)
        try:
            return [c.name for c in checks if not c.check(blank, verbose=False).kept]
        finally:
            blank.remove_import(importer=importer, imported=imported)

    wrong = []
    for room, mine in members.items():
        for other, theirs in members.items():
            pairs = [(a, b) for a in mine for b in theirs if a != b] if other == room else [(mine[0], theirs[0])]
            for importer, imported in pairs:
                names = broken(importer, imported)
                if (other == room or other in allowed[room]) == bool(names):
                    wrong.append(f"{importer} ({room}) -> {imported} ({other}): the table "
                                 f"{'forbids' if names == [] else 'allows'} it, the contracts "
                                 f"{'break: ' + ', '.join(names) if names else 'keep it'}")
    assert wrong == [], "pyproject.toml's contracts and docs/architecture.md's table differ:\n" + "\n".join(wrong)
    # the package gencli.core stands in for no room (it holds every core room): it stays its docstring
    assert graph.find_modules_directly_imported_by("gencli.core") == set()


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
