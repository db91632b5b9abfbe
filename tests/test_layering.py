"""The package's layers (README, "Package layers"): each subpackage imports only the layers above it, and no
module imports itself back through others.

Every ``import hetplan.X`` / ``from hetplan.X import ...`` in the source, at module level or inside functions, is
read with ``ast``; a package may use its own modules and those of lower rank, never a higher or equal other one.
The same imports, resolved to modules (``from hetplan.a import b`` is module ``hetplan.a.b`` when that is a
module, else ``hetplan.a``), form a graph that must have no cycle: a function-level import does not make a cycle
harmless, it only hides it from the interpreter.
"""

import ast
from pathlib import Path

import hetplan

#: Rank of each top-level module; the order of README's "Package layers".
LAYERS = {
    "errors": 0, "gcpause": 0, "units": 0, "inputs": 0.5, "hardware": 1, "model": 2, "degrees": 2.5, "plan": 3, "jobfile": 3,
    "plan_rules": 4, "profile": 4, "estimate": 5, "search": 6, "report": 6, "calibration": 6.5, "energy": 7,
    "serve": 8, "runtime": 9, "cli": 10,
}

ROOT = Path(hetplan.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The hetplan modules ``path`` imports (anywhere in it), resolved against ``modules``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module == "hetplan" or node.module.startswith("hetplan.")):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hetplan."))
    return out


def _graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imported_modules(p, modules) - {"hetplan"} for p in paths}


def _top(module: str) -> str:
    return module.split(".")[1]


def test_every_module_is_in_a_layer_and_imports_only_layers_above():
    seen, bad = set(), []
    for mod, imports in _graph().items():
        if mod == "hetplan":
            continue
        me = _top(mod)
        seen.add(me)
        assert me in LAYERS, f"{mod}: add {me!r} to the layers (README, tests/test_layering.py)"
        for other in {_top(i) for i in imports} - {me}:
            if LAYERS.get(other, 99) >= LAYERS[me]:
                bad.append(f"{mod} imports hetplan.{other}")
    assert not bad, "\n".join(sorted(bad))
    assert seen == set(LAYERS)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or of one module that imports itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_find_cycles_finds_a_cycle_and_only_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"c"}}) == [["c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    cycles = find_cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
