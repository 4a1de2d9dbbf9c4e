"""Declared patterns (spec/rewrites.md sections 2 and 3), matched by ``matcher``.

The layer ops and their weight layout are the layer table's
(:mod:`qtool.model.layers`); this module declares the chains the rules match.
"""

from __future__ import annotations

import onnx_ir as ir

from qtool.model.constants import clip_bounds
from qtool.model.layers import LAYER_OPS
from qtool.onnx_rewrite.matcher import (
    ChainPattern,
    GraphView,
    Step,
    with_constant_operand,
    with_variable_operand,
)

ACTIVATION_OPS = ("Relu", "Clip")
# Ops whose output lies on the grid of their (quantized) input: a quantizer
# after them with the input's parameters changes nothing (TF's converter
# propagates ranges through them; onnxruntime's QDQ fusion needs explicit Q/DQ).
RANGE_PRESERVING_OPS = ("Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool")


def _bn_where(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    if node.inputs[0] is not value and view.input(node, 0) is not value:
        return "reads the tensor as a statistic, not as X"
    return None


def keeps_positive(node: ir.Node) -> bool:
    """A Clip whose floor is above 0 (``Clip(x, 1e-10)`` before a Log, as torchaudio-style log-mel front ends
    write it): what it guarantees, a positive argument, no quantizer can keep, since every grid holds 0 (the
    values below half a step round to 0, and the Log's to -inf). It is no activation to fuse: it stays float
    and reads its input dequantized, its output unquantized."""
    bounds = clip_bounds(node) if node.domain == "" and node.op_type == "Clip" else None
    return bounds is not None and bounds[0] is not None and bounds[0] > 0


def fused_activation(node: ir.Node) -> bool:
    """``node`` is an activation onnxruntime fuses into the integer kernel before it (Relu, a Clip from 0)."""
    return node.domain == "" and node.op_type in ACTIVATION_OPS and not keeps_positive(node)


def _activation_where(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    if view.input(node, 0) is not value:
        return "reads the tensor as a bound, not as its input"
    if keeps_positive(node):
        return "a Clip with a floor above 0 (a Log's guard), not an activation"
    return None


# layer -> [bias Add] -> BatchNormalization  (spec section 3)
BN_FOLD = ChainPattern(
    Step("layer", LAYER_OPS),
    [
        Step("bias_add", ("Add",), optional=True, sole_consumer=True, where=with_constant_operand),
        Step("bn", ("BatchNormalization",), sole_consumer=True, where=_bn_where),
    ],
)

# layer -> [Transpose] -> [Squeeze] -> [Mul] -> [Add | Sub], each by a constant (fold_affine; before batch-norm folding)
def _shift_where(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    """An Add of a constant, or a constant subtracted from the tensor (``x - c``)."""
    reason = with_constant_operand(node, value, view)
    if reason is None and node.op_type == "Sub" and view.input(node, 0) is not value:
        return "it subtracts the tensor from a constant"
    return reason


AFFINE_FOLD = ChainPattern(
    Step("layer", LAYER_OPS),
    [
        Step("transpose", ("Transpose",), optional=True, sole_consumer=True),
        Step("squeeze", ("Squeeze",), optional=True, sole_consumer=True),
        Step("mul", ("Mul",), optional=True, sole_consumer=True, where=with_constant_operand),
        Step("add", ("Add", "Sub"), optional=True, sole_consumer=True, where=_shift_where),
    ],
)

# layer -> [bias Add] -> [bypass Add] -> [Relu | Clip] -> [post-activation bypass Add]
# (spec section 2; batch norms are folded before this is matched)
LAYER_CHAIN = ChainPattern(
    Step("layer", LAYER_OPS),
    [
        Step("bias_add", ("Add",), optional=True, sole_consumer=True, where=with_constant_operand),
        Step("bypass", ("Add",), optional=True, where=with_variable_operand),
        Step("activation", ACTIVATION_OPS, optional=True, where=_activation_where),
        Step("post_bypass", ("Add",), optional=True, where=with_variable_operand, requires="activation"),
    ],
)
