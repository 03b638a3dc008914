"""The package's imports point one way: no module imports itself back through others, and the
layers keep their order (engine <- runs <- ui / cli; trace imports none of them).

The graph is read from the source (ast), not from an interpreter: it holds every import a module
makes, top-level and function-level (lazy) alike, and `if TYPE_CHECKING:` ones too. A circle
through a lazy or a type-only import is still a circle: the two modules are one concept split in
two, and which imports first decides what works (`python -c "import specdash.<module>"`).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def package_modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (its file, whether it is a package's __init__.py): the folder tree under
    specdash/ is the import tree."""
    modules = {}
    for path in (REPO / "specdash").rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The dotted names an import statement can bind, relative ones made absolute: for
    `from a import b`, `a.b` (b may be a submodule) and `a` (b may be an attribute)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line of the first such import}, over the package's own
    modules. `from a import b` is an edge to a.b when b is a module, else to a; importing a
    package is an edge to its __init__.py. The parent packages Python runs before a submodule
    are not edges: every submodule would otherwise import its package's __init__.py."""
    modules = package_modules()
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = imported_names(node, package)
            if isinstance(node, ast.ImportFrom):
                base, *members = names
                targets = [m for m in members if m in modules]
                if len(targets) < len(members):
                    targets.append(base)
            else:
                targets = names
            for target in targets:
                # `import a.b.c` of a non-module attribute path: its longest module prefix
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    edges = [
        f"  {a} -> {b} (line {line})"
        for a in component
        for b, line in sorted(graph[a].items())
        if b in component
    ]
    return "\n".join([" <-> ".join(component), *edges])


def test_the_graph_sees_every_kind_of_import():
    """The builder itself: lazy, TYPE_CHECKING-guarded, relative and `from pkg import submodule`
    imports are all edges."""
    graph = import_graph()
    assert {"specdash.kernels.triton.gemm", "specdash.runs.sglang.patches.registry"} <= set(graph)
    # function-level: SGLang's log is named lazily (the runner imports no SGLang code)
    assert "specdash.runs.sglang.process" in graph["specdash.runs.runner"]
    # TYPE_CHECKING-guarded
    assert "specdash.settings" in graph["specdash.controls"]
    # `from specdash.kernels import gemm_backends, cpu_gemm`: the submodules
    assert {"specdash.kernels.gemm_backends", "specdash.kernels.cpu_gemm"} <= set(
        graph["specdash.engine.cpu_draft"]
    )
    # `from specdash.runs.sglang.patches import telemetry`
    assert "specdash.runs.sglang.patches.telemetry" in graph["specdash.runs.sglang.process"]
    # `from specdash.errors import UsageError`: the module, not a submodule
    assert "specdash.errors" in graph["specdash.engine.model"]


def test_relative_imports_resolve():
    """The package has none today; the builder still reads them as Python would."""

    def names(source: str, package: str) -> list[str]:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ImportFrom)
        return imported_names(node, package)

    assert names("from . import x", "specdash.runs") == ["specdash.runs", "specdash.runs.x"]
    assert names("from .x import y", "specdash.runs") == ["specdash.runs.x", "specdash.runs.x.y"]
    assert names("from ..trace import jsonl", "specdash.runs") == [
        "specdash.trace",
        "specdash.trace.jsonl",
    ]


def test_cycles_are_found():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_package_import_graph_has_no_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(graph, c) for c in found)


PATCHES = "specdash.runs.sglang.patches"
LAYERS_BELOW = {
    # a layer -> the layers it must not import
    # the lists of names: what the command line reads for --help, without torch or SGLang
    "specdash.registry": ("trace", "kernels", "engine", "runs", "ui", "cli", "settings", "events"),
    "specdash.trace": ("engine", "runs", "ui", "cli", "kernels"),
    "specdash.kernels": ("engine", "runs", "ui", "cli"),
    "specdash.engine": ("runs", "ui", "cli"),
    # the patches run inside SGLang's processes: they read the kernels' tables, never a session
    PATCHES: ("engine", "runs", "ui", "cli"),
    "specdash.runs": ("ui", "cli"),
    "specdash.ui": ("cli",),
}


def layer_of(module: str) -> str | None:
    """The innermost layer holding a module (the patches, not runs, for a patch)."""
    held = [layer for layer in LAYERS_BELOW if _under(module, (layer,))]
    return max(held, key=len, default=None)


def test_layers_import_one_way():
    """kernels <- engine <- runs (the SGLang patches a floor of their own) <- ui <- cli; trace
    is used by all and imports none of them."""
    graph = import_graph()
    wrong = [
        f"{a} -> {b} (line {line})"
        for a, edges in graph.items()
        if (layer := layer_of(a))
        for b, line in edges.items()
        if not _under(b, (layer,))
        and _under(b, tuple(f"specdash.{f}" for f in LAYERS_BELOW[layer]))
    ]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_only_the_ui_imports_textual():
    """The core never imports Textual (nor textual-plotext): only specdash.ui does."""
    wrong = []
    for name, (path, _) in package_modules().items():
        if name == "specdash.ui" or name.startswith("specdash.ui."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                top = {n.split(".")[0] for n in names}
                if top & {"textual", "textual_plotext"}:
                    wrong.append(f"{name} (line {node.lineno})")
    assert not wrong, "Textual imported outside specdash.ui: " + ", ".join(wrong)


def _imports_of(prefix: str) -> list[tuple[str, str, int]]:
    """(module, module or top-level package it imports, line) for every module under `prefix`,
    third-party imports included (by their top-level name)."""
    found = []
    for name, (path, _) in package_modules().items():
        if name != prefix and not name.startswith(prefix + "."):
            continue
        package = name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in imported_names(node, package):
                    found.append((name, target, node.lineno))
    return found


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


BACKENDS = (
    "specdash.engine",
    "specdash.kernels",
    "specdash.runs.native",
    "specdash.runs.sglang",
    "sglang",
    "torch",
)
"""What runs one engine or another: the dashboard sees sessions only through events,
`specdash.runs.runner` (what a session loads, how its engine's failures reach it) and the GPU
sampler."""


def test_the_ui_imports_no_backend():
    wrong = [
        f"{a} -> {b} (line {n})" for a, b, n in _imports_of("specdash.ui") if _under(b, BACKENDS)
    ]
    assert not wrong, "the dashboard imports a backend:\n" + "\n".join(sorted(set(wrong)))


def test_kernels_import_nothing_from_the_engine():
    """The kernels are the engine's tools; the engine picks them, never the other way round."""
    engine = ("specdash.engine", "specdash.runs")
    wrong = [
        f"{a} -> {b} (line {n})" for a, b, n in _imports_of("specdash.kernels") if _under(b, engine)
    ]
    assert not wrong, "kernels import the engine:\n" + "\n".join(sorted(set(wrong)))


def test_the_engine_imports_no_sglang():
    """The native engine runs without SGLang installed; SGLang's side reads the engine's tables,
    not the other way round."""
    sglang = ("sglang", "specdash.runs")
    wrong = [
        f"{a} -> {b} (line {n})" for a, b, n in _imports_of("specdash.engine") if _under(b, sglang)
    ]
    assert not wrong, "the engine imports SGLang:\n" + "\n".join(sorted(set(wrong)))


def test_the_registries_import_only_the_standard_library():
    """`specdash.registry` names what lives elsewhere (as strings, imported on use): reading a
    list of names never imports torch, SGLang or the rest of specdash."""
    wrong = []
    for name, (path, _) in package_modules().items():
        if not _under(name, ("specdash.registry",)):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level:
                top = node.module or ""
            elif isinstance(node, ast.Import):
                top = node.names[0].name
            else:
                continue
            if top.split(".")[0] not in sys.stdlib_module_names and not _under(
                top, ("specdash.registry",)
            ):
                wrong.append(f"{name} -> {top} (line {node.lineno})")
    assert not wrong, "a registry imports more than names: " + ", ".join(wrong)
