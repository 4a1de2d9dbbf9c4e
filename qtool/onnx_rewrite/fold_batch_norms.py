"""Fold inference-mode BatchNormalization into the layer before it (spec section 3).

For ``y = BN(layer(x, w) + b)`` with moving statistics ``mean``, ``var``,
scale ``gamma``, shift ``beta`` and ``epsilon``::

    s  = gamma / sqrt(var + epsilon)          # one factor per output channel
    w' = w * s                                # along the output-channel axis
    b' = (b - mean) * s + beta

so ``y = layer(x, w') + b'``. The arithmetic runs in float64 and is cast to
the weight's type once (``float32=True``: in float32, operation by operation
as a qtool training graph computes its frozen fold, so that a trained graph
deploys with the weights and biases it was trained with, bit for bit), and
the results are new initializers (no arithmetic nodes are left in the
graph). A weight shared with other nodes is not
modified: the folded layer gets its own copy.

Layouts (see ``patterns``): Conv scales axis 0, Gemm ``transB=1`` axis 0,
ConvTranspose ``[Cin, Cout/g, ...]`` the (group, j) blocks of axis 1, Gemm
``transB=0`` and MatMul ``[K, N]`` axis 1. Gemm's ``alpha`` stays and its
``beta`` is folded into the new ``C``. A MatMul has no bias input: its bias
``Add`` is updated, or a new ``Add`` is inserted.

The rule matches ``layer -> [bias Add] -> BatchNormalization`` where each
intermediate tensor has no other consumer; ``check`` names the reason when a
match cannot be folded, for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from qtool.model.names import NameScope, context_of
from qtool.model.opset import inferred_ranks
from qtool.model.constants import (
    contiguous,
    constant_array,
    constant_source,
    not_constant_reason,
    remove_if_unused,
)
from qtool.onnx_rewrite.matcher import GraphView, Match, other_input
from qtool.model.layers import check_layer, float_attr, group_of, int_attr, output_channels, weight_is_quantized
from qtool.onnx_rewrite.patterns import BN_FOLD

if TYPE_CHECKING:
    from qtool.onnx_rewrite.fold_affine import AffineReport

_BN_INPUTS = ("scale", "B", "mean", "var")


@dataclass
class FoldRecord:
    batch_norm: str
    layer: str
    op_type: str
    bias_add: str | None = None
    output: str | None = None  # the batch norm's output tensor (gone after the fold)
    folded: str | None = None  # the tensor that now carries it (the layer's output, or a MatMul's bias Add)

    def to_dict(self) -> dict:
        d = {"batch_norm": self.batch_norm, "layer": self.layer, "op": self.op_type, "output": self.output,
             "folded_into": self.folded}
        if self.bias_add:
            d["bias_add"] = self.bias_add
        return d


@dataclass
class FoldSkip:
    node: str
    reason: str

    def to_dict(self) -> dict:
        return {"node": self.node, "op": "BatchNormalization", "reason": self.reason}


@dataclass
class FoldReport:
    folded: list[FoldRecord]
    skipped: list[FoldSkip]
    affine: AffineReport | None = None  # the constant Mul/Add folded before (fold_affine), when it ran
    weight_expressions: list[dict] = field(default_factory=list)  # weights computed from constants, folded
    transposed_convs: list[dict] = field(default_factory=list)  # ConvTransposes written as Conv + DepthToSpace
    global_pools: list[str] = field(default_factory=list)  # spatial ReduceMeans written as GlobalAveragePool
    neutral_ops: list[str] = field(default_factory=list)  # Mul by 1 / Add of 0 removed (noop_elimination)
    multipliers: list[str] = field(default_factory=list)  # depthwise Convs with a channel multiplier made plain
    transposes: list[str] = field(default_factory=list)  # Transpose pairs around an elementwise chain removed
    layer_norms: list[str] = field(default_factory=list)  # tf2onnx's written-out Keras LayerNorms made one op
    float16: int = 0  # float16 weights and Constant values made float32 (``model.float16``)


def output_rank(layer: ir.Node, w: np.ndarray, view: GraphView) -> int | None:
    if layer.op_type in ("Conv", "ConvTranspose"):
        return w.ndim
    if layer.op_type == "Gemm":
        return 2
    a = view.input(layer, 0)
    if a is None:
        return None
    if a.shape is not None:
        return len(a.shape)
    # no declared shape (exporters often write no value_info): ask onnx shape inference, once per graph
    ranks = getattr(view, "inferred_ranks", None)
    if ranks is None:
        if layer.graph is None:
            return None
        ranks = view.inferred_ranks = inferred_ranks(layer.graph)
    return ranks.get(a.name)


def channel_vector(c: np.ndarray, channels: int, rank: int, axis: int = 1) -> np.ndarray | None:
    """A constant combined with the layer output (channels on ``axis``) as one value per channel, or None
    when it is not one value per channel or broadcasting it would change the output's shape."""
    shape = [1] * rank
    shape[axis] = channels
    target = tuple(shape)
    if c.ndim > rank:
        return None
    try:
        if np.broadcast_shapes(c.shape, target) != target:
            return None
    except ValueError:
        return None
    return np.broadcast_to(c.astype(np.float64), target).reshape(channels)


def _scaled(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``w * s`` computed in float64 and rounded once to ``w``'s type, without a float64 copy of ``w``."""
    out = np.empty(np.broadcast_shapes(w.shape, s.shape), dtype=w.dtype)
    np.multiply(w, s, out=out, dtype=np.float64, casting="unsafe")
    return out


class FoldBatchNorm:
    """Rule: fold an inference BatchNormalization into the preceding layer op."""

    name = "fold-batch-norm"
    pattern = BN_FOLD

    def __init__(self, graph: ir.Graph, names: NameScope, float32: bool = False):
        self.graph = graph
        self.view = GraphView(graph)
        self.names = names
        self.float32 = float32

    def check(self, match: Match) -> str | None:
        """None when the match can be folded, else the reason it cannot."""
        layer, bn, bias_add = match.nodes["layer"], match.nodes["bn"], match.get("bias_add")
        reason = check_layer(layer)
        if reason is not None:
            return f"layer '{layer.name}': {reason}"
        weight = layer.inputs[1]
        if weight_is_quantized(weight):
            return f"layer '{layer.name}' already has quantized weights"
        if int_attr(bn, "training_mode", 0) == 1:
            return "it is in training mode (training_mode=1)"
        if int_attr(bn, "spatial", 1) == 0:
            return "spatial=0 (per-activation statistics) cannot be folded into a layer"
        for out in bn.outputs[1:]:
            if out.uses() or out.is_graph_output():
                return f"its running-statistics output '{out.name}' is used"
        if len(bn.inputs) < 5:
            return "it has fewer than 5 inputs"
        for label, value in zip(_BN_INPUTS, bn.inputs[1:5]):
            if constant_source(value) is None:
                return f"input {label} is not a constant ({not_constant_reason(value)})"
        w = constant_array(weight)
        channels = output_channels(layer, w)
        for label, value in zip(_BN_INPUTS, bn.inputs[1:5]):
            size = constant_array(value).size
            if size != channels:
                return f"its {label} has {size} channels, the layer '{layer.name}' produces {channels}"
        if layer.op_type == "MatMul":
            if w.ndim != 2:
                return f"MatMul weight rank {w.ndim}: only [K, N] weights fold"
            rank = output_rank(layer, w, self.view)
            if rank is None:
                return "the MatMul input rank is unknown (BatchNormalization normalizes axis 1)"
            if rank != 2:
                return f"the MatMul output has rank {rank}: BatchNormalization normalizes axis 1, not the MatMul's channels"
        if layer.op_type in ("Conv", "ConvTranspose") and len(layer.inputs) > 2 and layer.inputs[2] is not None:
            if constant_source(layer.inputs[2]) is None:
                return f"the layer bias is not a constant ({not_constant_reason(layer.inputs[2])})"
        if layer.op_type == "Gemm" and len(layer.inputs) > 2 and layer.inputs[2] is not None:
            c = constant_array(layer.inputs[2])
            if c is None:
                return f"Gemm input C is not a constant ({not_constant_reason(layer.inputs[2])})"
            if channel_vector(c, channels, 2) is None:
                return f"Gemm input C of shape {list(c.shape)} is not one value per output channel"
        if bias_add is not None:
            rank = output_rank(layer, w, self.view) or 2
            c = constant_array(other_input(bias_add, match_input(match), self.view))
            if c is None or channel_vector(c, channels, rank) is None:
                return f"the bias Add '{bias_add.name}' does not add one value per channel"
        return None

    def rewrite(self, match: Match) -> FoldRecord:
        layer, bn, bias_add = match.nodes["layer"], match.nodes["bn"], match.get("bias_add")
        graph = self.graph
        op = layer.op_type
        old_weight = layer.inputs[1]
        w = constant_array(old_weight)
        channels = output_channels(layer, w)
        rank = output_rank(layer, w, self.view) or 2
        ftype = np.float32 if self.float32 else np.float64
        gamma, beta, mean, var = (constant_array(v).astype(ftype).reshape(-1) for v in bn.inputs[1:5])
        eps = float_attr(bn, "epsilon", 1e-5)
        s = gamma / np.sqrt(var + ftype(np.float32(eps)))

        w_new = fold_weight(layer, w, s)

        # The bias before the batch norm: the layer's own, plus a bias Add's constant.
        b = None
        old_bias = None
        if op in ("Conv", "ConvTranspose", "Gemm") and len(layer.inputs) > 2 and layer.inputs[2] is not None:
            old_bias = layer.inputs[2]
            c = constant_array(old_bias)
            if op == "Gemm":
                c = channel_vector(c, channels, 2).astype(ftype)
                beta_attr = float_attr(layer, "beta", 1.0)
                if beta_attr != 1.0 or not self.float32:
                    c = c * ftype(beta_attr)
            b = c.astype(ftype).reshape(channels)
        add_const = None
        if bias_add is not None:
            add_const = other_input(bias_add, match_input(match), self.view)
            c = channel_vector(constant_array(add_const), channels, rank).astype(ftype)
            b = c if b is None else b + c
        # the training fold's float32 order: (b - mean) * s + beta, -mean without a bias
        b_new = ((-mean if b is None else b - mean) * s + beta).astype(ftype)

        ctx = context_of(layer.name or op)
        dtype = w.dtype
        new_w = self._initializer(f"{ctx}/weights_fold", w_new)
        new_b = self._initializer(f"{ctx}/bias_fold", b_new.astype(dtype).reshape(channels))

        old_nodes: list[ir.Node] = []
        old_values: list[ir.Value] = []
        for value in (old_weight, old_bias, *bn.inputs[1:5], add_const):
            if value is None:
                continue
            src = constant_source(value)
            if src is not None:
                old_nodes.extend(src.nodes)
                old_values.append(src.root)

        layer.replace_input_with(1, new_w)
        if op == "MatMul":
            if bias_add is not None:
                for i, v in enumerate(bias_add.inputs):
                    if v is add_const:
                        bias_add.replace_input_with(i, new_b)
                end = bias_add.outputs[0]
            else:
                add = ir.node("Add", [layer.outputs[0], new_b], name=self.names.node(f"{ctx}/add_fold"))
                add.outputs[0].name = self.names.value(f"{ctx}/add_fold")
                add.outputs[0].dtype = ir.DataType.from_numpy(np.dtype(dtype))
                graph.insert_after(layer, add)
                end = add.outputs[0]
        else:
            if len(layer.inputs) < 3:
                layer.resize_inputs(3)
            layer.replace_input_with(2, new_b)
            if op == "Gemm":
                layer.attributes["beta"] = ir.AttrFloat32("beta", 1.0)
            end = layer.outputs[0]

        bn_out = bn.outputs[0]
        bn_name = bn_out.name
        if bn_out.is_graph_output():  # keep the model's output name
            name = bn_out.name
            bn_out.name = None
            end.name = name
        bn_out.replace_all_uses_with(end, replace_graph_outputs=True)
        # the batch norm (and for Conv/Gemm the bias Add, now inside the layer's bias)
        # are no longer read; nor are the old constants unless something else reads them
        removable = [bn] + ([bias_add] if bias_add is not None and op != "MatMul" else []) + old_nodes
        remove_if_unused(graph, removable, old_values)
        return FoldRecord(bn.name, layer.name, op, bias_add.name if bias_add is not None else None,
                          bn_name, end.name)

    def _initializer(self, base: str, array: np.ndarray) -> ir.Value:
        return new_initializer(self.graph, self.names, base, array)


def new_initializer(graph: ir.Graph, names: NameScope, base: str, array: np.ndarray) -> ir.Value:
    """A new initializer holding ``array``, named uniquely after ``base``."""
    name = names.value(base)
    value = ir.Value(name=name, const_value=ir.Tensor(contiguous(array), name=name))
    graph.register_initializer(value)
    return value


def fold_weight(layer: ir.Node, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``w`` scaled by ``s`` (one factor per output channel) along the layer's channel layout."""
    op = layer.op_type
    if op == "Conv":
        return _scaled(w, s.reshape((-1,) + (1,) * (w.ndim - 1)))
    if op == "ConvTranspose":  # [Cin, Cout/g, k...]: block (group, j) scales by channel g*Cout/g + j
        g = group_of(layer)
        cin, cpg = w.shape[0], w.shape[1]
        k = w.shape[2:]
        blocks = w.reshape((g, cin // g, cpg) + k)
        return _scaled(blocks, s.reshape((g, 1, cpg) + (1,) * len(k))).reshape(w.shape)
    if op == "Gemm" and int_attr(layer, "transB", 0):
        return _scaled(w, s[:, None])
    return _scaled(w, s[None, :])  # Gemm transB=0, MatMul [K, N]


def match_input(match: Match) -> ir.Value:
    """The tensor the bias Add reads from the layer."""
    return match.nodes["layer"].outputs[0]


def fold_batch_norms(graph: ir.Graph, names: NameScope | None = None, exclude=frozenset(),
                     float32: bool = False) -> FoldReport:
    """Fold every foldable BatchNormalization; report the others with reasons.

    Batch norms named in ``exclude`` stay as they are. ``float32``: the training graph's arithmetic
    (for a graph that was trained with qtool's training fold), else float64 rounded once.
    """
    names = names or NameScope(graph)
    rule = FoldBatchNorm(graph, names, float32)
    folded: list[FoldRecord] = []
    reasons: dict[int, str] = {}
    for node in list(graph):
        if node.graph is not graph or node.domain != "" or node.op_type not in BN_FOLD.start.op_types:
            continue
        match = BN_FOLD.match(node, rule.view)
        if not match:
            bn = _bn_reached(node, rule.view)
            if bn is not None and id(bn) not in reasons:
                reasons[id(bn)] = match.failed
            continue
        reason = rule.check(match)
        if reason is None and match.nodes["bn"].name in exclude:
            reason = "excluded (--exclude)"
        if reason is not None:
            reasons[id(match.nodes["bn"])] = reason
            continue
        folded.append(rule.rewrite(match))
    skipped = []
    for node in graph:
        if node.domain == "" and node.op_type == "BatchNormalization":
            reason = reasons.get(id(node)) or _not_after_layer_reason(node, rule.view)
            skipped.append(FoldSkip(node.name, reason))
    return FoldReport(folded, skipped)


def _bn_reached(layer: ir.Node, view: GraphView) -> ir.Node | None:
    """A BatchNormalization right after the layer (or its bias Add), if any."""
    frontier = [layer.outputs[0]]
    for _ in range(2):
        nxt = []
        for value in frontier:
            for user in view.consumers(value):
                if user.domain == "" and user.op_type == "BatchNormalization":
                    return user
                if user.domain == "" and user.op_type == "Add":
                    nxt.append(user.outputs[0])
        frontier = nxt
    return None


def _not_after_layer_reason(bn: ir.Node, view: GraphView) -> str:
    x = view.input(bn, 0)
    producer = x.producer() if x is not None else None
    if producer is None:
        return f"its input '{x.name if x is not None else '?'}' is a graph input, not a layer output"
    return (
        f"its input comes from {producer.op_type} '{producer.name}', "
        "not from a Conv, ConvTranspose, Gemm or MatMul"
    )
