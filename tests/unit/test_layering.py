"""Imports go one way (docs/design.md §5), read from the source, so an arrow back up fails here
rather than in a review: the simulator never reaches into bench/, nothing imports flows/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("scheduler", "warehouse", "serving", "simulator", "pipelines", "bench", "flows")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "scheduler": (),
    "warehouse": ("scheduler.run_schemas",),
    "serving": ("scheduler",),
    "serving/engine_site": ("scheduler",),  # loaded inside the engine: no other serving module
    "simulator": ("scheduler",),
    "pipelines": ("scheduler", "serving", "warehouse"),
    "bench": ("scheduler", "serving", "simulator", "pipelines", "warehouse"),
}
"""Besides itself, what each layer may import of ours; `flows` may import everything."""


def ours_imported(path: Path) -> set[str]:
    """Modules of ours that `path` imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return {m for m in found if m.split(".")[0] in OURS}


def allowed(layer: str, module: str) -> bool:
    own = layer.replace("/", ".")
    grants = (own, *MAY_IMPORT[layer])
    return any(module == g or module.startswith(f"{g}.") for g in grants)


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_each_layer_imports_only_what_is_below_it(layer: str) -> None:
    folder = ROOT / layer
    nested = [ROOT / other for other in MAY_IMPORT if other.startswith(f"{layer}/")]
    wrong = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted(folder.rglob("*.py"))
        if not any(path.is_relative_to(n) for n in nested)
        for module in sorted(ours_imported(path))
        if not allowed(layer, module)
    ]
    assert not wrong, "; ".join(wrong)


def test_the_check_sees_a_wrong_arrow(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from bench.sim_run import run_simulation\nimport os\n")
    assert ours_imported(source) == {"bench.sim_run"}
    assert not allowed("simulator", "bench.sim_run")
    assert allowed("warehouse", "scheduler.run_schemas") and not allowed("warehouse", "scheduler")
