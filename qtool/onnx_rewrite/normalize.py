"""The normalisation both rewrites start with, in one list: ``rewrite-eval`` (``eval_rewrite.fold_and_plan``) and
``rewrite-train`` (``train_rewrite.prepare_train``) plan on the same graph, so the two cannot drift apart.

In order: name the unnamed nodes; a float16 body with float32 edges becomes float32 again (its Casts
Identities); float-to-float Casts of one type (Open-NSFW's, around nearly every op) and Identities
(paddle2onnx's, between every two ops) go; with ``read_back_prelus`` (the eval rewrite), the PRelus qtool wrote
as sums become PRelus again (qtool's own output rewritten again); ``--exclude``/``--scope`` names are checked;
constant expressions that compute a weight are folded into it. What follows differs (the eval rewrite folds
for deployment; the training rewrite keeps its batch norms to fold them for training).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.model.float16 import float16_as_float32, same_type_casts_as_identities
from qtool.model.graph import remove_identities
from qtool.model.names import name_unnamed_nodes
from qtool.model.opset import default_opset
from qtool.model.weight_expressions import fold_weight_expressions
from qtool.onnx_rewrite.kernel_forms import prelus_from_sums
from qtool.onnx_rewrite.placement import check_exclude


@dataclass(frozen=True)
class Normalized:
    """What the normalisation did, for the fold report (``FoldReport.float16``, ``.weight_expressions``)."""

    float16: int  # float16 weights and Constant values made float32
    weight_expressions: list[dict]  # weights computed from constants, folded


def normalize(model: ir.Model, config: QuantConfig, *, read_back_prelus: bool) -> Normalized:
    """The steps of the module docstring on ``model``, in place."""
    graph = model.graph
    name_unnamed_nodes(graph)
    float16 = float16_as_float32(model)
    same_type_casts_as_identities(graph)
    remove_identities(graph)
    if read_back_prelus:
        prelus_from_sums(graph)
    check_exclude(graph, config.exclude, config.scope)
    expressions = fold_weight_expressions(graph, default_opset(model), config.out_of_scope)
    return Normalized(float16, expressions)
