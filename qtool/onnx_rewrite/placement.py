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

from collections import Counter
from dataclasses import dataclass, field

import onnx_ir as ir

from qtool.errors import QtoolError
from qtool.onnx_rewrite._names import context_of
from qtool.onnx_rewrite.constants import is_constant
from qtool.onnx_rewrite.matcher import DEQUANTIZE, QUANTIZE, GraphView, Match
from qtool.onnx_rewrite.patterns import (
    ACTIVATION_INPUT,
    ACTIVATION_OPS,
    LAYER_CHAIN,
    LAYER_OPS,
    RANGE_PRESERVING_OPS,
    check_layer,
    layer_weight,
    output_channel_axis,
    weight_is_quantized,
    weight_rank,
)

DEFAULT_RANGE = (-6.0, 6.0)
DEFAULT_RANGE_AFTER_ACTIVATION = (0.0, 6.0)


@dataclass(frozen=True)
class QuantConfig:
    weight_bits: int = 8
    activation_bits: int = 8
    symmetric: bool = False
    per_channel: bool = True
    scope: str | None = None
    exclude: frozenset[str] = frozenset()

    def __post_init__(self):
        for label, bits in (("weight", self.weight_bits), ("activation", self.activation_bits)):
            if not isinstance(bits, int) or not 2 <= bits <= 16:
                raise QtoolError(f"{label} bits must be between 2 and 16, got {bits!r}")
        # normalized here once, whatever the caller passes (CLI flags, None, lists)
        object.__setattr__(self, "symmetric", bool(self.symmetric))
        object.__setattr__(self, "per_channel", bool(self.per_channel))
        object.__setattr__(self, "scope", self.scope or None)
        object.__setattr__(self, "exclude", frozenset(self.exclude or ()))

    def out_of_scope(self, node: ir.Node) -> str | None:
        """Why ``node`` is outside the rewrite's scope (None when inside)."""
        name = node.name or ""
        if name in self.exclude:
            return f"'{name}' is excluded (--exclude)"
        if self.scope and not name.startswith(self.scope):
            return f"'{name}' is outside --scope '{self.scope}'"
        return None


@dataclass
class WeightPoint:
    value: ir.Value  # the weight tensor the layers read
    layers: list[ir.Node]
    axis: int | None  # per-channel axis; None for one range per tensor
    context: str
    exists: bool = False  # the layers already read a DequantizeLinear

    @property
    def name(self) -> str:
        return f"{self.context}/weights_quant"

    def to_dict(self) -> dict:
        return {
            "tensor": self.value.name,
            "layers": [n.name for n in self.layers],
            "op": self.layers[0].op_type,
            "axis": self.axis,
            "quantizer": self.name,
            "already_quantized": self.exists,
        }


@dataclass
class ActivationPoint:
    value: ir.Value
    kind: str  # act_quant, conv_quant, add_quant, post_activation_bypass_quant, activation_Add_quant, input_quant
    context: str
    rule: str
    producer: ir.Node | None
    after_activation: bool = False
    exists: bool = False

    @property
    def name(self) -> str:
        return f"{self.context}/{self.kind}" if self.context else self.kind

    @property
    def default_range(self) -> tuple[float, float]:
        return DEFAULT_RANGE_AFTER_ACTIVATION if self.after_activation else DEFAULT_RANGE

    def to_dict(self) -> dict:
        return {
            "tensor": self.value.name,
            "kind": self.kind,
            "rule": self.rule,
            "producer": self.producer.name if self.producer is not None else None,
            "quantizer": self.name,
            "already_quantized": self.exists,
        }


@dataclass
class LeftInFloat:
    node: str
    op: str
    reason: str

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "reason": self.reason}


@dataclass
class LayerMatch:
    layer: ir.Node
    chain: Match
    activation_input: ir.Value | None

    def get(self, step: str) -> ir.Node | None:
        return self.chain.get(step)


@dataclass
class QuantPlan:
    config: QuantConfig
    layers: list[LayerMatch] = field(default_factory=list)
    weights: list[WeightPoint] = field(default_factory=list)
    activations: list[ActivationPoint] = field(default_factory=list)
    left_in_float: list[LeftInFloat] = field(default_factory=list)
    other_ops: Counter = field(default_factory=Counter)

    def new_weights(self) -> list[WeightPoint]:
        return [p for p in self.weights if not p.exists]

    def new_activations(self) -> list[ActivationPoint]:
        return [p for p in self.activations if not p.exists]

    def tensors_to_calibrate(self) -> list[str]:
        return [p.value.name for p in self.new_activations()]

    def is_empty(self) -> bool:
        return not self.new_weights() and not self.new_activations()


class _Planner:
    def __init__(self, graph: ir.Graph, config: QuantConfig):
        self.graph = graph
        self.config = config
        self.view = GraphView(graph)
        self.plan = QuantPlan(config)
        self._points: dict[int, ActivationPoint] = {}
        self._left: dict[str, LeftInFloat] = {}
        self._handled: set[int] = set()  # nodes some rule looked at

    # --- bookkeeping -------------------------------------------------------------
    def left(self, node: ir.Node, reason: str) -> None:
        key = node.name or str(id(node))
        if key not in self._left:
            self._left[key] = LeftInFloat(node.name, node.op_type, reason)

    def exists(self, value: ir.Value) -> bool:
        return self.view.quantizer_after(value) is not None

    def add_activation(
        self,
        value: ir.Value,
        kind: str,
        context: str,
        rule: str,
        producer: ir.Node | None,
        *,
        after_activation: bool = False,
        consumers: list[ir.Node] | None = None,
    ) -> ActivationPoint | None:
        if id(value) in self._points:
            return self._points[id(value)]
        if producer is not None:
            reason = self.config.out_of_scope(producer)
            if reason is not None:
                self.left(producer, f"output not quantized: producer {reason}")
                return None
        for consumer in consumers or ():
            reason = self.config.out_of_scope(consumer)
            if reason is not None:
                self.left(producer or consumer, f"output not quantized ({kind}): consumer {reason}")
                return None
        point = ActivationPoint(value, kind, context, rule, producer, after_activation, self.exists(value))
        self._points[id(value)] = point
        self.plan.activations.append(point)
        return point

    def is_quantized(self, value: ir.Value | None) -> bool:
        """Quantized here or upstream, through range-preserving ops (TF's pass-through ops)."""
        for _ in range(32):
            if value is None:
                return False
            if id(value) in self._points or self.view.is_quantized(value):
                return True
            producer = value.producer()
            if producer is None or producer.domain != "" or producer.op_type not in RANGE_PRESERVING_OPS:
                return False
            value = self.view.input(producer, 0)
        return False

    # --- rules ----------------------------------------------------------------------
    def find_layers(self) -> None:
        for node in self.graph:
            if node.domain != "" or node.op_type not in LAYER_OPS:
                continue
            self._handled.add(id(node))
            reason = check_layer(node, self.view)
            if reason is not None:
                self.left(node, reason)
                continue
            chain = LAYER_CHAIN.match(node, self.view)
            x = self.view.input(node, ACTIVATION_INPUT[node.op_type])
            self.plan.layers.append(LayerMatch(node, chain, x))

    def weights(self) -> None:
        groups: dict[int, list[ir.Node]] = {}
        values: dict[int, ir.Value] = {}
        for match in self.plan.layers:
            weight = layer_weight(match.layer, self.view)
            groups.setdefault(id(weight), []).append(match.layer)
            values[id(weight)] = weight
        for key, layers in groups.items():
            weight = values[key]
            reasons = [(n, self.config.out_of_scope(n)) for n in layers]
            bad = [(n, r) for n, r in reasons if r is not None]
            if bad:
                for node, reason in reasons:
                    if reason is not None:
                        self.left(node, f"weights not quantized: {reason}")
                    else:
                        other = bad[0][0]
                        self.left(node, f"weights not quantized: shared with '{other.name}', which is out of scope")
                continue
            axis = None
            if self.config.per_channel:
                axes = {output_channel_axis(n, weight_rank(n) or 2) for n in layers}
                if len(axes) == 1:
                    axis = axes.pop()
            context = context_of(layers[0].name or layers[0].op_type)
            self.plan.weights.append(WeightPoint(weight, layers, axis, context, weight_is_quantized(weight)))

    def chains(self) -> None:
        for match in self.plan.layers:
            layer = match.layer
            ctx = context_of(layer.name or layer.op_type)
            bias, bypass = match.get("bias_add"), match.get("bypass")
            act, post = match.get("activation"), match.get("post_bypass")
            for node in (bias, bypass, act, post):
                if node is not None:
                    self._handled.add(id(node))
            linear = bias or layer
            if bypass is not None:
                self.add_activation(
                    linear.outputs[0], "conv_quant", ctx, "layer output entering a bypass Add", linear,
                    consumers=[bypass],
                )
                after = self.view.consumers(bypass.outputs[0])
                acts = [c for c in after if c.domain == "" and c.op_type in ACTIVATION_OPS]
                if acts:
                    self.left(bypass, f"output not quantized: it feeds {acts[0].op_type} '{acts[0].name}' (fused at inference)")
                else:
                    self.add_activation(
                        bypass.outputs[0], "add_quant", context_of(bypass.name or "Add"), "bypass Add output", bypass,
                        consumers=after,
                    )
            if act is not None:
                self.add_activation(
                    act.outputs[0], "act_quant", ctx, f"{act.op_type} at the end of the layer chain", act,
                    after_activation=True,
                )
            elif bypass is None:
                self.add_activation(
                    linear.outputs[0], "act_quant", ctx, "end of a layer chain without activation", linear,
                )
            if post is not None:
                after = self.view.consumers(post.outputs[0])
                acts = [c for c in after if c.domain == "" and c.op_type in ACTIVATION_OPS]
                if acts:
                    self.left(post, f"output not quantized: it feeds {acts[0].op_type} '{acts[0].name}' (fused at inference)")
                else:
                    self.add_activation(
                        post.outputs[0], "post_activation_bypass_quant", context_of(post.name or "Add"),
                        "post-activation bypass Add output", post,
                    )

    def graph_inputs(self) -> None:
        readers: dict[int, list[ir.Node]] = {}
        values: dict[int, ir.Value] = {}
        for match in self.plan.layers:
            x = match.activation_input
            # NHWC exports (tf2onnx) read the input through a Transpose: look through range-keeping ops
            for _ in range(32):
                producer = x.producer() if x is not None else None
                if producer is None or producer.domain != "" or producer.op_type not in RANGE_PRESERVING_OPS:
                    break
                x = self.view.input(producer, 0)
            if x is None or not x.is_graph_input() or x.is_initializer():
                continue
            readers.setdefault(id(x), []).append(match.layer)
            values[id(x)] = x
        for key, layers in readers.items():
            x = values[key]
            self.add_activation(
                x, "input_quant", x.name or "input", "graph input read by a layer op", None, consumers=layers
            )

    def intermediate(self) -> None:
        """TF's _QuantizeActivationLayers: Add/Mul of quantized tensors."""
        for node in self.graph:
            if node.domain != "" or node.op_type not in ("Add", "Mul"):
                continue
            self._handled.add(id(node))
            out = node.outputs[0]
            if id(out) in self._points:
                continue
            inputs = [self.view.input(node, i) for i in range(len(node.inputs))]
            variable = [v for v in inputs if v is not None and not is_constant(v)]
            if not variable:
                continue  # arithmetic on constants
            consumers = self.view.consumers(out)
            missing = [v for v in variable if not self.is_quantized(v)]
            if len(consumers) == 1 and consumers[0].domain == "" and consumers[0].op_type in ACTIVATION_OPS:
                act = consumers[0]
                self.left(node, f"output not quantized: it feeds {act.op_type} '{act.name}' (fused at inference)")
                if not missing and act.outputs[0] is not None:
                    self._handled.add(id(act))
                    # the activation's output is then the quantized one (TF: bypass Add -> Relu); tf2onnx
                    # writes a batch norm it could not fold (after a depthwise conv) as Mul -> Add -> Relu6
                    self.add_activation(
                        act.outputs[0], f"activation_{node.op_type}_quant", node.name or node.op_type,
                        f"{act.op_type} after {node.op_type} of quantized inputs", act, after_activation=True,
                    )
                continue
            if missing:
                self.left(node, f"output not quantized: input '{missing[0].name}' is not quantized")
                continue
            self.add_activation(
                out, f"activation_{node.op_type}_quant", node.name or node.op_type,
                f"{node.op_type} of quantized inputs", node,
            )

    def others(self) -> None:
        skip = {"Constant", QUANTIZE, DEQUANTIZE}
        for node in self.graph:
            if id(node) in self._handled or node.op_type in skip:
                continue
            inputs = [v for v in node.inputs if v is not None]
            if inputs and all(is_constant(v) for v in inputs):
                continue  # computes a constant (a weight's Transpose/Cast, a Clip bound): not float work
            self.plan.other_ops[node.op_type] += 1

    def run(self) -> QuantPlan:
        self.find_layers()
        self.weights()
        self.chains()
        self.graph_inputs()
        self.intermediate()
        self.others()
        self.plan.left_in_float = list(self._left.values())
        # quantized points never also appear as "left in float"
        return self.plan


def check_exclude(graph: ir.Graph, exclude) -> None:
    """Every ``--exclude`` name must be a node of the model (typos would silently do nothing)."""
    unknown = sorted(set(exclude or ()) - {n.name for n in graph.all_nodes()})
    if unknown:
        raise QtoolError(f"--exclude: no node named {', '.join(repr(u) for u in unknown)} in the model")


def plan_quantization(graph: ir.Graph, config: QuantConfig) -> QuantPlan:
    """TF's placement rules on ``graph`` (batch norms folded first). Pure: edits nothing."""
    return _Planner(graph, config).run()
