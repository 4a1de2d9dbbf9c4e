"""Depthwise convolutions widened to a multiple of 16 channels for onnxruntime's fast kernel.

onnxruntime's (1.32) fast depthwise QLinearConv (MLAS symmetric depthwise convolution,
``MlasConvSymPackWSize``) takes a depthwise Conv only when its channel count is a multiple of 16
on x86-64 (8 on ARM64); any other count runs the generic depthwise kernel, 2.3-2.5x slower per
layer although it has fewer channels (72 / 88 / 120 against 80 / 96 / 128 channels,
``benchmarks/zoo/FINDINGS.md`` section 10). MobileNetV3's expansions of 72, 88 and 120 channels are
such counts.

:func:`pad_depthwise_channels` widens, in the eval graph, every tensor that carries a depthwise
Conv's channels to the next multiple of 16: the group-1 Convs that write those tensors get zero
output channels (weight and int32 bias codes 0, scales repeated), the depthwise Conv zero channels,
the group-1 Convs that read them zero input channels; the ops in between (Q/DQ, Relu, Sigmoid,
HardSigmoid, Add/Mul of such tensors or of scalars, GlobalAveragePool: channel by channel) are
unchanged. Exact: the added channels hold finite values that every Conv reading them multiplies by
0. A component that reaches any other op (Reshape, Concat, a graph output, a per-channel constant,
a Conv whose channels do not match) is left as it is.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.model.constants import constant_array
from qtool.model.layers import group_of

DEPTHWISE_CHANNEL_ALIGN = 16  # MLAS GroupAlign on x86-64 (8 on ARM64: 16 fits both)
# channel by channel: each output channel reads only the same channel of its inputs
_CHANNELWISE = {"QuantizeLinear", "DequantizeLinear", "Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish",
                "LeakyRelu", "Tanh", "Add", "Mul", "GlobalAveragePool", "Identity"}


def _is_scalar(value: ir.Value | None) -> bool:
    """A one-element constant, or the DequantizeLinear of one (the integer HardSigmoid's shift)."""
    if value is None:
        return False
    producer = value.producer()
    if producer is not None and producer.op_type == "DequantizeLinear":
        return all(_is_scalar(v) for v in producer.inputs if v is not None)
    array = constant_array(value)
    return array is not None and array.size == 1


def _weight_dqs(conv: ir.Node) -> list[ir.Node] | None:
    """The DequantizeLinear nodes of a Conv's weight and bias (int8 weight of zero point 0), each read by
    this Conv alone; None when the Conv is not in that form."""
    dqs = []
    for value in conv.inputs[1:]:
        dq = value.producer() if value is not None else None
        if dq is None or dq.op_type != "DequantizeLinear" or len(value.uses()) != 1 or len(dq.inputs[0].uses()) != 1:
            return None
        if any(constant_array(v) is None for v in dq.inputs):
            return None
        dqs.append(dq)
    return dqs if dqs and symmetric_int8_codes(dqs[0]) is not None else None


def symmetric_int8_codes(dq: ir.Node) -> np.ndarray | None:
    """The constant codes a DequantizeLinear reads when they are int8 with zero point 0 (the weights
    onnxruntime's fast symmetric integer convolution takes), else None."""
    codes = constant_array(dq.inputs[0])
    zero = constant_array(dq.inputs[2]) if len(dq.inputs) > 2 else None
    if codes is None or codes.dtype != np.int8 or zero is None or np.any(zero != 0):
        return None
    return codes


class _Component:
    """The tensors that carry one depthwise Conv's ``channels``, and the Convs around them."""

    def __init__(self, channels: int):
        self.channels = channels
        self.values: dict[int, ir.Value] = {}
        self.writers: dict[int, ir.Node] = {}  # group-1 Convs writing channels (output channels)
        self.depthwise: dict[int, ir.Node] = {}
        self.readers: dict[int, ir.Node] = {}  # group-1 Convs reading channels (input channels)
        self.seen: set[int] = set()

    def _conv_channels(self, conv: ir.Node) -> tuple[int, int] | None:
        dqs = _weight_dqs(conv)
        if dqs is None:
            return None
        shape = constant_array(dqs[0].inputs[0]).shape
        return shape[0], shape[1] * group_of(conv)

    def _add_conv(self, node: ir.Node, queue: list, writes: bool) -> bool:
        shape = self._conv_channels(node)
        if shape is None:
            return False
        if group_of(node) == self.channels and shape == (self.channels, self.channels):
            if id(node) not in self.depthwise:
                self.depthwise[id(node)] = node
                queue += [node.inputs[0], node.outputs[0]]
            return True
        if group_of(node) != 1:
            return False
        mine, other, axis = (self.writers, self.readers, 0) if writes else (self.readers, self.writers, 1)
        if id(node) in other or shape[axis] != self.channels:
            return False  # a group-1 Conv both reading and writing the channels is left alone
        mine[id(node)] = node
        return True

    def _add_node(self, node: ir.Node, queue: list, writes: bool) -> bool:
        """``node`` writes (``writes``) or reads a tensor of the component."""
        if node.domain != "":
            return False
        if node.op_type == "Conv":
            return self._add_conv(node, queue, writes)
        if id(node) in self.seen:
            return True
        self.seen.add(id(node))
        if node.op_type not in _CHANNELWISE or len(node.outputs) != 1:
            return False
        if node.op_type in ("QuantizeLinear", "DequantizeLinear", "Clip"):
            if not all(_is_scalar(v) for v in node.inputs[1:] if v is not None):
                return False  # per-axis quantizers and tensor bounds carry no channels of their own
            queue += [node.inputs[0], node.outputs[0]]
            return True
        for v in node.inputs:
            if v is not None and not _is_scalar(v):
                queue.append(v)
        queue.append(node.outputs[0])
        return True

    def grow(self, start: ir.Node) -> bool:
        """Collect from ``start``; False when the component reaches an op it cannot widen."""
        queue: list[ir.Value] = []
        if not self._add_conv(start, queue, writes=True):
            return False
        while queue:
            value = queue.pop()
            if id(value) in self.values:
                continue
            if value.is_graph_output() or value.is_graph_input() or value.const_value is not None:
                return False
            self.values[id(value)] = value
            producer = value.producer()
            if producer is None or not self._add_node(producer, queue, writes=True):
                return False
            for node, index in value.uses():
                if (node.op_type == "Conv" and index != 0) or not self._add_node(node, queue, writes=False):
                    return False
        return True


def pad_axis(array: np.ndarray, axis: int, extra: int, edge: bool = False) -> np.ndarray:
    """``array`` with ``extra`` entries appended along ``axis``: zeros, or copies of the last (``edge``)."""
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, extra)
    return np.pad(array, widths, mode="edge" if edge else "constant")


def _set(value: ir.Value, array: np.ndarray) -> None:
    value.const_value = ir.Tensor(np.ascontiguousarray(array), name=value.name)


def _widen_outputs(conv: ir.Node, extra: int) -> None:
    """Zero output channels: weight and bias codes 0, per-channel scales repeated (zero points 0)."""
    for dq in _weight_dqs(conv):
        codes, scale = constant_array(dq.inputs[0]), constant_array(dq.inputs[1])
        _set(dq.inputs[0], pad_axis(codes, 0, extra))
        if scale.size > 1:
            _set(dq.inputs[1], pad_axis(scale, 0, extra, edge=True))
            _set(dq.inputs[2], pad_axis(constant_array(dq.inputs[2]), 0, extra))
        dq.outputs[0].shape = None


def widen_outputs(conv: ir.Node, extra: int) -> bool:
    """``extra`` zero output channels for a Conv whose weight (and bias) DequantizeLinear nodes are its own
    (int8 weight codes of zero point 0); False, unchanged, otherwise."""
    if _weight_dqs(conv) is None:
        return False
    _widen_outputs(conv, extra)
    return True


def _widen_inputs(conv: ir.Node, extra: int) -> None:
    dq = _weight_dqs(conv)[0]
    _set(dq.inputs[0], pad_axis(constant_array(dq.inputs[0]), 1, extra))
    dq.outputs[0].shape = None


def pad_depthwise_channels(graph: ir.Graph, align: int = DEPTHWISE_CHANNEL_ALIGN) -> list[dict]:
    """Widen each depthwise Conv whose channel count is not a multiple of ``align`` (module docstring);
    returns what was widened."""
    done = []
    for conv in list(graph):
        channels = group_of(conv)
        if conv.domain != "" or conv.op_type != "Conv" or channels <= 1 or channels % align == 0:
            continue
        component = _Component(channels)
        if not component.grow(conv) or not component.writers:
            continue
        extra = -channels % align
        for node in [*component.writers.values(), *component.depthwise.values()]:
            _widen_outputs(node, extra)
        for node in component.depthwise.values():
            node.attributes["group"] = ir.AttrInt64("group", channels + extra)
        for node in component.readers.values():
            _widen_inputs(node, extra)
        for value in component.values.values():
            value.shape = None
        done.append({"depthwise": [n.name for n in component.depthwise.values()], "channels": channels,
                     "padded_to": channels + extra, "writers": [n.name for n in component.writers.values()],
                     "readers": [n.name for n in component.readers.values()]})
    return done
