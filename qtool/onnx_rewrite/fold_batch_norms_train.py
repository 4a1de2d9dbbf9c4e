"""Fold BatchNormalization for training (spec/rewrites.md section 3, TF's Jacob et al. scheme).

For ``y = BN(layer(x, w) + b)`` with scale ``gamma``, shift ``beta``, moving
statistics ``mu_mv``, ``var_mv`` (state) and ``sigma = sqrt(var + eps)``,
the training graph computes, every step (all float32, in graph ops)::

    raw          = layer(x, w)                      # the unfolded layer, no bias
    mu_b, var_b  = mean, population variance of raw over all axes but channels
    w_fold       = w * gamma / sigma_mv             # what the weight quantizer sees
    out          = layer(x, fq(w_fold)) * correction_recip + bias
    bias         = beta - mu_b * gamma / sigma_b
    before freeze_bn_delay:  correction_recip = sigma_mv / sigma_b
    after:                   correction_recip = 1, bias = (b - mu_mv) * (gamma / sigma_mv) + beta
    mu_mv'  = momentum * mu_mv  + (1 - momentum) * (mu_b + b)      (frozen after the delay)
    var_mv' = momentum * var_mv + (1 - momentum) * var_b

where ``m_mv = mu_mv - b``: the batch statistics are those of the layer
without its bias (a bias before a batch norm shifts the mean only), so the
moving mean, which includes ``b``, is compared with ``mu_b`` after removing
it. This is TF's graph (``fold_batch_norms._FoldFusedBatchNorms`` and
``_ComputeBatchNormCorrections``, whose layers carry no bias); with ``b = 0``
it is the same formula. After the freeze the output is
``layer(x, fq(w_fold)) + (b - mu_mv) * (gamma / sigma_mv) + beta``: the eval
fold, and computed as the eval fold of a training graph computes it (float32,
same operations in the same order), so the deployed weights and biases are
bit for bit what the training graph quantizes. TF writes the frozen bias as
``gamma * (mu_b / sigma_b - m_mv / sigma_mv) + beta - mu_b * gamma /
sigma_b``: the same value and gradients in exact arithmetic, but in float32
it depends on the batch (its rounding error does), and a bias that differs
from the deployed one in its last bits can round to another int32 step. ``TrainFold.bias`` is the
``[C]`` bias vector the fold adds (where the training rewrite puts the
deployed bias rounding, ``qtool::FakeQuantBias``). The unfolded layer is
computed twice, as in TF: once for the batch statistics with the float
weight, once with the quantized folded weight.

The rule matches what the eval fold matches (``patterns.BN_FOLD``) and uses
its checks (:meth:`FoldBatchNorm.check`), so both graphs fold the same batch
norms. Grouped ConvTranspose is left to the eval fold only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.model.names import NameScope, context_of
from qtool.onnx_rewrite._train_ops import Ops
from qtool.model.constants import constant_array, constant_source, remove_if_unused
from qtool.onnx_rewrite.fold_batch_norms import FoldBatchNorm, match_input
from qtool.onnx_rewrite.matcher import GraphView, Match, other_input
from qtool.model.layers import channel_shape, float_attr, group_of, output_channels
from qtool.onnx_rewrite.patterns import BN_FOLD


@dataclass
class TrainFold:
    """One folded batch norm: what the encoder and the contract need."""

    batch_norm: str
    layer: ir.Node
    output: str  # the batch norm's output name, now carried by the fold's result
    prefix: str
    state: dict[str, str] = field(default_factory=dict)  # role -> state initializer name
    record: dict = field(default_factory=dict)  # for metadata: how to restore the float graph
    updates: dict[str, ir.Value] = field(default_factory=dict)  # state name -> its updated value
    bias: ir.Value | None = None  # the [C] bias vector added after the layer (read by one Reshape)


def train_fold_reason(match: Match, rule: FoldBatchNorm) -> str | None:
    """None when the match folds for training (the eval checks, plus grouped ConvTranspose)."""
    reason = rule.check(match)
    if reason is not None:
        return reason
    layer = match.nodes["layer"]
    if layer.op_type == "ConvTranspose" and group_of(layer) != 1:
        return "grouped ConvTranspose: the training fold is not supported (the eval fold is)"
    return None


def find_train_folds(graph: ir.Graph, names: NameScope, exclude=frozenset()):
    """``(matches that fold, {batch norm name: reason})`` without editing the graph."""
    rule = FoldBatchNorm(graph, names)
    folds: list[Match] = []
    reasons: dict[str, str] = {}
    for node in list(graph):
        if node.domain != "" or node.op_type not in BN_FOLD.start.op_types:
            continue
        match = BN_FOLD.match(node, rule.view)
        if not match:
            continue
        reason = train_fold_reason(match, rule)
        bn = match.nodes["bn"]
        if reason is None and bn.name in exclude:
            reason = "excluded (--exclude)"
        if reason is not None:
            reasons[bn.name] = reason
            continue
        folds.append(match)
    return folds, reasons


@dataclass
class _Fold:
    """One training fold in progress: the matched nodes and the layer's layout."""

    layer: ir.Node
    bn: ir.Node
    bias_add: ir.Node | None
    prefix: str
    w: np.ndarray  # the layer's float weight

    @property
    def channels(self) -> int:
        return output_channels(self.layer, self.w)

    @property
    def rank(self) -> int:
        return self.w.ndim if self.layer.op_type in ("Conv", "ConvTranspose") else 2

    @property
    def eps(self) -> np.float32:
        return np.float32(float_attr(self.bn, "epsilon", 1e-5))

    @property
    def momentum(self) -> float:
        return float_attr(self.bn, "momentum", 0.9)


class TrainFolder:
    def __init__(self, graph: ir.Graph, ops: Ops, step_ge_freeze: ir.Value | None):
        self.graph = graph
        self.ops = ops
        self.view = GraphView(graph)
        self.frozen = step_ge_freeze

    def _bias_vector(self, value: ir.Value, channels: int, rank: int, base: str) -> ir.Value:
        """A bias tensor (broadcastable against the output) as a [C] vector, in graph ops."""
        ops = self.ops
        target = ops.const(f"{base}/target_shape", np.asarray([1, channels] + [1] * (rank - 2), np.int64), np.int64)
        expanded = ops.op("Expand", [value, target], f"{base}/expand")
        return ops.reshape(expanded, [channels], f"{base}/vector")

    def fold(self, match: Match, params: set[str]) -> TrainFold:
        """Replace ``layer -> [bias Add] -> BatchNormalization`` by TF's training fold."""
        layer, bn = match.nodes["layer"], match.nodes["bn"]
        ctx = context_of(layer.name or layer.op_type)
        f = _Fold(layer, bn, match.get("bias_add"), self.ops.names.prefix(f"{ctx}/BatchNorm_Fold"),
                  constant_array(layer.inputs[1]))
        record = self._record(f)
        mu_b, var_b = self._batch_statistics(f)
        gamma, beta = bn.inputs[1:3]
        params.update((gamma.name, beta.name))
        ops, c = self.ops, f.channels
        mean_mv = ops.state(f"{ctx}/BatchNorm/moving_mean", constant_array(bn.inputs[3]).reshape(c))
        var_mv = ops.state(f"{ctx}/BatchNorm/moving_variance", constant_array(bn.inputs[4]).reshape(c))
        b_vec = self._bias(f, match, params)
        result, bias = self._fold(f, mu_b, var_b, mean_mv, var_mv, b_vec)
        new_mean, new_var = self._moving_statistics(f, mu_b, var_b, mean_mv, var_mv, b_vec)
        self._replace_batch_norm(f, result)
        record.update(moving_mean=mean_mv.name, moving_variance=var_mv.name)
        return TrainFold(
            bn.name, layer, record["output"], f.prefix,
            state={"moving_mean": mean_mv.name, "moving_variance": var_mv.name},
            record=record,
            updates={mean_mv.name: new_mean, var_mv.name: new_var},
            bias=bias,
        )

    def _record(self, f: _Fold) -> dict:
        """How to restore the float graph (the contract's ``batch_norms`` entry), before any edit."""
        layer, bn, bias_add = f.layer, f.bn, f.bias_add
        return {
            "name": bn.name,
            "layer": layer.name,
            "op": layer.op_type,
            "prefix": f.prefix,
            "output": bn.outputs[0].name,
            "layer_inputs": [v.name if v is not None else "" for v in layer.inputs],
            "layer_output": layer.outputs[0].name,
            "gemm_beta": float_attr(layer, "beta", 1.0) if layer.op_type == "Gemm" else None,
            "scale": bn.inputs[1].name,
            "bias": bn.inputs[2].name,
            "epsilon": float(f.eps),
            "momentum": float(f.momentum),
            "bias_add": None if bias_add is None else {
                "name": bias_add.name,
                "inputs": [v.name if v is not None else "" for v in bias_add.inputs],
                "output": bias_add.outputs[0].name,
            },
        }

    def _batch_statistics(self, f: _Fold) -> tuple[ir.Value, ir.Value]:
        """The unfolded layer (float weight, no bias) and its batch mean and population variance."""
        ops, layer, prefix = self.ops, f.layer, f.prefix
        attrs = {a.name: a for a in layer.attributes.values()}
        attrs.pop("beta", None)
        raw_node = ir.node(layer.op_type, [layer.inputs[0], layer.inputs[1]], attrs,
                           name=ops.names.node(f"{prefix}/batch_stats_{layer.op_type}"))
        raw = raw_node.outputs[0]
        raw.name = ops.names.value(f"{prefix}/batch_stats_input")
        raw.dtype = ir.DataType.FLOAT
        self.graph.append(raw_node)
        axes = [0] + list(range(2, f.rank))
        mean_k = ops.reduce("ReduceMean", raw, axes, True, f"{prefix}/batch_mean_keepdims")
        diff = ops.op("Sub", [raw, mean_k], f"{prefix}/batch_centered")
        sq = ops.op("Mul", [diff, diff], f"{prefix}/batch_squared")
        var_k = ops.reduce("ReduceMean", sq, axes, True, f"{prefix}/batch_variance_keepdims")
        return (ops.reshape(mean_k, [f.channels], f"{prefix}/batch_mean"),
                ops.reshape(var_k, [f.channels], f"{prefix}/batch_variance"))

    def _bias(self, f: _Fold, match: Match, params: set[str]) -> ir.Value | None:
        """The layer's own bias and a bias Add's constant, as one [C] vector (None without either)."""
        ops, layer, prefix, op = self.ops, f.layer, f.prefix, f.layer.op_type
        biases = []
        if op in ("Conv", "ConvTranspose", "Gemm") and len(layer.inputs) > 2 and layer.inputs[2] is not None:
            b = layer.inputs[2]
            params.add(constant_source(b).root.name)
            if op == "Gemm":  # C broadcasts against the [batch, N] output
                vec = self._bias_vector(b, f.channels, 2, f"{prefix}/layer_bias")
            else:  # a Conv bias is one value per output channel
                vec = ops.reshape(b, [f.channels], f"{prefix}/layer_bias")
            if op == "Gemm" and float_attr(layer, "beta", 1.0) != 1.0:
                beta_attr = ops.const(f"{prefix}/gemm_beta", np.float32(float_attr(layer, "beta", 1.0)))
                vec = ops.op("Mul", [vec, beta_attr], f"{prefix}/layer_bias_scaled")
            biases.append(vec)
        if f.bias_add is not None:
            add_const = other_input(f.bias_add, match_input(match), self.view)
            params.add(constant_source(add_const).root.name)
            biases.append(self._bias_vector(add_const, f.channels, f.rank, f"{prefix}/add_bias"))
        if len(biases) == 2:
            return ops.op("Add", biases, f"{prefix}/bias_sum")
        return biases[0] if biases else None

    def _fold(self, f: _Fold, mu_b, var_b, mean_mv, var_mv, b_vec) -> tuple[ir.Value, ir.Value]:
        """The corrected output; the layer now reads the folded weight (which the weight quantizer
        fake-quantizes)."""
        ops, layer, prefix, bn = self.ops, f.layer, f.prefix, f.bn
        gamma_v = ops.reshape(bn.inputs[1], [f.channels], f"{prefix}/gamma")
        beta_v = ops.reshape(bn.inputs[2], [f.channels], f"{prefix}/beta")
        eps_c = ops.const(f"{prefix}/epsilon", f.eps)
        sigma_mv = ops.op("Sqrt", [ops.op("Add", [var_mv, eps_c], f"{prefix}/moving_variance_eps")], f"{prefix}/sigma_moving")
        sigma_b = ops.op("Sqrt", [ops.op("Add", [var_b, eps_c], f"{prefix}/batch_variance_eps")], f"{prefix}/sigma_batch")
        multiplier = ops.op("Div", [gamma_v, sigma_mv], f"{prefix}/multiplier")
        w_mult = ops.reshape(multiplier, channel_shape(layer, f.w.ndim), f"{prefix}/multiplier_weight")
        w_fold = ops.op("Mul", [layer.inputs[1], w_mult], f"{prefix}/mul_fold", shape=f.w.shape)
        recip = ops.op("Div", [sigma_mv, sigma_b], f"{prefix}/correction_recip_compute")
        gamma_over_sb = ops.op("Div", [gamma_v, sigma_b], f"{prefix}/gamma_over_sigma_batch")
        bias = ops.op("Sub", [beta_v, ops.op("Mul", [mu_b, gamma_over_sb], f"{prefix}/mean_times_scale")], f"{prefix}/bias")
        if self.frozen is not None:
            # the eval fold's bias, (b - mu_mv) * multiplier + beta, in its float32 operations
            centered = (ops.op("Neg", [mean_mv], f"{prefix}/moving_mean_negated") if b_vec is None
                        else ops.op("Sub", [b_vec, mean_mv], f"{prefix}/bias_minus_moving_mean"))
            frozen_bias = ops.op("Add", [ops.op("Mul", [centered, multiplier], f"{prefix}/moving_mean_times_scale"),
                                         beta_v], f"{prefix}/frozen_bias")
            one = ops.const(f"{prefix}/one", np.ones(f.channels, np.float32))
            recip = ops.op("Where", [self.frozen, one, recip], f"{prefix}/correction_recip")
            bias = ops.op("Where", [self.frozen, frozen_bias, bias], f"{prefix}/folded_bias")
        # the layer now computes layer(x, w_fold) without bias; the weight quantizer goes on w_fold
        layer.replace_input_with(1, w_fold)
        if len(layer.inputs) > 2:
            layer.resize_inputs(2)
        if layer.op_type == "Gemm" and "beta" in layer.attributes:
            layer.attributes.pop("beta")
        out_shape = [1, f.channels] + [1] * (f.rank - 2)
        scaled = ops.op("Mul", [layer.outputs[0], ops.reshape(recip, out_shape, f"{prefix}/correction_recip_shaped")],
                        f"{prefix}/post_conv_mul")
        result = ops.op("Add", [scaled, ops.reshape(bias, out_shape, f"{prefix}/bias_shaped")], f"{prefix}/add_fold")
        return result, bias

    def _moving_statistics(self, f: _Fold, mu_b, var_b, mean_mv, var_mv, b_vec) -> tuple[ir.Value, ir.Value]:
        """``mv_new = momentum * mv + (1 - momentum) * batch``, held after the freeze."""
        ops, prefix = self.ops, f.prefix
        mom = ops.const(f"{prefix}/momentum", np.float32(f.momentum))
        one_minus = ops.const(f"{prefix}/one_minus_momentum", np.float32(1.0 - f.momentum))
        mu_full = mu_b if b_vec is None else ops.op("Add", [mu_b, b_vec], f"{prefix}/batch_mean_with_bias")
        new_mean = ops.op("Add", [ops.op("Mul", [mom, mean_mv], f"{prefix}/moving_mean_decayed"),
                                  ops.op("Mul", [one_minus, mu_full], f"{prefix}/batch_mean_weighted")],
                          f"{prefix}/moving_mean_update")
        new_var = ops.op("Add", [ops.op("Mul", [mom, var_mv], f"{prefix}/moving_variance_decayed"),
                                 ops.op("Mul", [one_minus, var_b], f"{prefix}/batch_variance_weighted")],
                         f"{prefix}/moving_variance_update")
        if self.frozen is not None:
            new_mean = ops.op("Where", [self.frozen, mean_mv, new_mean], f"{prefix}/freeze_moving_mean")
            new_var = ops.op("Where", [self.frozen, var_mv, new_var], f"{prefix}/freeze_moving_variance")
        return new_mean, new_var

    def _replace_batch_norm(self, f: _Fold, result: ir.Value) -> None:
        """The fold's result takes the batch norm's output name; the batch norm goes."""
        bn = f.bn
        old_nodes: list[ir.Node] = []
        old_values: list[ir.Value] = []
        for value in bn.inputs[3:5]:
            src = constant_source(value)
            if src is not None:
                old_nodes.extend(src.nodes)
                old_values.append(src.root)
        bn_out = bn.outputs[0]
        bn_name, shape, dtype = bn_out.name, bn_out.shape, bn_out.dtype
        bn_out.replace_all_uses_with(result, replace_graph_outputs=True)
        self.graph.remove(bn, safe=True)
        if f.bias_add is not None:
            self.graph.remove(f.bias_add, safe=True)
        bn_out.name = None
        result.name = bn_name
        result.shape = shape
        result.dtype = dtype or ir.DataType.FLOAT
        remove_if_unused(self.graph, old_nodes, old_values)
