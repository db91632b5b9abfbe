"""The package's layers (README, "Package layers"): each subpackage imports only the layers above it.

Every ``import hetplan.X`` / ``from hetplan.X import ...`` in the source, at module level or inside functions, is
read with ``ast``; a package may use its own modules and those of lower rank, never a higher or equal other one.
"""

import ast
from pathlib import Path

import hetplan

#: Rank of each top-level module; the order of README's "Package layers".
LAYERS = {
    "errors": 0, "hardware": 1, "model": 2, "plan": 3, "jobfile": 3, "plan_rules": 4, "profile": 4, "estimate": 5,
    "search": 6, "report": 6, "calibration": 6, "energy": 7, "serve": 8, "runtime": 9, "cli": 10,
}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hetplan."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "hetplan":
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("hetplan."))
    return out


def test_every_module_is_in_a_layer_and_imports_only_layers_above():
    root = Path(hetplan.__file__).parent
    seen, bad = set(), []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts == ("__init__.py",):
            continue
        me = rel.parts[0].removesuffix(".py")
        seen.add(me)
        assert me in LAYERS, f"{rel}: add {me!r} to the layers (README, tests/test_layering.py)"
        for other in _imports(path) - {me}:
            if LAYERS.get(other, 99) >= LAYERS[me]:
                bad.append(f"{rel} imports hetplan.{other}")
    assert not bad, "\n".join(bad)
    assert seen == set(LAYERS)
