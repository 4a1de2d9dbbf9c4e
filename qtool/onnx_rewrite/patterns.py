"""Declared patterns (spec/rewrites.md sections 2 and 3), matched by ``matcher``.

Layer ops are Conv (depthwise and grouped included), ConvTranspose, Gemm and
MatMul with a constant weight. The weight's output-channel axis, used for
BN folding and per-channel ranges:

============== =================== ====
op             weight layout       axis
============== =================== ====
Conv           [Cout, Cin/g, k...] 0
ConvTranspose  [Cin, Cout/g, k...] 1
Gemm transB=1  [N, K]              0
Gemm transB=0  [K, N]              1
MatMul         [..., K, N]         last
============== =================== ====

For a grouped ConvTranspose, output channel ``g * Cout/g + j`` uses the
weights ``w[g*Cin/g:(g+1)*Cin/g, j]``: axis 1 has only ``Cout/g`` entries,
each shared by the ``group`` output channels ``j, Cout/g + j, ...``. BN
folding scales each (group, j) block with its own output channel's factor;
per-channel ranges along axis 1 cover the ``group`` channels that share ``j``
(still exact quantization, only coarser than one range per output channel).
"""

from __future__ import annotations

import onnx_ir as ir

from qtool.onnx_rewrite.constants import constant_dtype, is_constant, not_constant_reason
from qtool.onnx_rewrite.matcher import (
    DEQUANTIZE,
    ChainPattern,
    GraphView,
    Step,
    with_constant_operand,
    with_variable_operand,
)

LAYER_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
ACTIVATION_OPS = ("Relu", "Clip")
# Ops whose output lies on the grid of their (quantized) input: a quantizer
# after them with the input's parameters changes nothing (TF's converter
# propagates ranges through them; onnxruntime's QDQ fusion needs explicit Q/DQ).
RANGE_PRESERVING_OPS = ("Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool")
WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}
ACTIVATION_INPUT = {"Conv": 0, "ConvTranspose": 0, "Gemm": 0, "MatMul": 0}


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def group_of(node: ir.Node) -> int:
    return _int_attr(node, "group", 1)


def weight_rank(node: ir.Node) -> int | None:
    weight = node.inputs[WEIGHT_INPUT[node.op_type]]
    if weight is None:
        return None
    if weight.const_value is not None:
        return len(weight.const_value.shape)
    shape = weight.shape
    if shape is not None:
        return len(shape)
    from qtool.onnx_rewrite.constants import constant_array

    array = constant_array(weight)
    return None if array is None else array.ndim


def output_channel_axis(node: ir.Node, rank: int) -> int:
    """Axis of the layer's weight that indexes output channels (table above)."""
    op = node.op_type
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1
    if op == "Gemm":
        return 0 if _int_attr(node, "transB", 0) else 1
    return rank - 1  # MatMul


def layer_weight(node: ir.Node, view: GraphView) -> ir.Value | None:
    index = WEIGHT_INPUT.get(node.op_type)
    if index is None or index >= len(node.inputs):
        return None
    return node.inputs[index]


def weight_is_quantized(weight: ir.Value) -> bool:
    producer = weight.producer()
    return producer is not None and producer.domain == "" and producer.op_type == DEQUANTIZE


def check_layer(node: ir.Node, view: GraphView) -> str | None:
    """Why ``node`` is not a layer op with a quantizable constant weight (None if it is)."""
    if node.domain != "" or node.op_type not in LAYER_OPS:
        return f"{node.op_type} is not a layer op"
    weight = layer_weight(node, view)
    if weight is None:
        return "it has no weight input"
    if weight_is_quantized(weight):
        return None  # already rewritten: still a layer (its chain is matched again)
    if not is_constant(weight):
        what = "input B" if node.op_type == "Gemm" else "the second input"
        if node.op_type in ("Conv", "ConvTranspose"):
            what = "the weight"
        return f"{what} is not a constant ({not_constant_reason(weight)})"
    dtype = constant_dtype(weight)
    if dtype != ir.DataType.FLOAT:
        return f"weight type is {dtype.name if dtype is not None else 'unknown'}; only float32 is quantized"
    rank = weight_rank(node)
    if node.op_type in ("Conv", "ConvTranspose") and (rank is None or rank < 3):
        return f"weight rank {rank} is not a convolution kernel"
    if node.op_type == "Gemm" and rank != 2:
        return f"weight rank {rank} is not 2"
    if node.op_type == "MatMul" and (rank is None or rank < 2):
        return "weight is a vector (rank 1)"
    if node.op_type == "Gemm" and _int_attr(node, "transA", 0) not in (0, 1):
        return "transA is not 0 or 1"
    return None


def _bn_where(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    if node.inputs[0] is not value and view.input(node, 0) is not value:
        return "reads the tensor as a statistic, not as X"
    return None


def _activation_where(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    if view.input(node, 0) is not value:
        return "reads the tensor as a bound, not as its input"
    return None


# layer -> [bias Add] -> BatchNormalization  (spec section 3)
BN_FOLD = ChainPattern(
    Step("layer", LAYER_OPS),
    [
        Step("bias_add", ("Add",), optional=True, sole_consumer=True, where=with_constant_operand),
        Step("bn", ("BatchNormalization",), sole_consumer=True, where=_bn_where),
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
