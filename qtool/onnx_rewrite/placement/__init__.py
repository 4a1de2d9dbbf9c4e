"""Where quantizers go: the placement rules as a plan.

- ``plan``: the plan (points, left-in-float reasons) and what rules share;
- ``tf``: TensorFlow's rules (spec/rewrites.md section 2), in TF's order;
- ``integer``: the rules that make every layer run in integers in onnxruntime
  (section 2b), after TF's.

:func:`plan_quantization` runs them all on a graph whose batch norms are
folded; it is pure (edits nothing).
"""

from __future__ import annotations

import dataclasses
import difflib

import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.errors import QtoolError
from qtool.onnx_rewrite.placement.integer import INTEGER_RULES
from qtool.onnx_rewrite.placement.normalisers import shared_normaliser_layers
from qtool.onnx_rewrite.placement.peaks import peak_picked_layers
from qtool.onnx_rewrite.placement.plan import (
    ActivationPoint,
    LeftInFloat,
    PlacementRule,
    PlanContext,
    QuantPlan,
    RecurrentPoint,
    WeightPoint,
)
from qtool.onnx_rewrite.placement.tf import TF_RULES

RULES: tuple[PlacementRule, ...] = TF_RULES + INTEGER_RULES

__all__ = ["RULES", "ActivationPoint", "LeftInFloat", "PlacementRule", "PlanContext", "QuantPlan", "RecurrentPoint",
           "WeightPoint",
           "check_exclude", "plan_quantization"]


def check_exclude(graph: ir.Graph, exclude, scope: str | None = None) -> None:
    """Every ``--exclude`` name must be a node of the model, and ``--scope`` must match one (a typo
    would silently quantize everything, or nothing)."""
    names = [n.name for n in graph.all_nodes() if n.name]
    unknown = sorted(set(exclude or ()) - set(names))
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=3)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise QtoolError(f"--exclude: no node named {', '.join(repr(u) for u in unknown)} in the model{hint}")
    if scope and not any(name.startswith(scope) for name in names):
        parts = [name.split("/") for name in names]
        prefixes = sorted({name[: len(scope)] for name in names} | {"/".join(p[:k]) for p in parts
                                                                      for k in range(1, len(p) + 1)})
        close = difflib.get_close_matches(scope, prefixes, n=3, cutoff=0.4)
        hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
        raise QtoolError(f"--scope {scope!r} matches no node name{hint}")


def plan_quantization(graph: ir.Graph, config: QuantConfig, rules: tuple[PlacementRule, ...] = RULES) -> QuantPlan:
    """The placement rules on ``graph`` (batch norms folded first). Pure: edits nothing. The layers in-graph
    peak picking reads (:mod:`~qtool.onnx_rewrite.placement.peaks`) and the MatMuls that write a quotient's
    numerators and denominator in one tensor (:mod:`~qtool.onnx_rewrite.placement.normalisers`) are out of scope."""
    picked = frozenset(n.name for n in peak_picked_layers(graph) if n.name) - config.exclude
    if picked:
        config = dataclasses.replace(config, peak_picked=picked)
    shared = frozenset(n.name for n in shared_normaliser_layers(graph) if n.name) - config.exclude
    if shared:
        config = dataclasses.replace(config, shared_normaliser=shared)
    ctx = PlanContext(graph, config)
    for rule in rules:
        rule.run(ctx)
    return ctx.finish()
