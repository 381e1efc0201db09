"""Import lint: the package's import graph (read with ``ast``, nothing imported) has no cycles,
and the inner layers import no adapter. Each rule is also run on a synthetic bad graph, so the
checks can fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "nest_integrations"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

#: Imports inside functions that point back up the graph on purpose, each with its reason.
#: They run only when called, so they cannot create an import-time cycle. Empty: the engine no
#: longer imports the assembly (``NestEngine.from_defaults`` is attached by the assembly).
LAZY_EDGES_ALLOWED: dict[tuple[str, str], str] = {}

#: Modules the inner layers may import: core/ sees only itself, types and config.
INNER = {
    "nest_integrations.core": ("nest_integrations.core", "nest_integrations.types",
                               "nest_integrations.config"),
    "nest_integrations.types": ("nest_integrations.types",),
    "nest_integrations.defaults": ("nest_integrations.defaults",),
    "nest_integrations.config": ("nest_integrations.config", "nest_integrations.types"),
}

#: The command line is the outermost adapter: only its own modules import it.
EDGE = "nest_integrations.cli"

#: Engine-building parts that framework adapters must reach through the assembly only.
ASSEMBLED = ("nest_integrations.lm", "nest_integrations.index", "nest_integrations.retrieval.chroma",
             "nest_integrations.decoding.engine")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, known: set[str]) -> str | None:
    """The package module ``name`` refers to (its closest known ancestor), or None."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """``(imported package module, lazy)`` for every import in the file; ``lazy`` = inside a
    function. ``TYPE_CHECKING`` blocks are skipped."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # ``from pkg import submodule`` depends on the submodule, else on pkg itself
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                         for a in child.names]
            for n in names:
                target = _resolve(n, known) if n.startswith(PACKAGE) else None
                if target and target != me:
                    out.append((target, inner))
            visit(child, inner)

    visit(tree, False)
    return out


def import_graph(include_lazy: bool) -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for target, lazy in imports_of(path, known):
            if lazy and (not include_lazy or (m, target) in LAZY_EDGES_ALLOWED):
                continue
            graph[m].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None (iterative DFS with colours)."""
    colour = {n: 0 for n in graph}  # 0 new, 1 on the stack, 2 done
    for start in sorted(graph):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child, 2) == 1:
                return path[path.index(child):] + [child]
            elif colour.get(child) == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))
    return None


def _within(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break the layering: inner layers importing outward, and framework adapters
    building engines themselves instead of through the assembly."""
    bad = []
    for m, targets in graph.items():
        for layer, allowed in INNER.items():
            if _within(m, layer):
                bad += [f"{m} -> {t}" for t in targets if not _within(t, allowed)]
        if _within(m, "nest_integrations.integrations"):
            bad += [f"{m} -> {t} (use nest_integrations.assembly)"
                    for t in targets if _within(t, ASSEMBLED)]
        if not _within(m, EDGE):
            bad += [f"{m} -> {t} (the command line is the edge)"
                    for t in targets if _within(t, EDGE)]
    return sorted(bad)


# ------------------------------------------------------------------------------------ the rules


def test_no_import_cycles_at_import_time() -> None:
    """Module-level imports form no cycle (a cycle here breaks ``import``)."""
    assert find_cycle(import_graph(include_lazy=False)) is None


def test_no_import_cycles_counting_lazy_imports() -> None:
    """Counting imports inside functions too, the only back edges are the allowed ones."""
    cycle = find_cycle(import_graph(include_lazy=True))
    assert cycle is None, " -> ".join(cycle)


def test_inner_layers_import_no_adapter() -> None:
    """core/, types and config import nothing outward; adapters reach engines via assembly;
    nothing outside cli/ imports cli/."""
    graph = import_graph(include_lazy=True)
    assert "nest_integrations.core.mixture" in graph  # the walk sees the package
    assert layer_violations(graph) == []


def test_allowed_lazy_edges_exist_and_stay_lazy() -> None:
    """Each allowed back edge is really there, and only inside a function."""
    mods = modules()
    for (src, dst) in LAZY_EDGES_ALLOWED:
        found = imports_of(mods[src], set(mods))
        assert (dst, True) in found and (dst, False) not in found, (src, dst)


# ------------------------------------------------------------------------------ the checks fail


def test_a_back_edge_planted_in_the_real_graph_is_a_cycle() -> None:
    """The old lazy edge engine -> assembly, planted back, makes the real graph cyclic."""
    graph = import_graph(include_lazy=True)
    assert "nest_integrations.decoding.engine" in graph["nest_integrations.assembly"]
    graph["nest_integrations.decoding.engine"].add("nest_integrations.assembly")
    cycle = find_cycle(graph)
    assert cycle is not None and {"nest_integrations.decoding.engine",
                                  "nest_integrations.assembly"} <= set(cycle)


def test_cycle_finder_finds_a_planted_cycle() -> None:
    """A synthetic graph with a cycle is reported; removing one edge clears it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    graph["c"].discard("a")
    assert find_cycle(graph) is None


def test_layer_check_flags_core_importing_an_adapter() -> None:
    """core importing the Chroma adapter, and an adapter importing the HF model, are flagged."""
    graph = {
        "nest_integrations.core.mixture": {"nest_integrations.retrieval.chroma"},
        "nest_integrations.integrations.langchain.llms": {"nest_integrations.lm.hf"},
        "nest_integrations.decoding.engine": {"nest_integrations.core.mixture"},
    }
    assert layer_violations(graph) == [
        "nest_integrations.core.mixture -> nest_integrations.retrieval.chroma",
        "nest_integrations.integrations.langchain.llms -> nest_integrations.lm.hf "
        "(use nest_integrations.assembly)",
    ]


def test_import_reader_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    """The reader resolves ``from pkg import submodule`` and marks imports in functions lazy."""
    mods = modules()
    found = dict(imports_of(mods["nest_integrations.evaluation.runner"], set(mods)))
    assert found.get("nest_integrations.evaluation.metrics") is False
    lazy = imports_of(mods["nest_integrations.decoding.engine"], set(mods))
    assert any(t.startswith("nest_integrations.index") and is_lazy for t, is_lazy in lazy)
    assert ("nest_integrations.assembly", True) not in lazy


def test_layer_check_flags_a_library_module_importing_the_cli() -> None:
    """The real graph has every subcommand under cli/; a library module importing one is flagged,
    while cli/ importing the library is fine."""
    graph = import_graph(include_lazy=True)
    commands = {m for m in graph["nest_integrations.cli"] if _within(m, EDGE)}
    assert {"nest_integrations.cli.ask", "nest_integrations.cli.serve",
            "nest_integrations.cli.dresd", "nest_integrations.cli.knn_ssd",
            "nest_integrations.cli.calibrate", "nest_integrations.cli.eval"} <= commands
    graph["nest_integrations.server.app"].add("nest_integrations.cli.serve")
    assert layer_violations(graph) == [
        "nest_integrations.server.app -> nest_integrations.cli.serve (the command line is the edge)"]


@pytest.mark.parametrize("module", ["nest_integrations.integrations.langchain._engine",
                                    "nest_integrations.integrations.langchain.retrievers"])
def test_the_old_langchain_cycle_is_gone(module: str) -> None:
    """``_engine`` -> ``retrievers`` -> ``chat_models``/``llms`` -> ``_engine`` no longer exists."""
    graph = import_graph(include_lazy=True)
    chat = "nest_integrations.integrations.langchain.chat_models"
    assert "nest_integrations.integrations.langchain._engine" in graph[chat]
    assert "nest_integrations.integrations.langchain.retrievers" not in graph[
        "nest_integrations.integrations.langchain._engine"]
    assert module in graph
