"""Fold a constant ``Mul`` / ``Add`` that follows a layer into its weight and bias (a departure from TF,
which has no such pass: docs/spec-changes.md; onnxruntime's float optimizer does the same with its
ConvMulFusion and ConvAddFusion, which a QDQ model hides from it: the weight is a DequantizeLinear output).

For ``y = (layer(x, w) + b) * s + c`` with ``s`` and ``c`` one value per output channel (a scalar,
``[C, 1, 1]`` or ``[1, C, 1, 1]`` after a Conv; a scalar or ``[N]`` after a Gemm or MatMul; ``x - c`` is
``x + (-c)``)::

    w' = w * s                                # along the output-channel axis
    b' = b * s + c

so ``y = layer(x, w') + b'``, exact up to float32 rounding (float64 arithmetic rounded once, as the
batch-norm fold). Exporters write this for a learnable affine block (PaddlePaddle's PP-LCNetV3 puts
one after every conv) and for a scale or shift they could not fold themselves; left in place, the
eval graph would run it in float between a DequantizeLinear and a QuantizeLinear.

The rule matches ``layer -> [Transpose] -> [Squeeze] -> [Mul] -> [Add | Sub]`` where each intermediate tensor has
no other consumer and is not a graph output, and reads it directly (not through a quantizer). Through a Transpose
and a Squeeze (of other axes than the channels) the channels are on the axis they move them to: a model converted
from TensorFlow or Caffe computes its convs in NCHW between Transposes and adds their bias and batch norm in NHWC,
``[1, 1, 1, C]`` (Open-NSFW), and madmom's converter takes the batch axis off first (``[T, F, C]``, its key CNN's
batch norms ``Mul -> Add`` by ``[C]``). The Transpose and Squeeze stay, after the folded layer, and the last of them
takes the name of the last folded node's output. A Conv without a bias gets
one. After a MatMul (no bias input) only the ``Mul`` folds: the ``Add`` is its bias Add, which the
placement rules already handle. A weight shared with other nodes is not modified: the folded layer
gets its own copy. The folded layer's output takes the name of the last folded node's output, so
the tensors after it keep their names (and ranges). Runs before batch-norm folding, in both the eval
and the training rewrite, so that a training graph trains the folded weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qtool.model.constants import (constant_array, constant_source, not_constant_reason, remove_if_unused,
                                   squeezed_axes)
from qtool.model.graph import take_over
from qtool.model.layers import check_layer, float_attr, layer_bias, output_channels, weight_is_quantized
from qtool.model.names import NameScope, context_of
from qtool.onnx_rewrite.fold_batch_norms import channel_vector, fold_weight, new_initializer, output_rank
from qtool.onnx_rewrite.matcher import GraphView, Match, other_input
from qtool.onnx_rewrite.patterns import AFFINE_FOLD
from qtool.onnx_rewrite.placement.plan import LeftInFloat


@dataclass
class AffineFold:
    layer: str
    op_type: str
    mul: str | None
    add: str | None
    output: str | None  # the tensor the layer now computes (the last folded node's output)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "op": self.op_type, "mul": self.mul, "add": self.add, "output": self.output}


@dataclass
class AffineReport:
    folded: list[AffineFold]
    skipped: list[LeftInFloat]


MOVES = ("Transpose", "Squeeze")  # between the layer and its Mul/Add: they move the channel axis


def _channel_axis(layer: ir.Node, rank: int) -> int:
    return 1 if layer.op_type in ("Conv", "ConvTranspose") else rank - 1


def _bias_vector(layer: ir.Node, b: np.ndarray, channels: int) -> np.ndarray | None:
    """The layer's bias as one float64 value per output channel (Gemm's ``C`` times ``beta``), or None."""
    if layer.op_type != "Gemm":
        return channel_vector(b, channels, 1, 0)
    vec = channel_vector(b, channels, 2, 1)
    return None if vec is None else vec * float_attr(layer, "beta", 1.0)


class FoldAffine:
    """Rule: fold a per-channel constant ``Mul`` and/or ``Add`` (``Sub``) into the layer before it."""

    name = "fold-affine"
    pattern = AFFINE_FOLD

    def __init__(self, graph: ir.Graph, names: NameScope, exclude=frozenset()):
        self.graph = graph
        self.view = GraphView(graph)
        self.names = names
        self.exclude = exclude

    def _rank(self, layer: ir.Node, w: np.ndarray) -> int:
        if layer.op_type == "MatMul":  # unknown: only a scalar or a [N] vector is known not to broadcast it
            return output_rank(layer, w, self.view) or 1
        return output_rank(layer, w, self.view)

    def check_layer(self, layer: ir.Node) -> str | None:
        """None when a Mul/Add after ``layer`` (a layer with a float constant weight) can be folded into it,
        else the reason it cannot."""
        w = constant_array(layer.inputs[1])
        if layer.op_type == "MatMul" and w.ndim != 2:
            return f"MatMul weight rank {w.ndim}: only [K, N] weights fold"
        bias = layer_bias(layer)
        if bias is not None:
            b = constant_array(bias)
            if b is None:
                return f"the layer bias is not a constant ({not_constant_reason(bias)})"
            if _bias_vector(layer, b, output_channels(layer, w)) is None:
                return f"the layer bias of shape {list(b.shape)} is not one value per output channel"
        return None

    def check_step(self, layer: ir.Node, node: ir.Node, value: ir.Value, axis: tuple[int, int]) -> str | None:
        """None when ``node`` (a Mul, Add or Sub reading ``value``, of rank and channel axis ``axis``) combines it
        with one constant per output channel of ``layer``, else the reason it does not."""
        if node.name in self.exclude:
            return "excluded (--exclude)"
        if value not in node.inputs:
            return f"it reads '{value.name}' through a quantizer"
        other = other_input(node, value, self.view)
        c = constant_array(other)
        if c is None:
            return f"its other input is not a constant ({not_constant_reason(other)})"
        w = constant_array(layer.inputs[1])
        if c.dtype != w.dtype:
            return f"its constant is {c.dtype}, the weight {w.dtype}"
        if not np.all(np.isfinite(c)):
            return "its constant is not finite"
        channels = output_channels(layer, w)
        if channel_vector(c, channels, *axis) is None:
            return (f"its constant of shape {list(c.shape)} is not one value per output channel of "
                    f"{layer.op_type} '{layer.name}' ({channels} channels)")
        return None

    def _moved_axis(self, layer: ir.Node, moves: list[ir.Node]) -> tuple[int, int] | str:
        """The rank of the tensor the Mul/Add read and its channel axis (where the Transpose / Squeeze ``moves``
        put them), or the reason they are not known."""
        rank = self._rank(layer, constant_array(layer.inputs[1]))
        axis = _channel_axis(layer, rank)
        for node in moves:
            if node.op_type == "Transpose":
                perm = node.attributes.get("perm")
                perm = list(perm.as_ints()) if perm is not None else list(range(rank - 1, -1, -1))
                if sorted(perm) != list(range(rank)):
                    return f"Transpose '{node.name}' has {len(perm)} axes, its input {rank}"
                axis = perm.index(axis)
                continue
            gone = squeezed_axes(node)
            gone = None if gone is None else {a % rank for a in gone}
            if gone is None or axis in gone:
                return f"Squeeze '{node.name}' may take the channel axis"
            rank, axis = rank - len(gone), axis - sum(a < axis for a in gone)
        return rank, axis

    def steps(self, match: Match) -> tuple[list[ir.Node], list[LeftInFloat]]:
        """The Mul/Add/Sub nodes of ``match`` that fold (a prefix of the chain, after the Transpose / Squeeze the
        match may start with, which come first in the list), and why the others do not."""
        layer, moves = match.nodes["layer"], [match.nodes[k] for k in ("transpose", "squeeze") if k in match.nodes]
        chain = [match.nodes[k] for k in ("mul", "add") if k in match.nodes]
        if layer.op_type == "MatMul":
            chain = [n for n in chain if n.op_type == "Mul"]  # its Add is the MatMul's bias Add
        if (not chain or check_layer(layer) is not None or weight_is_quantized(layer.inputs[1])
                or (moves and layer.op_type not in ("Conv", "ConvTranspose"))):
            return [], []  # not a layer with a float constant weight (a MatMul of two tensors): nothing to fold into
        reason = self.check_layer(layer)
        axis = self._moved_axis(layer, moves)
        if moves and (reason is not None or isinstance(axis, str)):  # through a Transpose / Squeeze, only what
            return [], []                                              # folds is this rule's business
        if reason is not None or isinstance(axis, str):
            return [], [LeftInFloat(chain[0].name, chain[0].op_type, reason or axis)]
        folding: list[ir.Node] = list(moves)
        value = folding[-1].outputs[0] if folding else layer.outputs[0]
        for node in chain:
            reason = self.check_step(layer, node, value, axis)
            if reason is not None:
                break
            folding.append(node)
            value = node.outputs[0]
        if moves and folding[-1] is moves[-1]:
            return [], []
        return folding, [LeftInFloat(node.name, node.op_type, reason)] if reason is not None else []

    def folded(self, layer: ir.Node, folding: list[ir.Node]) -> tuple[np.ndarray, np.ndarray | None, list[ir.Value]]:
        """The folded weight and bias (None: the layer keeps having none) and the folded constants."""
        w = constant_array(layer.inputs[1])
        channels = output_channels(layer, w)
        moves = [n for n in folding if n.op_type in MOVES]
        axis = self._moved_axis(layer, moves)
        s, c = np.ones(channels), np.zeros(channels)
        value, consts = (moves[-1] if moves else layer).outputs[0], []
        for node in (n for n in folding if n.op_type not in MOVES):
            const = other_input(node, value, self.view)
            consts.append(const)
            vec = channel_vector(constant_array(const), channels, *axis)
            if node.op_type == "Mul":
                s, c = s * vec, c * vec
            else:
                c = c + vec if node.op_type == "Add" else c - vec
            value = node.outputs[0]
        old_bias = layer_bias(layer)
        b = None
        if layer.op_type != "MatMul" and (old_bias is not None or any(n.op_type in ("Add", "Sub") for n in folding)):
            b = c if old_bias is None else _bias_vector(layer, constant_array(old_bias), channels) * s + c
            b = b.astype(w.dtype)
        return fold_weight(layer, w, s), b, consts

    def rewrite(self, layer: ir.Node, folding: list[ir.Node]) -> AffineFold:
        op = layer.op_type
        old_weight, old_bias = layer.inputs[1], layer_bias(layer)
        w, b, consts = self.folded(layer, folding)
        ctx = context_of(layer.name or op)
        layer.replace_input_with(1, new_initializer(self.graph, self.names, f"{ctx}/weights_affine", w))
        if b is not None:
            if len(layer.inputs) < 3:
                layer.resize_inputs(3)
            layer.replace_input_with(2, new_initializer(self.graph, self.names, f"{ctx}/bias_affine", b))
            if op == "Gemm":
                layer.attributes["beta"] = ir.AttrFloat32("beta", 1.0)

        # the layer's output (or the last Transpose / Squeeze's after it) is what the last folded node computed
        moves = [n for n in folding if n.op_type in MOVES]
        end = (moves[-1] if moves else layer).outputs[0]
        take_over(folding[-1].outputs[0], end)
        folding = folding[len(moves):]
        old_nodes: list[ir.Node] = list(folding)
        old_values: list[ir.Value] = []
        for v in (old_weight, old_bias, *consts):
            src = constant_source(v) if v is not None else None
            if src is not None:
                old_nodes.extend(src.nodes)
                old_values.append(src.root)
        remove_if_unused(self.graph, old_nodes, old_values)
        names = {n.op_type: n.name for n in folding}
        return AffineFold(layer.name, op, names.get("Mul"), names.get("Add", names.get("Sub")), end.name)


def fold_affine(graph: ir.Graph, names: NameScope | None = None, exclude=frozenset()) -> AffineReport:
    """Fold every constant per-channel Mul/Add that follows a layer into it; report the ones that
    follow a layer as a chain but cannot fold, with reasons. Nodes named in ``exclude`` stay."""
    names = names or NameScope(graph)
    rule = FoldAffine(graph, names, exclude)
    folded: list[AffineFold] = []
    skipped: list[LeftInFloat] = []
    for node in list(graph):
        if node.graph is not graph or node.domain != "" or node.op_type not in AFFINE_FOLD.start.op_types:
            continue
        # again until nothing follows: paddle2onnx writes PP-LCNetV3's conv bias as an Add and the learnable
        # affine block after it (layer -> Add -> Mul -> Add), two folds
        while (match := AFFINE_FOLD.match(node, rule.view)):
            folding, skips = rule.steps(match)
            skipped.extend(skips)
            if not folding:
                break
            folded.append(rule.rewrite(node, folding))
    return AffineReport(folded, skipped)
