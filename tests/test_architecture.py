"""Import lint: the package's import graph (read with ``ast``, nothing imported) has no cycles,
between modules or between packages (lazy imports counted), every package imports only its own
layer or the ones below, and the inner layers import no adapter. Each rule is also run on a
planted bad graph, so the checks can fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "nest_integrations"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

#: Imports inside functions that point back up the graph on purpose, each with its reason.
#: They run only when called, so they cannot create an import-time cycle. Empty: the engine
#: never imports the assembly (``assembly.NestEngine`` subclasses it to add ``from_defaults``).
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


#: The packages of ``nest_integrations`` from the bottom up: a package imports only packages of
#: its own layer or of the layers below, lazily or not. ``""`` is the top-level package itself
#: (``__init__.py``: public re-exports).
PACKAGE_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("plain data and settings", ("types", "config", "defaults", "paths", "jsonl", "_optional",
                                 "wikipedia", "calibration_store")),
    ("the algorithms", ("core",)),
    ("ports and their implementations", ("lm", "embedders", "index", "retrieval", "output")),
    ("what drafters and the loop read", ("dresd", "knn_ssd", "attribution")),
    ("drafters", ("drafters",)),
    ("the answer policy", ("policy",)),
    ("the loop and the engine", ("decoding",)),
    ("assembly", ("assembly", "assembly_settings", "assembly_stores")),
    ("pipelines that build engines or decode offline", ("builders", "ingest", "calibrate")),
    ("evaluation", ("evaluation",)),
    ("framework edges and the server", ("integrations", "langchain", "llama_index", "server",
                                        "")),
    ("command line", ("cli",)),
]


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


def package_of(module: str) -> str:
    """``nest_integrations.X`` for any module under ``X``; the top-level package is itself."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to packages (edges inside a package dropped)."""
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        p = package_of(m)
        out.setdefault(p, set()).update(package_of(t) for t in targets if package_of(t) != p)
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def layer_of() -> dict[str, int]:
    """Package -> its index in ``PACKAGE_LAYERS``."""
    return {(f"{PACKAGE}.{p}" if p else PACKAGE): i
            for i, (_, names) in enumerate(PACKAGE_LAYERS) for p in names}


def upward_imports(packages: dict[str, set[str]]) -> list[str]:
    """Package imports that point to a higher layer, and packages with no layer."""
    layers = layer_of()
    bad = [f"{p} has no layer in PACKAGE_LAYERS" for p in packages if p not in layers]
    for p, targets in packages.items():
        for t in targets:
            if p in layers and t in layers and layers[t] > layers[p]:
                bad.append(f"{p} -> {t} ({PACKAGE_LAYERS[layers[p]][0]!r} imports "
                           f"{PACKAGE_LAYERS[layers[t]][0]!r})")
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


def test_no_package_cycles_counting_lazy_imports() -> None:
    """Packages (``drafters``, ``knn_ssd``, ...) form no loop, lazy imports included: a module
    cycle is not needed for two packages to lean on each other."""
    cycle = find_cycle(package_graph(import_graph(include_lazy=True)))
    assert cycle is None, " -> ".join(cycle)


def test_every_package_imports_only_its_layer_or_below() -> None:
    """Every package has a layer, and none imports a package of a higher layer, lazily or not."""
    packages = package_graph(import_graph(include_lazy=True))
    assert {f"{PACKAGE}.drafters", f"{PACKAGE}.builders", PACKAGE} <= set(packages)
    assert upward_imports(packages) == []
    named = [p for _, names in PACKAGE_LAYERS for p in names]
    assert len(named) == len(set(named))
    assert set(layer_of()) == set(packages)  # no layer names a package that is gone


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


def test_a_package_loop_planted_in_the_real_graph_is_found() -> None:
    """The old loop, the KNN-SSD drafter importing the self-speculative builder (which imports
    the drafters), planted back: no module cycle, but a package loop and an upward import."""
    graph = import_graph(include_lazy=True)
    graph["nest_integrations.drafters.knn_ssd"].add(
        "nest_integrations.builders.knn_ssd_selfspec")
    cycle = find_cycle(package_graph(graph))
    assert cycle is not None and {"nest_integrations.drafters",
                                  "nest_integrations.builders"} <= set(cycle)
    assert upward_imports(package_graph(graph)) == [
        "nest_integrations.drafters -> nest_integrations.builders ('drafters' imports "
        "'pipelines that build engines or decode offline')"]


def test_package_check_finds_a_loop_no_module_cycle_shows() -> None:
    """a.x -> b.y -> a.z is acyclic between modules and a loop between packages a and b."""
    graph = {"nest_integrations.a.x": {"nest_integrations.b.y"},
             "nest_integrations.b.y": {"nest_integrations.a.z"},
             "nest_integrations.a.z": set()}
    assert find_cycle(graph) is None
    assert package_graph(graph) == {"nest_integrations.a": {"nest_integrations.b"},
                                    "nest_integrations.b": {"nest_integrations.a"}}
    assert find_cycle(package_graph(graph)) is not None
    assert upward_imports({"nest_integrations.core": {"nest_integrations.lm"},
                           "nest_integrations.lm": set(),
                           "nest_integrations.new": set()}) == [
        "nest_integrations.core -> nest_integrations.lm ('the algorithms' imports "
        "'ports and their implementations')",
        "nest_integrations.new has no layer in PACKAGE_LAYERS"]


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
    """The real graph has every subcommand under cli/ (imported by name when it runs:
    ``cli.command_module``); a library module importing one is flagged, while cli/ importing the
    library is fine."""
    from nest_integrations.cli import COMMANDS

    graph = import_graph(include_lazy=True)
    commands = {f"nest_integrations.cli.{name.replace('-', '_')}" for name in COMMANDS}
    assert commands <= set(graph) and all(_within(m, EDGE) for m in commands)
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


# ------------------------------------------------------------------ the LM port is declared

#: The decode loop stays the paper's step (issue 54): at most this many lines.
LOOP_MAX_LINES = 350


#: Names an LM object goes by in the package (a variable or an attribute): ``lm``, ``self.lm``,
#: ``ctx.lm``, ``self._lm``, a wrapper's ``wrapped``.
LM_NAMES = ("lm", "_lm", "wrapped")
#: The one delegation left on an LM object, with its reason: ``SerializedLM`` passes every
#: attribute of the model it serialises through (its port is resolved once, typed).
LM_PROBES_ALLOWED = {"lm/serialized.py": ["getattr(self.wrapped, name)"]}


def probes(source: str, lm_only: bool = True) -> list[str]:
    """``getattr``/``hasattr`` calls (with ``lm_only``: those on an LM object, ``LM_NAMES``):
    what the typed port (``lm.port``) replaces."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args):
            obj = node.args[0]
            name = obj.id if isinstance(obj, ast.Name) else getattr(obj, "attr", None)
            if not lm_only or name in LM_NAMES:
                found.append(ast.unparse(node))
    return found


def lm_probes(source: str) -> list[str]:
    return probes(source, lm_only=True)


def test_nothing_probes_an_lm_and_decoding_probes_nothing() -> None:
    """No module of the package calls ``getattr``/``hasattr`` on an LM object (but the one
    allowed delegation), and ``decoding/`` calls neither on anything (the drafter port
    included: ``drafters.base``'s protocols say what a drafter may add); the loop fits the
    paper's step; planted probes are found."""
    found = {p.relative_to(ROOT).as_posix(): lm_probes(p.read_text(encoding="utf-8"))
             for p in sorted(ROOT.rglob("*.py"))}
    assert {name: f for name, f in found.items() if f} == LM_PROBES_ALLOWED
    anything = {p.name: probes(p.read_text(encoding="utf-8"), lm_only=False)
                for p in sorted((ROOT / "decoding").glob("*.py"))}
    assert {name: f for name, f in anything.items() if f} == {}
    assert lm_probes("x = getattr(self.lm, 'forward_argmax', None) or hasattr(lm, 'tokenizer')"
                     ) == ["getattr(self.lm, 'forward_argmax', None)", "hasattr(lm, 'tokenizer')"]
    assert lm_probes("getattr(ctx.lm, 'inexact_rows', None); hasattr(self._lm, 'x')") == [
        "getattr(ctx.lm, 'inexact_rows', None)", "hasattr(self._lm, 'x')"]
    assert lm_probes("getattr(self.drafter, 'cite', None)") == []
    assert probes("getattr(self.drafter, 'cite', None)", lm_only=False) == [
        "getattr(self.drafter, 'cite', None)"]
    lines = (ROOT / "decoding" / "loop.py").read_text(encoding="utf-8").count("\n")
    assert lines <= LOOP_MAX_LINES


#: Module sizes (issue 61): a package module, a test file.
MODULE_MAX_LINES, TEST_FILE_MAX_LINES = 500, 800


def test_no_module_over_500_lines_and_no_test_file_over_800() -> None:
    """Every package module holds at most ``MODULE_MAX_LINES`` lines and every test file at
    most ``TEST_FILE_MAX_LINES``: a concern that outgrows its file is split by concern."""
    def over(root: Path, cap: int) -> dict[str, int]:
        sizes = {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8").count("\n")
                 for p in sorted(root.rglob("*.py"))}
        return {name: n for name, n in sizes.items() if n > cap}

    assert over(ROOT, MODULE_MAX_LINES) == {}
    assert over(ROOT.parent / "tests", TEST_FILE_MAX_LINES) == {}


def test_target_needs_no_type_ignores() -> None:
    """The target's passes are typed through the port: no ``type: ignore`` is left."""
    assert "type: ignore" not in (ROOT / "decoding" / "target.py").read_text(encoding="utf-8")
