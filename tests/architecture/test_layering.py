"""The import graph follows DESIGN.md's layout: arrows point one way, down.

cli -> api -> {simulate, finetune} -> {onnx_rewrite, calibrate} -> data -> model -> config -> kernels.
onnx_rewrite and calibrate never import each other; nothing but cli (and the package's
lazy names) imports api; imports of qtool modules are at module top, except a few lazy
ones for optional heavy engines, each listed here with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "qtool"

# the layer of each top-level part of the package (a module may import its own layer and below)
LAYERS = {
    "errors": 0,
    "kernels": 1,
    "config": 2,
    "model": 3,
    "data": 4,
    "calibrate": 5,
    "onnx_rewrite": 5,
    "simulate": 6,
    "finetune": 6,
    "api": 7,
    "cli": 8,
    "__init__": 9,
    "__main__": 9,
}
# siblings that must not import each other
SEPARATE = {frozenset({"calibrate", "onnx_rewrite"}), frozenset({"simulate", "finetune"})}
# simulate and finetune may read graphs with onnx_rewrite's pure transformations (BN folding, the
# training contract), but what runs data through a rewrite (calibration) is handed to them by api
FEATURES = {"calibrate"}

# function-local imports of qtool modules that are allowed: file -> (modules, why)
LAZY_ALLOWED = {
    "kernels/api.py": ({"qtool.kernels", "qtool.kernels.cuda"},
                       "numba-cuda: the CUDA kernels load only when a GPU array is given"),
    "api.py": ({"qtool.finetune", "qtool.finetune.train"},
               "jax: the fine-tuning engine loads only for `qtool finetune` (the train extra)"),
}


def part_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py") if rel.parts else "__init__"


def qtool_imports(path: Path):
    """(module imported, line, is_function_local) for every import of a qtool module."""
    tree = ast.parse(path.read_text())
    local = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == "qtool" or name.startswith("qtool."):
                yield name, node.lineno, id(node) in local


def target_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


SOURCES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    here = part_of(path)
    for module, line, _ in qtool_imports(path):
        there = target_part(module)
        if there is None or there == here:
            continue
        where = f"{path.relative_to(ROOT)}:{line} imports {module}"
        assert frozenset({here, there}) not in SEPARATE, f"{where}: {here} and {there} never import each other"
        if here in ("simulate", "finetune"):
            assert there not in FEATURES, f"{where}: {here} gets other features' work from qtool.api"
        if here != "__init__":
            assert LAYERS[there] < LAYERS[here], f"{where}: an arrow upwards ({here} -> {there})"


def test_function_local_imports_are_the_listed_heavy_engines():
    unexpected = {}
    for path in SOURCES:
        rel = str(path.relative_to(ROOT))
        allowed = LAZY_ALLOWED.get(rel, (set(), ""))[0]
        for module, line, is_local in qtool_imports(path):
            if is_local and module not in allowed:
                unexpected[f"{rel}:{line}"] = module
    assert not unexpected, f"function-local imports of qtool modules: {unexpected}"


def test_no_module_stubs_or_callable_modules():
    for path in SOURCES:
        text = path.read_text()
        assert "sys.modules[" not in text, f"{path}: installs a module in sys.modules"
        assert "ModuleType" not in text, f"{path}: a module subclass (callable package?)"


def test_layer_test_knows_every_part():
    parts = {part_of(p) for p in SOURCES}
    assert parts <= set(LAYERS), f"add these to LAYERS: {parts - set(LAYERS)}"
