"""The layer table: for each layer op, where its weight is and how its channels are laid out.

Layer ops are Conv (depthwise and grouped included), ConvTranspose, Gemm and
MatMul. Every feature that touches a layer's weight or bias (BN folding,
per-channel ranges, bias quantization, the training fold, the report) asks
this table instead of re-deriving the layout:

============== =================== ============ ==========
op             weight layout       channel axis bias
============== =================== ============ ==========
Conv           [Cout, Cin/g, k...] 0            input 2, [Cout]
ConvTranspose  [Cin, Cout/g, k...] 1            input 2, [Cout]
Gemm transB=1  [N, K]              0            input 2 (C), [N] or broadcast
Gemm transB=0  [K, N]              1            input 2 (C), [N] or broadcast
MatMul         [..., K, N]         last         none (a following Add)
============== =================== ============ ==========

For a grouped ConvTranspose, output channel ``g * Cout/g + j`` uses the
weights ``w[g*Cin/g:(g+1)*Cin/g, j]``: axis 1 has only ``Cout/g`` entries,
each shared by the ``group`` output channels ``j, Cout/g + j, ...``. BN
folding scales each (group, j) block with its own output channel's factor;
per-channel ranges along axis 1 cover the ``group`` channels that share ``j``
(still exact quantization, only coarser than one range per output channel).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.model.codec import DEQUANTIZE
from qtool.model.constants import constant_array, constant_dtype, is_constant, not_constant_reason

LAYER_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}
ACTIVATION_INPUT = {"Conv": 0, "ConvTranspose": 0, "Gemm": 0, "MatMul": 0}
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}  # MatMul has none


def int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def float_attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_float()


def is_layer(node: ir.Node) -> bool:
    return node.domain == "" and node.op_type in LAYER_OPS


def group_of(node: ir.Node) -> int:
    return int_attr(node, "group", 1)


def layer_weight(node: ir.Node) -> ir.Value | None:
    index = WEIGHT_INPUT.get(node.op_type)
    if index is None or index >= len(node.inputs):
        return None
    return node.inputs[index]


def layer_input(node: ir.Node) -> ir.Value | None:
    index = ACTIVATION_INPUT.get(node.op_type)
    if index is None or index >= len(node.inputs):
        return None
    return node.inputs[index]


def layer_bias(node: ir.Node) -> ir.Value | None:
    index = BIAS_INPUT.get(node.op_type)
    if index is None or index >= len(node.inputs):
        return None
    return node.inputs[index]


def weight_rank(node: ir.Node) -> int | None:
    weight = layer_weight(node)
    if weight is None:
        return None
    if weight.const_value is not None:
        return len(weight.const_value.shape)
    if weight.shape is not None:
        return len(weight.shape)
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
        return 0 if int_attr(node, "transB", 0) else 1
    return rank - 1  # MatMul


def output_channels(node: ir.Node, w: np.ndarray) -> int:
    """Output channels of a layer from its weight (the axis BN folding scales)."""
    if node.op_type == "ConvTranspose":
        return w.shape[1] * group_of(node)
    return w.shape[output_channel_axis(node, w.ndim)]


def channel_shape(node: ir.Node, rank: int) -> list[int]:
    """Shape that broadcasts a per-output-channel vector against the weight (-1 on the channel axis)."""
    shape = [1] * rank
    shape[output_channel_axis(node, rank)] = -1
    return shape


def per_output_channel(node: ir.Node, values: np.ndarray, channels: int) -> np.ndarray | None:
    """A per-weight-channel vector (a scale per output-channel-axis entry) as one value per output
    channel: grouped ConvTranspose repeats its ``Cout/g`` entries ``group`` times. None if the
    sizes do not fit."""
    values = np.asarray(values).reshape(-1)
    if values.size == 1:
        return np.full(channels, values[0], dtype=values.dtype)
    if node.op_type == "ConvTranspose" and values.size * group_of(node) == channels:
        return np.tile(values, group_of(node))
    if values.size == channels:
        return values
    return None


def weight_is_quantized(weight: ir.Value) -> bool:
    """A stored weight: a DequantizeLinear of constant codes (not one of an activation's quantizer, such
    as an attention MatMul's quantized keys)."""
    producer = weight.producer()
    return (producer is not None and producer.domain == "" and producer.op_type == DEQUANTIZE
            and is_constant(producer.inputs[0]))


def check_layer(node: ir.Node) -> str | None:
    """Why ``node`` is not a layer op with a quantizable constant weight (None if it is)."""
    if not is_layer(node):
        return f"{node.op_type} is not a layer op"
    weight = layer_weight(node)
    if weight is None:
        return "it has no weight input"
    if weight_is_quantized(weight):
        return None  # already rewritten: still a layer (its chain is matched again)
    if not is_constant(weight):
        what = {"Gemm": "input B", "Conv": "the weight", "ConvTranspose": "the weight"}.get(node.op_type,
                                                                                         "the second input")
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
    if node.op_type == "Gemm" and int_attr(node, "transA", 0) not in (0, 1):
        return "transA is not 0 or 1"
    return None
