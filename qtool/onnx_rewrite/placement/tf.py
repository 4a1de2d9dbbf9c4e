"""Where quantization goes: TensorFlow's placement rules (spec section 2) as a plan.

``plan_quantization`` is a pure analysis: it reads the graph (batch norms
already folded) and returns a :class:`QuantPlan` listing

- weight quantization points (the weight tensor, the layers reading it, the
  per-channel axis),
- activation quantization points (the tensor, which rule placed it, its
  default range when there is no calibration),
- nodes left in float, each with the reason a rule did not apply.

Encodings consume the plan: ``eval_graph`` writes QuantizeLinear /
DequantizeLinear for a deployable model; the training graph writes
``qtool::FakeQuant`` with state. The rules, in TF's order
(``tf.contrib.quantize.python.quantize.Quantize``):

1. Every layer op (Conv, ConvTranspose, Gemm, MatMul) with a constant weight
   gets a weight quantizer; it needs *every* layer reading that weight in
   scope.
2. For the chain ``layer -> [bias Add] -> [bypass Add] -> [Relu|Clip] ->
   [post-activation bypass Add]``:
   - bypass Add present: the tensor entering it is quantized (``conv_quant``),
     and its output (``add_quant``) unless the Add feeds Relu/Clip;
   - activation present: its output (``act_quant``, default range (0, 6));
   - neither: the last linear op's output (``act_quant``, default (-6, 6));
   - post-activation bypass Add: its output unless it feeds Relu/Clip.
3. Graph inputs read by a layer op are quantized (``input_quant``).
4. An Add or Mul whose non-constant inputs are all quantized (looking back
   through range-preserving ops such as MaxPool and Reshape) gets its output
   quantized, unless its only consumer is Relu/Clip.
5. A point where a quantizer already follows (through Identity/Reshape) is
   marked ``exists`` and gets nothing new: rewriting twice changes nothing.

Scope: weight quantizers need every consumer in scope; activation quantizers
need the producer in scope (and for ``conv_quant``/``add_quant`` the
consumers too, as in TF). ``--exclude`` takes a node out of scope.
"""

from __future__ import annotations

import onnx_ir as ir

from qtool.model.constants import is_constant
from qtool.model.layers import (
    ACTIVATION_INPUT,
    check_layer,
    is_layer,
    layer_weight,
    output_channel_axis,
    weight_is_quantized,
    weight_rank,
)
from qtool.model.names import context_of
from qtool.onnx_rewrite.patterns import LAYER_CHAIN, RANGE_PRESERVING_OPS, fused_activation
from qtool.onnx_rewrite.placement.plan import LayerMatch, PlacementRule, PlanContext, WeightPoint


class FindLayers(PlacementRule):
    """Layer ops with a quantizable constant weight, and the TF chain after each."""

    name = "layers"

    def candidates(self, ctx):
        return [n for n in ctx.graph if is_layer(n)]

    def check(self, ctx, node):
        ctx.handled.add(id(node))
        return check_layer(node)

    def apply(self, ctx, node):
        chain = LAYER_CHAIN.match(node, ctx.view)
        x = ctx.view.input(node, ACTIVATION_INPUT[node.op_type])
        ctx.plan.layers.append(LayerMatch(node, chain, x))


class LayerWeights(PlacementRule):
    """Rule 1: a weight quantizer per weight tensor; every layer reading it must be in scope."""

    name = "weights"

    def candidates(self, ctx):
        groups: dict[int, list[ir.Node]] = {}
        for match in ctx.plan.layers:
            groups.setdefault(id(layer_weight(match.layer)), []).append(match.layer)
        return list(groups.values())

    def check(self, ctx, layers):
        bad = [(n, ctx.config.out_of_scope(n)) for n in layers]
        bad = [(n, r) for n, r in bad if r is not None]
        if not bad:
            return None
        for node in layers:
            reason = ctx.config.out_of_scope(node)
            ctx.left(node, f"weights not quantized: {reason}" if reason is not None else
                     f"weights not quantized: shared with '{bad[0][0].name}', which is out of scope")
        return "out of scope"

    def apply(self, ctx, layers):
        weight = layer_weight(layers[0])
        axis = None
        if ctx.config.per_channel:
            axes = {output_channel_axis(n, weight_rank(n) or 2) for n in layers}
            if len(axes) == 1:
                axis = axes.pop()
        context = context_of(layers[0].name or layers[0].op_type)
        ctx.plan.weights.append(WeightPoint(weight, layers, axis, context, weight_is_quantized(weight)))


def _feeds_activation(ctx: PlanContext, node: ir.Node) -> ir.Node | None:
    after = ctx.view.consumers(node.outputs[0])
    acts = [c for c in after if fused_activation(c)]
    return acts[0] if acts else None


class LayerChains(PlacementRule):
    """Rule 2: TF's ``layer -> [bias Add] -> [bypass Add] -> [Relu|Clip] -> [post bypass Add]``."""

    name = "chains"

    def candidates(self, ctx):
        return list(ctx.plan.layers)

    def apply(self, ctx, match):
        layer = match.layer
        ctx_name = context_of(layer.name or layer.op_type)
        bias, bypass = match.get("bias_add"), match.get("bypass")
        act, post = match.get("activation"), match.get("post_bypass")
        ctx.handled.update(id(n) for n in (bias, bypass, act, post) if n is not None)
        linear = bias or layer
        if bypass is not None:
            self._bypass(ctx, linear, bypass, ctx_name)
        if act is not None:
            ctx.add_activation(act.outputs[0], "act_quant", ctx_name, f"{act.op_type} at the end of the layer chain",
                               act, after_activation=True)
        elif bypass is None:
            ctx.add_activation(linear.outputs[0], "act_quant", ctx_name, "end of a layer chain without activation",
                               linear)
        if post is not None:
            feeds = _feeds_activation(ctx, post)
            if feeds is not None:
                ctx.left(post, f"output not quantized: it feeds {feeds.op_type} '{feeds.name}' (fused at inference)")
            else:
                ctx.add_activation(post.outputs[0], "post_activation_bypass_quant", context_of(post.name or "Add"),
                                   "post-activation bypass Add output", post)

    @staticmethod
    def _bypass(ctx, linear, bypass, ctx_name):
        ctx.add_activation(linear.outputs[0], "conv_quant", ctx_name, "layer output entering a bypass Add", linear,
                           consumers=[bypass])
        feeds = _feeds_activation(ctx, bypass)
        if feeds is not None:
            ctx.left(bypass, f"output not quantized: it feeds {feeds.op_type} '{feeds.name}' (fused at inference)")
        else:
            ctx.add_activation(bypass.outputs[0], "add_quant", context_of(bypass.name or "Add"), "bypass Add output",
                               bypass, consumers=ctx.view.consumers(bypass.outputs[0]))


class GraphInputs(PlacementRule):
    """Rule 3: graph inputs read by a layer op (through range-keeping ops: tf2onnx's NHWC Transpose)."""

    name = "graph inputs"

    def candidates(self, ctx):
        readers: dict[int, tuple[ir.Value, list[ir.Node]]] = {}
        for match in ctx.plan.layers:
            x = match.activation_input
            for _ in range(32):
                producer = x.producer() if x is not None else None
                if producer is None or producer.domain != "" or producer.op_type not in RANGE_PRESERVING_OPS:
                    break
                x = ctx.view.input(producer, 0)
            if x is None or not x.is_graph_input() or x.is_initializer():
                continue
            readers.setdefault(id(x), (x, []))[1].append(match.layer)
        return list(readers.values())

    def apply(self, ctx, candidate):
        x, layers = candidate
        ctx.add_activation(x, "input_quant", x.name or "input", "graph input read by a layer op", None,
                           consumers=layers)


class QuantizedArithmetic(PlacementRule):
    """Rule 4 (TF's _QuantizeActivationLayers): an Add/Mul of quantized inputs gets its output
    quantized; when it feeds Relu/Clip, the activation's output instead."""

    name = "arithmetic"

    def candidates(self, ctx):
        return [n for n in ctx.graph if n.domain == "" and n.op_type in ("Add", "Mul")]

    def check(self, ctx, node):
        ctx.handled.add(id(node))
        return None

    def apply(self, ctx, node):
        out = node.outputs[0]
        if ctx.point(out) is not None:
            return
        variable = [v for v in (ctx.view.input(node, i) for i in range(len(node.inputs)))
                    if v is not None and not is_constant(v)]
        if not variable or not ctx.is_float(out) or not any(ctx.carries_data(v) for v in variable):
            return  # arithmetic on constants, on integers, or on dynamic shapes
        consumers = ctx.view.consumers(out)
        missing = [v for v in variable if not ctx.is_quantized(v)]
        kind = f"activation_{node.op_type}_quant"
        if len(consumers) == 1 and fused_activation(consumers[0]):
            act = consumers[0]
            ctx.left(node, f"output not quantized: it feeds {act.op_type} '{act.name}' (fused at inference)")
            if not missing and act.outputs[0] is not None:
                ctx.handled.add(id(act))
                # the activation's output is then the quantized one (TF: bypass Add -> Relu); tf2onnx
                # writes a batch norm it could not fold (after a depthwise conv) as Mul -> Add -> Relu6
                ctx.add_activation(act.outputs[0], kind, node.name or node.op_type,
                                   f"{act.op_type} after {node.op_type} of quantized inputs", act,
                                   after_activation=True)
            return
        if len(missing) == len(variable):
            return  # float arithmetic on float tensors (a log-mel's Log * 10): no placement failed
        if missing:
            ctx.left(node, f"output not quantized: input '{missing[0].name}' is not quantized")
            return
        ctx.add_activation(out, kind, node.name or node.op_type, f"{node.op_type} of quantized inputs", node)


# TF's order (tf.contrib.quantize.python.quantize.Quantize); each rule sees the earlier ones' points
TF_RULES: tuple[PlacementRule, ...] = (FindLayers(), LayerWeights(), LayerChains(), GraphInputs(),
                                       QuantizedArithmetic())


