"""Section 2b: every layer runs in integers in onnxruntime (beyond TensorFlow's rules).

onnxruntime fuses ``DequantizeLinear -> op -> QuantizeLinear`` into an integer
kernel only where the Q/DQ pairs are there. Measured on small graphs of each
pattern (``benchmarks/zoo/placement_experiments.py``, results in
``benchmarks/zoo/FINDINGS.md``), these rules give the arrangements that let
it run every Conv/MatMul/Gemm in integers with the fewest pairs:

- :class:`LayerInputs`: every activation input of a layer op is quantized,
  whatever produced it, including both inputs of a MatMul of two activations
  (attention's ``Q.K^T`` and ``P.V``); the quantizer goes on the tensor before
  any shape op (one quantizer per tensor, shared by its consumers);
- :class:`IntegerOps` (one pass in graph order):
  - shape ops (Reshape, Transpose, Flatten, (Un)Squeeze, Slice, Gather of an
    activation, Split, MaxPool, Resize, DepthToSpace ...) **carry** their
    input's quantizer: same scale and zero point, so they run on the integers;
  - activation functions of a quantized tensor (Sigmoid, HardSigmoid,
    HardSwish, Tanh, LeakyRelu, PRelu, Elu, Gelu, ...) get their output
    quantized: onnxruntime has QLinearSigmoid/QLinearLeakyRelu, and for the
    others the pair lets the next layer fuse (SiLU ``x * Sigmoid(x)`` then
    becomes QLinearSigmoid + QLinearMul);
  - a pooled tensor (GlobalAveragePool, AveragePool, ReduceMean) gets its own
    range, never the wider one of the tensor before pooling;
  - an Add or Mul of quantized tensors gets its output quantized (QLinearAdd,
    QLinearMul), except the additive attention mask path: nothing that feeds a
    Softmax is quantized, so ``-inf``/``-1e4`` masks are never clipped;
  - and an Add or Mul of a quantized tensor and a **float tensor at least 8 times smaller** (a gate
    ``[1, C, 1, 1]`` computed in float, static shapes): the small operand gets its own range first
    (:func:`_float_broadcast_operand`: OSNet-AIN's gates, 0.97x -> 0.94x float);
  - so does an Add or Mul of a quantized tensor and a **scalar constant** (``plan.scalar_operands``):
    the eval graph reads the constant through its own DequantizeLinear, one code whose scale is the
    constant itself (exact: the float graph, the training graph and the deployed model use the same
    value), so onnxruntime runs QLinearAdd/QLinearMul. PaddleOCR's PP-LCNetV3 follows every
    HardSwish with a learnable affine block ``w * x + b`` (scalars): left in float between a DQ and
    a Q it also kept the HardSwish's Mul in float (real PP-OCRv4 recognizer, docs/deploy.md);
  - a Concat's inputs and output share one range, the union (QLinearConcat
    with no requantization), except an input right after a layer's Relu/Clip
    when another input can be negative (it keeps its own range, so the
    activation still fuses into the layer's integer kernel);
  - a Softmax output gets its calibrated range ``[0, max]`` ([0, 1] without data), not the fixed
    [0, 1]: with ~200 tokens attention probabilities are ~1/200, about one step of the fixed grid
    (scale 1/255), and the zoo ViT's first-block attention rounded away (docs/spec-changes.md).
  - a HardSigmoid output (a HardSwish is split into ``x * HardSigmoid(x)`` before placement) uses
    the fixed range [0, 1] with 8-bit unsigned activations, and the HardSigmoid goes to
    ``plan.integer_gates``: the eval graph writes it as an integer Add whose Q saturation is the
    clip (``onnx_rewrite.hard_activations``; MobileNetV3 0.87x -> 0.72x float);
  - a tensor read only by ops that saturate (HardSwish, its split form ``x * HardSigmoid(x)``,
    HardSigmoid) has its range clipped where they all saturate (:func:`saturation_bound`): on a PP-LCNet/MobileNetV3 the calibrated
    range before a HardSwish reaches -8 to -13, where every value below -3 gives 0, so 40% of the
    8-bit levels were wasted.
- :class:`RecurrentLayers`: an LSTM with constant float32 ``W``/``R`` runs as onnxruntime's
  ``com.microsoft.DynamicQuantizeLSTM`` (int8 weights stored by qtool, the input and hidden state
  quantized by the kernel at run time: 0.58x float on the zoo tagger per channel, 0.50x per tensor,
  where Q/DQ around a float LSTM gains nothing, 0.98-1.00x); onnxruntime has no QDQ selector for LSTM/GRU/RNN and no
  integer GRU/RNN kernel at all, so GRU and RNN stay float with that reason
  (``benchmarks/zoo/FINDINGS.md`` section 3). ``--float-rnn`` keeps LSTMs float too.
- :class:`FloatOps` (last): every op left in float, with its reason, for the report.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from qtool.model.codec import DEQUANTIZE, QUANTIZE
from qtool.model.constants import clip_bounds, constant_array, constant_dtype, is_constant, not_constant_reason
from qtool.model.layers import float_attr, int_attr, is_layer
from qtool.model.names import context_of
from qtool.model.opset import inferred_shapes
from qtool.onnx_rewrite.hard_activations import GATE_RANGE, uses_integer_gates
from qtool.onnx_rewrite.patterns import fused_activation, keeps_positive
from qtool.onnx_rewrite.placement.plan import (
    ActivationPoint,
    LeftInFloat,
    PlacementRule,
    PlanContext,
    RecurrentPoint,
)

# ops whose output is their input's values rearranged (or a selection, or a nearest/linear resize):
# they carry the input's quantizer
CARRY_OPS = ("Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather", "Split",
             "MaxPool", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth", "Expand", "Tile", "Pad")
# elementwise activations: their output gets its own range when their input is quantized
ACTIVATION_FUNCTIONS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "PRelu", "Elu",
                        "Selu", "Gelu", "Softplus", "Mish")
# pooling: a new (smaller) range
POOLING_OPS = ("GlobalAveragePool", "AveragePool", "ReduceMean")
SOFTMAX_RANGE = (0.0, 1.0)  # a Softmax output's range without calibration data
# ops onnxruntime runs in integers when Q/DQ surround them (QDQ selectors), for the float-op report
INTEGER_KERNELS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul", "Sigmoid", "LeakyRelu", "Concat",
                   "GlobalAveragePool", "AveragePool", "Softmax", "Relu", "Clip", *CARRY_OPS}


def _variable_inputs(ctx: PlanContext, node: ir.Node) -> list[ir.Value]:
    return [v for v in (ctx.view.input(node, i) for i in range(len(node.inputs))) if v is not None and not is_constant(v)]


def scalar_operand(node: ir.Node) -> int | None:
    """The index of the scalar float32 constant operand of an Add/Mul whose other operand is computed at
    run time (a single finite value, any rank: ``3``, ``[1]``, ``[1, 1, 1]``), or None."""
    if node.domain != "" or node.op_type not in ("Add", "Mul") or len(node.inputs) != 2:
        return None
    constant = [i for i, v in enumerate(node.inputs) if is_constant(v)]
    if len(constant) != 1 or node.inputs[1 - constant[0]] is None:
        return None
    shape = node.inputs[constant[0]].shape
    if shape is not None and shape.is_static() and math.prod(shape.numpy()) != 1:
        return None  # known not to be a scalar: no need to compute it (a bias vector, a weight)
    value = constant_array(node.inputs[constant[0]])
    if value is None or value.dtype != np.float32 or value.size != 1 or not np.isfinite(value).all():
        return None
    return constant[0]


ARITHMETIC_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "Sqrt")
WRITTEN_OUT_CORES = ("Tanh", "Erf")  # GELU's two forms (and Mish): onnxruntime fuses them in float


def _in_written_out_function(ctx: PlanContext, node: ir.Node, depth: int = 3) -> bool:
    """``node`` is arithmetic around a Tanh/Erf within ``depth`` arithmetic steps, up or down: a GELU
    written out (``0.5 * x * (1 + erf(x / sqrt 2))``, the tanh form's ``x + 0.044715 x^3``), which
    onnxruntime fuses into one float Gelu/FastGelu; a pair inside it would split the fusion and run
    the pieces as a QLinear chain with a pair per step."""
    seen, frontier = {id(node)}, [node]
    for _ in range(depth):
        step = []
        for n in frontier:
            near = [v.producer() for v in n.inputs if v is not None]
            near += [c for o in n.outputs if o is not None for c in ctx.view.consumers(o)]
            for m in near:
                if m is None or id(m) in seen or m.domain != "":
                    continue
                seen.add(id(m))
                if m.op_type in WRITTEN_OUT_CORES:
                    return True
                if m.op_type in ARITHMETIC_OPS:
                    step.append(m)
        frontier = step
    return False


def _feeds_softmax(ctx: PlanContext, value: ir.Value) -> bool:
    return any(c.domain == "" and c.op_type in ("Softmax", "LogSoftmax") for c in ctx.view.consumers(value))


def _carry_root(ctx: PlanContext, value: ir.Value | None) -> ir.Value | None:
    """The tensor before any shape op: where a layer input's quantizer goes."""
    for _ in range(32):
        producer = value.producer() if value is not None else None
        if producer is None or producer.domain != "" or producer.op_type not in CARRY_OPS or ctx.is_quantized(value):
            return value
        if producer.op_type == "Gather" and (not producer.inputs or is_constant(ctx.view.input(producer, 0))):
            return value  # an embedding lookup: its output is the activation
        value = ctx.view.input(producer, 0)
    return value


class LayerInputs(PlacementRule):
    """Every activation input of a layer op is quantized (both inputs of a MatMul of two activations)."""

    name = "layer inputs"

    def candidates(self, ctx):
        return [n for n in ctx.graph if is_layer(n)]

    def check(self, ctx, node):
        reason = ctx.config.out_of_scope(node)
        if reason is not None and node.op_type == "MatMul" and _two_activations(ctx, node):
            ctx.forget_left(node)  # TF's rule said "not a constant"; this rule runs such MatMuls: the scope is why not
        return reason and f"input not quantized: {reason}"

    def apply(self, ctx, node):
        indices = (0,) if not (node.op_type == "MatMul" and _two_activations(ctx, node)) else (0, 1)
        for index in indices:
            x = ctx.view.input(node, index)
            if x is None or is_constant(x) or ctx.is_quantized(x):
                continue
            root = _carry_root(ctx, x)
            if root is None or is_constant(root) or root.is_initializer():
                continue
            if _feeds_softmax(ctx, root):
                ctx.left(node, f"input '{x.name}' not quantized: it also feeds a Softmax (attention mask path)")
                continue
            producer = root.producer()
            ctx.add_activation(root, "input_quant", context_of(node.name or node.op_type),
                               f"input of {node.op_type} '{node.name}'", producer,
                               after_activation=producer is not None and producer.op_type in ("Relu", "Clip"))
        if len(indices) == 2 and all(ctx.is_quantized(ctx.view.input(node, i)) for i in indices):
            ctx.forget_left(node)  # a MatMul of two activations: integer (MatMulIntegerToFloat, QLinearMatMul)


def _two_activations(ctx: PlanContext, node: ir.Node) -> bool:
    return len(_variable_inputs(ctx, node)) == 2


def saturation_bound(ctx: PlanContext, node: ir.Node, x: ir.Value) -> tuple[float, float] | None:
    """The interval outside which ``node``'s output no longer changes with its input ``x`` (HardSwish: 0
    for x <= -3; HardSigmoid: 0 below -beta/alpha, 1 above (1 - beta)/alpha; the Mul of a split HardSwish,
    ``x * HardSigmoid(x)``: 0 below -beta/alpha), or None."""
    if node.domain != "":
        return None
    if node.op_type == "HardSwish":
        return (-3.0, math.inf)
    if node.op_type == "HardSigmoid":
        alpha, beta = float_attr(node, "alpha", 0.2), float_attr(node, "beta", 0.5)
        return (-beta / alpha, (1.0 - beta) / alpha) if alpha > 0 else None
    if node.op_type == "Mul" and len(node.inputs) == 2:
        inputs = [ctx.view.input(node, i) for i in range(2)]
        other = inputs[1 - inputs.index(x)] if inputs.count(x) == 1 else None
        gate = other.producer() if other is not None else None
        if gate is not None and gate.domain == "" and gate.op_type == "HardSigmoid" and ctx.view.input(gate, 0) is x:
            bound = saturation_bound(ctx, gate, x)
            return None if bound is None else (bound[0], math.inf)
    return None


class SaturatingConsumers(PlacementRule):
    """A point with its own range whose every reader saturates outside an interval (a HardSwish input,
    split into ``x * HardSigmoid(x)`` or not) gets the hull of those intervals as its ``bound``
    (``ActivationPoint.bound``)."""

    name = "saturating consumers"

    def candidates(self, ctx):
        return list(ctx.plan.activations)

    def apply(self, ctx, point):
        point.bound = self._bound(ctx, point)

    @staticmethod
    def _bound(ctx, point) -> tuple[float, float] | None:
        if point.exists or not point.calibrated or point.group is not None:
            return None
        if any(p.source is point for p in ctx.plan.activations) or ctx.view.is_graph_output(point.value):
            return None
        # the hull of the readers' intervals: outside it none of them changes
        bounds = [saturation_bound(ctx, c, point.value) for c in ctx.view.consumers(point.value)]
        if not bounds or None in bounds:
            return None
        return (min(b[0] for b in bounds), max(b[1] for b in bounds))


class IntegerOps(PlacementRule):
    """One pass in graph order: carry through shape ops, activation and pooling outputs, arithmetic
    of quantized tensors, Concat groups, Softmax outputs (module docstring)."""

    name = "integer ops"

    def candidates(self, ctx):
        return [n for n in ctx.graph if n.domain == ""]

    def apply(self, ctx, node):
        op = node.op_type
        if op in CARRY_OPS:
            self._carry(ctx, node)
        elif op in ACTIVATION_FUNCTIONS or op in POOLING_OPS:
            self._own_range(ctx, node)
        elif op in ("Add", "Mul"):
            self._arithmetic(ctx, node)
        elif op == "Concat":
            self._concat(ctx, node)
        elif op == "Softmax":
            ctx.add_activation(node.outputs[0], "softmax_quant", context_of(node.name or op),
                               "Softmax output: calibrated range [0, max] ([0, 1] without data)", node,
                               default=SOFTMAX_RANGE, whole_range=True)

    @staticmethod
    def _carry(ctx, node):
        x = ctx.view.input(node, 0) if node.inputs else None
        if x is None or is_constant(x):
            return
        source = ctx.point(x)
        if source is None:
            return
        for out in node.outputs:
            if out is not None and not _feeds_softmax(ctx, out):
                ctx.add_activation(out, "carried_quant", context_of(node.name or node.op_type),
                                   f"{node.op_type} carries its input's quantizer", node, source=source)

    @staticmethod
    def _own_range(ctx, node):
        x = ctx.view.input(node, 0) if node.inputs else None
        if x is None or not ctx.is_quantized(x) or _feeds_softmax(ctx, node.outputs[0]) or keeps_positive(node):
            return
        if node.op_type == "HardSigmoid" and uses_integer_gates(ctx.config):
            _integer_gate(ctx, node)
            return
        kind = "pool_quant" if node.op_type in POOLING_OPS else "act_quant"
        ctx.add_activation(node.outputs[0], kind, context_of(node.name or node.op_type),
                           f"{node.op_type} of a quantized tensor (its own range)", node,
                           after_activation=node.op_type in ("Relu", "Clip"))

    @staticmethod
    def _arithmetic(ctx, node):
        variable = _variable_inputs(ctx, node)
        out = node.outputs[0]
        scalar = len(variable) == 1 and scalar_operand(node) is not None and not _in_written_out_function(ctx, node)
        if (len(variable) < 2 and not scalar) or ctx.point(out) is not None or _feeds_softmax(ctx, out):
            return  # with a non-scalar constant operand onnxruntime has no integer kernel (QLinearAdd/Mul)
        consumers = ctx.view.consumers(out)
        if len(consumers) == 1 and fused_activation(consumers[0]):
            return  # onnxruntime fuses the activation into QLinearAdd/QLinearMul: its output is the quantized one
        gate = _float_broadcast_operand(ctx, node, variable) if len(variable) == 2 else None
        if gate is not None:
            ctx.add_activation(gate, "broadcast_operand_quant", context_of(node.name or node.op_type),
                               f"float operand broadcast over a quantized tensor by {node.op_type} (its own range)",
                               gate.producer())
        if all(ctx.is_quantized(v) for v in variable):
            what = "a quantized tensor and a scalar constant" if scalar else "two quantized tensors"
            ctx.add_activation(out, f"activation_{node.op_type}_quant", node.name or node.op_type,
                               f"{node.op_type} of {what} (QLinear{node.op_type})", node)

    @staticmethod
    def _concat(ctx, node):
        inputs = _variable_inputs(ctx, node)
        if not any(ctx.carries_data(x) for x in inputs) or _feeds_softmax(ctx, node.outputs[0]):
            return  # constants computed at run time (spox's LSTM weights) or shape arithmetic (Resize scales)
        group = id(node)
        ctx_name = context_of(node.name or "Concat")
        members = []
        for x in inputs:
            point = ctx.point(x)
            if point is None:
                point = ctx.add_activation(x, "concat_input_quant", ctx_name, "Concat input (one range: the union)",
                                           x.producer(), group=group)
            if point is not None:
                members.append(point.root())
        members = _without_fused_activations(members)
        out = ctx.add_activation(node.outputs[0], "concat_quant", ctx_name, "Concat output (one range: the union)",
                                 node, group=group)
        if out is not None:
            members.append(out.root())
        _join(ctx, members, group)


BROADCAST_RATIO = 8  # a float operand this many times smaller than the quantized one gets its own quantizer


def _float_broadcast_operand(ctx: PlanContext, node: ir.Node, variable: list[ir.Value]) -> ir.Value | None:
    """The float operand of an Add/Mul of a quantized tensor and a float tensor at least ``BROADCAST_RATIO``
    times smaller (static shapes: a squeeze-excite gate [1, C, 1, 1] over a feature map), or None.

    Quantizing that small operand costs a QuantizeLinear on a few values and lets onnxruntime run the Add/Mul
    as QLinearAdd/QLinearMul; left in float, the large operand is dequantized, the op runs in float and its
    output is quantized again for the next layer. OpenVINO's OSNet-AIN person re-identifier (tf2onnx, Open
    Model Zoo's person-reidentification-retail-0287) computes 12 of its 24 gates as
    ``Sigmoid(affine(instance-norm(GAP(x))))``, the normalisation written out in float arithmetic, so the
    gate's input is not quantized (benchmarks/zoo/FINDINGS.md section 24)."""
    quantized = [v for v in variable if ctx.is_quantized(v)]
    if len(quantized) != 1 or not all(ctx.carries_data(v) for v in variable):
        return None
    small = variable[1] if quantized[0] is variable[0] else variable[0]
    if not ctx.is_float(small) or small.is_graph_input():
        return None
    big_size, small_size = ctx.static_size(quantized[0]), ctx.static_size(small)
    if big_size is None or small_size is None or small_size * BROADCAST_RATIO > big_size:
        return None
    return small


def _integer_gate(ctx: PlanContext, node: ir.Node) -> None:
    """A HardSigmoid of a quantized tensor: its output on the fixed range [0, 1], and the eval graph
    writes it as an integer Add (``onnx_rewrite.hard_activations``)."""
    point = ctx.add_activation(node.outputs[0], "gate_quant", context_of(node.name or node.op_type),
                               "HardSigmoid output: fixed range [0, 1] (integer Add)", node, fixed_range=GATE_RANGE)
    if point is not None and not point.exists and point.fixed_range == GATE_RANGE and not _is_integer_gate(ctx, node):
        ctx.plan.integer_gates.append(node)


def _is_integer_gate(ctx: PlanContext, node: ir.Node) -> bool:
    return any(g is node for g in ctx.plan.integer_gates)


def _without_fused_activations(inputs: list[ActivationPoint]) -> list[ActivationPoint]:
    """The Concat inputs that share the group's range.

    A quantizer right after a layer's Relu/Clip lets onnxruntime drop the activation into the
    layer's integer kernel only when its range starts at the activation's bound (zero point =
    qmin). Shared with a member that can be negative, the union would start below 0: the Relu
    would stay, and the layer with it would run in float (FusedConv). Such an input keeps its own
    range (QLinearConcat requantizes it); when every input ends in a Relu the union starts at 0
    and all share it.
    """
    if not any(m.after_activation for m in inputs):
        return inputs
    bounds = {_activation_bounds(m) for m in inputs}
    if len(bounds) == 1 and None not in bounds:
        return inputs  # all Relu, or all the same Clip: the union stays inside the activation's range
    return [m for m in inputs if not m.after_activation]


def _activation_bounds(point: ActivationPoint) -> tuple | None:
    """(low, high) of the Relu/Clip that produces ``point``'s tensor, None for another producer."""
    node = point.producer
    if node is None or node.domain != "" or node.op_type not in ("Relu", "Clip"):
        return None
    if node.op_type == "Relu":
        return (0.0, None)
    return clip_bounds(node)


def _join(ctx: PlanContext, members: list[ActivationPoint], group: int) -> None:
    """Put ``members`` (and every point already grouped with one of them) in one group."""
    old = {m.group for m in members if m.group is not None and m.group != group}
    for point in ctx.plan.activations:
        if point.group in old:
            point.group = group
    for m in members:
        if m.calibrated:
            m.group = group


class UnreadQuantizers(PlacementRule):
    """A quantizer whose producer runs in float anyway and that no integer op reads is dropped (in the
    eval and the training graph alike): it would only cost a Q/DQ pair.

    - a MatMul chain's output (TF's quantizer after the bias Add): with a symbolic batch onnxruntime
      runs ``DQ -> MatMul -> Add(bias)`` as MatMulIntegerToFloat with the bias folded in; a pair on its
      output read by float ops (GELU's Div/Erf, LayerNormalization) made it 0.66x float against
      0.42-0.55x without (benchmarks/zoo/FINDINGS.md, MatMul + bias); not where onnxruntime would make the
      MatMul a float Gemm with another computed tensor as its bias (``_fused_into_float_gemm``);
    - an Add/Mul with a float constant operand (TF's rule 4 counts a constant as quantized): there is no
      QLinearAdd/QLinearMul for it unless the constant is a scalar, and then only an integer reader
      makes it pay (GELU written out starts with ``x * 0.5``: a pair there would split the GELU);
    - the output of an Add/Mul of two quantized tensors or of an activation function (not Relu/Clip)
      that only float ops read: the inside of a GELU written out (tanh form: ``x * x``, ``x * x^2``,
      ``x + c x^3``, Tanh, read by Mul/Add with constants) would otherwise run as QLinearMul/QLinearAdd
      chains with a pair per step; without them onnxruntime fuses the GELU in float between
      MatMulIntegerToFloat and the next layer's pair (BERT at sequence 128: 0.49x float against
      0.53x, 48 Q/DQ left against 76; FINDINGS.md section 6). So does a transformer's residual stream
      (``x + attn(x)`` read by a LayerNormalization and the next residual Add): a float Add between
      MatMulIntegerToFloat's float output and the float LayerNormalization instead of Q -> QLinearAdd
      -> DQ (OCR recognizer, BERT, ViT: 2-3 % faster, FINDINGS.md section 9);
    - a pooled tensor that only float ops read: a LayerNorm written out (paddle2onnx, torch below opset
      17) starts with ``Sub(x, ReduceMean(x))``; a pair on the mean only rounded it and kept onnxruntime
      from fusing the LayerNorm;
    - a Concat output that only float ops read, with the input pairs that only this Concat needed; its
      other inputs get their own ranges back (the union is for QLinearConcat). A ViT's
      ``Concat(Expand(cls), patches)`` feeds ``Add(pos)`` and a LayerNormalization: on the union's
      grid the class token (|cls| < half a step) rounded to 0, which cost the zoo ViT 8 points of
      top-1 agreement with float (docs/spec-changes.md). So does one that is a graph output: a YOLOv8 head
      concatenates boxes in pixels (0-320) and class probabilities (0-1), which the union's grid (1.25 a
      step) rounded to 0 or 1.25. So does one read through shape ops, with the quantizers carried from it
      (YOLOv5's ``Concat(xy, wh, scores) -> Reshape -> Concat -> output``: scores on a grid of 2.8 pixels).
    - an activation function's output (not Relu/Clip) that is a graph output and that no integer op reads
      (YuNet's Sigmoid objectness and class scores, 12 outputs: 8-bit steps of 1/255 took the
      objectness to 9.9 dB SQNR against float for nothing);
    - a Softmax output that no integer op reads (a detector's class probabilities, read only by the
      user, directly or through Reshape/Flatten), with the quantizers carried from it: rounding the
      model's probabilities to 1/255 buys nothing, and costs a Q/DQ pair per carry and onnxruntime's
      Softmax twice its time (UltraFace, opset 9: ``Softmax -> Q/DQ -> Reshape -> Q/DQ -> scores``,
      the Softmax 458 us between two float tensors of the arena against 242 us writing the model
      output; FINDINGS.md section 15).
    Candidates go last to first in graph order, so a chain is dropped from its float end back (an
    Add/Mul reads as integer only while its own output is quantized).
    A Conv/Gemm output keeps its pair: QLinearConv and QGemm need it."""

    name = "unread quantizers"

    def candidates(self, ctx):
        sources = {id(p.source) for p in ctx.plan.activations if p.source is not None}
        order = {id(n): i for i, n in enumerate(ctx.graph)}
        points = [p for p in ctx.plan.activations if not p.exists and p.source is None and p.fixed_range is None
                  and (p.is_concat_output or p.group is None and _reshaped_gemm_end(ctx, p.value)
                       or id(p) not in sources and p.group is None and (
                      _matmul_chain_end(ctx, p.value) or _float_arithmetic(ctx, p.value)
                      or _float_read_computation(ctx, p.value) or p.kind == "pool_quant"))]
        points += [p for p in ctx.plan.activations if _is_softmax_output(p) and p.group is None]
        return sorted(points, key=lambda p: -order.get(id(p.value.producer()), -1))

    def check(self, ctx, point):
        softmax = _is_softmax_output(point)
        producer = point.value.producer()
        activation = (producer is not None and producer.domain == "" and producer.op_type in ACTIVATION_FUNCTIONS
                      and producer.op_type not in ("Relu", "Clip"))
        if not (point.is_concat_output or softmax or activation) and (point.value.is_graph_output()
                                                                      or ctx.view.is_graph_output(point.value)):
            return "a graph output"
        readers = _readers_through_carries(ctx, point.value)
        if any(_integer_reader(ctx, r) for r in readers):
            return "an integer op reads it"
        if (softmax or point.is_concat_output) and any(c.group is not None for c in _carried_from(ctx, point)):
            return "a quantizer carried from it is in a Concat group"
        return None

    def apply(self, ctx, point):
        if _is_softmax_output(point) or point.is_concat_output or _reshaped_gemm_end(ctx, point.value):
            for carried in _carried_from(ctx, point):
                ctx.drop_activation(carried)
        ctx.drop_activation(point)
        if point.is_concat_output:
            _drop_concat_group(ctx, point)


def _is_softmax_output(point: ActivationPoint) -> bool:
    producer = point.value.producer()
    return (not point.exists and point.source is None and point.fixed_range is None and producer is not None
            and producer.domain == "" and producer.op_type == "Softmax")


def _carried_from(ctx: PlanContext, point: ActivationPoint) -> list[ActivationPoint]:
    """The points that carry ``point``'s quantizer, directly or through other carried points."""
    found, frontier = [], {id(point)}
    while frontier:
        step = [p for p in ctx.plan.activations if p.source is not None and id(p.source) in frontier]
        found += step
        frontier = {id(p) for p in step}
    return found


def _drop_concat_group(ctx: PlanContext, output: ActivationPoint) -> None:
    """After a Concat's output pair: the input pairs that only the Concat needed go too, and the group
    goes when no Concat output is left in it (its members take their own ranges)."""
    sources = {id(p.source) for p in ctx.plan.activations if p.source is not None}
    for x in _variable_inputs(ctx, output.producer):
        point = ctx.point(x)
        if (point is not None and point.kind == "concat_input_quant" and point.group == output.group
                and id(point) not in sources
                and not any(_integer_reader(ctx, r) for r in _readers_through_carries(ctx, x))):
            ctx.drop_activation(point)
    members = ctx.plan.groups().get(output.group, [])
    if not any(m.is_concat_output for m in members):
        for m in members:
            m.group = None
        # a member that only the union kept: a Sigmoid's or Softmax's output (Yolo-FastestV2's objectness and
        # class scores, concatenated in float into the model output) needs no pair of its own either
        for m in members:
            root = m
            while root.source is not None:
                root = root.source
            if root in ctx.plan.activations and _float_root_unread(ctx, root):
                for carried in _carried_from(ctx, root):
                    ctx.drop_activation(carried)
                ctx.drop_activation(root)


def _float_root_unread(ctx: PlanContext, root: ActivationPoint) -> bool:
    """``root`` is a Softmax/activation output's own quantizer that no integer op reads (through the
    quantizers carried from it), in no Concat group, and no graph output (a Softmax's may be)."""
    if root.exists or root.fixed_range is not None or root.group is not None or root.is_concat_output:
        return False
    if not (_is_softmax_output(root) or _float_read_computation(ctx, root.value)):
        return False
    if not _is_softmax_output(root) and (root.value.is_graph_output() or ctx.view.is_graph_output(root.value)):
        return False
    if any(c.group is not None for c in _carried_from(ctx, root)):
        return False
    return not any(_integer_reader(ctx, r) for r in _readers_through_carries(ctx, root.value))


def _float_arithmetic(ctx: PlanContext, value: ir.Value) -> bool:
    """An Add/Mul with a constant operand made ``value`` (with a scalar one it runs in integers, but
    only an integer reader makes that worth a pair)."""
    producer = value.producer()
    return (producer is not None and producer.domain == "" and producer.op_type in ("Add", "Mul")
            and len(_variable_inputs(ctx, producer)) < 2)


def _float_read_computation(ctx: PlanContext, value: ir.Value) -> bool:
    """An Add/Mul of two activations or an activation function other than Relu/Clip made ``value``."""
    producer = value.producer()
    if producer is None or producer.domain != "":
        return False
    if producer.op_type in ("Add", "Mul"):
        return len(_variable_inputs(ctx, producer)) == 2
    return producer.op_type in ACTIVATION_FUNCTIONS and producer.op_type not in ("Relu", "Clip")


def _matmul_chain_end(ctx: PlanContext, value: ir.Value) -> bool:
    producer = value.producer()
    if producer is None or producer.domain != "":
        return False
    if producer.op_type == "Add":  # the bias Add of a MatMul
        inputs = [ctx.view.input(producer, i) for i in range(len(producer.inputs))]
        layers = [v.producer() for v in inputs if v is not None and v.producer() is not None]
        return any(p.op_type == "MatMul" and is_layer(p) for p in layers) and any(is_constant(v) for v in inputs
                                                                                  if v is not None)
    return (producer.op_type == "MatMul" and len(_variable_inputs(ctx, producer)) == 1
            and not _fused_into_float_gemm(ctx, producer))


def _reshaped_gemm_end(ctx: PlanContext, value: ir.Value) -> bool:
    """``value`` is the output of a Linear on a token tensor written ``Reshape -> Gemm -> Reshape`` (what the eval
    graph makes of a MatMul + bias Add on an input with symbolic dims: ``linear_gemms``): a Gemm whose input is a
    Reshape's output and whose only reader is a Reshape. Its pair goes where no integer op reads it, as a MatMul
    chain's (and the one the Reshape carries with it): rewriting qtool's own output again adds nothing."""
    producer = value.producer()
    if producer is None or producer.domain != "" or producer.op_type != "Gemm" or not producer.inputs:
        return False
    source = ctx.view.input(producer, 0)
    reshape = source.producer() if source is not None else None
    readers = ctx.view.consumers(value)
    return (reshape is not None and reshape.domain == "" and reshape.op_type == "Reshape" and len(readers) == 1
            and readers[0].domain == "" and readers[0].op_type == "Reshape")


def _fused_into_float_gemm(ctx: PlanContext, matmul: ir.Node) -> bool:
    """onnxruntime's MatMulAddFusion makes a MatMul whose only reader is an Add of another computed tensor
    (a written-out LSTM cell: ``x W + h R``, keras2onnx's DTLN) a Gemm with that tensor as its bias ``C``
    where the MatMul's input is 2-D or static (:func:`becomes_gemm`), also between DequantizeLinears; no QDQ
    fusion takes a Gemm with a float ``C``, so it ran in float on a weight dequantized at every run
    (DTLN's second model 3x float's time: benchmarks/zoo/FINDINGS.md section 18). A pair on the MatMul's
    output keeps it a MatMul (QLinearMatMul)."""
    readers = ctx.view.consumers(matmul.outputs[0])
    if len(readers) != 1 or readers[0].domain != "" or readers[0].op_type != "Add" or not becomes_gemm(matmul):
        return False
    others = [ctx.view.input(readers[0], i) for i in range(len(readers[0].inputs))]
    others = [v for v in others if v is not None and v is not matmul.outputs[0]]
    return bool(others) and not any(is_constant(v) for v in others)


def _readers_through_carries(ctx: PlanContext, value: ir.Value) -> list[ir.Node]:
    readers, stack, seen = [], [value], set()
    while stack:
        v = stack.pop()
        for user in ctx.view.consumers(v):
            if id(user) in seen:
                continue
            seen.add(id(user))
            if user.domain == "" and user.op_type in CARRY_OPS:
                stack.extend(o for o in user.outputs if o is not None)
            else:
                readers.append(user)
    return readers


def _integer_reader(ctx: PlanContext, node: ir.Node) -> bool:
    """``node`` runs in integers in onnxruntime when its inputs are quantized."""
    if is_layer(node) or node.domain != "":
        return is_layer(node)
    if _is_integer_gate(ctx, node):
        return True
    if node.op_type not in INTEGER_KERNELS:
        return False
    if node.op_type in ("Add", "Mul"):
        variable = _variable_inputs(ctx, node)
        if len(variable) < 2 and scalar_operand(node) is None:
            return False  # with a non-scalar float constant operand there is no QLinearAdd/QLinearMul
        if not all(ctx.is_quantized(v) for v in variable):
            return False  # one operand float (a GELU's 1 + erf): the Add/Mul runs in float
        if _fused_activation(ctx, node):
            # Add/Mul -> Relu/Clip whose output is quantized: onnxruntime fuses the activation into QLinearAdd /
            # QLinearMul (CSRNet's modulation Mul -> Add -> residual Add -> Relu: read as float, the two before
            # lost their quantizers and all three ran in float on full-size maps, 0.74x float against
            # onnxruntime's tool's 0.39x)
            return True
    return all(ctx.point(o) is not None for o in node.outputs if o is not None)


RECURRENT_OPS = ("LSTM", "GRU", "RNN")
DYNAMIC_LSTM, DYNAMIC_LSTM_DOMAIN = "DynamicQuantizeLSTM", "com.microsoft"
DYNAMIC_LSTM_MAX_BITS = 8  # its weights are int8/uint8


def _weight_rank(value: ir.Value) -> int | None:
    if value.const_value is not None:
        return len(value.const_value.shape)
    if value.shape is not None:
        return len(value.shape)
    array = constant_array(value)  # computed through its chain (an Unsqueeze of a Constant has no shape info)
    return None if array is None else array.ndim


class RecurrentLayers(PlacementRule):
    """An LSTM runs as ``com.microsoft.DynamicQuantizeLSTM`` with int8 weights (module docstring);
    GRU and RNN stay float: onnxruntime has no integer kernel for them."""

    name = "recurrent layers"

    def candidates(self, ctx):
        return [n for n in ctx.graph if n.domain == "" and n.op_type in RECURRENT_OPS]

    def check(self, ctx, node):
        ctx.handled.add(id(node))
        if node.op_type != "LSTM":
            return (f"onnxruntime has no integer kernel for {node.op_type} (no DynamicQuantize{node.op_type}, "
                    "and its QDQ path has no selector for it): it runs in float")
        if ctx.config.float_rnn or ctx.config.standard_ops:
            return f"kept in float ({'--float-rnn' if ctx.config.float_rnn else '--standard-ops'})"
        reason = ctx.config.out_of_scope(node)
        if reason is not None:
            return f"weights not quantized: {reason}"
        if ctx.config.weight_bits > DYNAMIC_LSTM_MAX_BITS:
            return (f"DynamicQuantizeLSTM takes weights of {DYNAMIC_LSTM_MAX_BITS} bits at most "
                    f"(--weight-bits {ctx.config.weight_bits}): it runs in float")
        if int_attr(node, "layout", 0) != 0:
            return "layout=1 (batch first): DynamicQuantizeLSTM has no layout attribute; it runs in float"
        for index, what in ((1, "W"), (2, "R")):
            w = node.inputs[index] if len(node.inputs) > index else None
            if w is None or not is_constant(w):
                return f"weights not quantized: {what} is not a constant ({not_constant_reason(w)})"
            if constant_dtype(w) != ir.DataType.FLOAT:
                return f"weights not quantized: {what} is not float32"
            if _weight_rank(w) != 3:
                return f"weights not quantized: {what} is not 3-D"
        return None

    def apply(self, ctx, node):
        per_channel = ctx.config.per_channel
        symmetric = ctx.config.weights_symmetric or per_channel
        note = None
        if symmetric != ctx.config.weights_symmetric:
            note = ("asymmetric per-channel weights: DynamicQuantizeLSTM needs int8 per-channel zero points "
                    "of 0, so its weights are symmetric per channel")
        ctx.plan.recurrent.append(RecurrentPoint(node, per_channel, symmetric, node.name or "LSTM",
                                                 note))


class FloatOps(PlacementRule):
    """Not a placement: every op that stays in float, with its reason (the report), and the counts."""

    name = "float ops"

    def candidates(self, ctx):
        skip = {"Constant", QUANTIZE, DEQUANTIZE}
        return [n for n in ctx.graph if n.op_type not in skip and not is_layer(n) and not _recurrent(n)]

    def apply(self, ctx, node):
        inputs = [v for v in node.inputs if v is not None]
        if inputs and all(is_constant(v) for v in inputs):
            return  # computes a constant (a weight's Transpose/Cast, a Clip bound): not float work
        outputs = [o for o in node.outputs if o is not None]
        if outputs and not any(ctx.carries_data(o) for o in outputs):
            return  # shape arithmetic (Shape -> Gather -> Concat of a dynamic batch): no activation's values
        outputs_quantized = all(ctx.point(o) is not None for o in node.outputs if o is not None)
        variable = _variable_inputs(ctx, node)
        # a Resize's scales computed from a Shape are no data: its integer kernel reads the data input only;
        # nor are its roi / scales / sizes given as graph inputs (MMDeploy's SRCNN tutorial export: ``factor``)
        read = variable if node.op_type not in ("Resize", "Upsample") else [v for v in variable if v is node.inputs[0]]
        inputs_quantized = all(ctx.is_quantized(v) for v in read if ctx.carries_data(v))
        if (node.domain == "" and node.op_type in INTEGER_KERNELS and outputs_quantized and inputs_quantized
                and not _constant_operand(ctx, node)):
            return
        if _is_integer_gate(ctx, node):
            return  # a HardSigmoid written as an integer Add (QLinearAdd)
        if id(node) in ctx.handled and outputs_quantized:
            return  # a layer chain's bias Add or activation: fused into the layer's integer kernel
        if inputs_quantized and _fused_activation(ctx, node):
            return  # Add/Mul -> Relu/Clip: onnxruntime fuses the activation into QLinearAdd/QLinearMul
        ctx.plan.other_ops[node.op_type] += 1
        ctx.plan.float_ops.append(LeftInFloat(node.name, node.op_type, _float_reason(ctx, node, variable)))


def _constant_operand(ctx: PlanContext, node: ir.Node) -> bool:
    """An Add/Mul with a non-scalar constant operand: onnxruntime runs it in float."""
    return (node.op_type in ("Add", "Mul") and len(_variable_inputs(ctx, node)) < 2
            and scalar_operand(node) is None)


class ScalarOperands(PlacementRule):
    """Not a placement: the Add/Mul of a quantized tensor and a scalar constant whose output kept its
    quantizer go to ``plan.scalar_operands``, ``(node, constant input index)``: the eval graph reads the
    constant through its own DequantizeLinear (QLinearAdd/QLinearMul need one on each input)."""

    name = "scalar operands"

    def candidates(self, ctx):
        return [n for n in ctx.graph if scalar_operand(n) is not None]

    def apply(self, ctx, node):
        x = node.inputs[1 - scalar_operand(node)]
        if ctx.point(node.outputs[0]) is not None and ctx.is_quantized(x):
            ctx.plan.scalar_operands.append((node, scalar_operand(node)))


def _recurrent(node: ir.Node) -> bool:
    """LSTM/GRU/RNN (their rule reports them) and a DynamicQuantizeLSTM qtool wrote (integer)."""
    return ((node.domain == "" and node.op_type in RECURRENT_OPS)
            or (node.domain == DYNAMIC_LSTM_DOMAIN and node.op_type == DYNAMIC_LSTM))


def _fused_activation(ctx: PlanContext, node: ir.Node) -> bool:
    """An Add/Mul whose only consumer is a Relu/Clip with a quantized output."""
    if node.op_type not in ("Add", "Mul") or not node.outputs:
        return False
    consumers = ctx.view.consumers(node.outputs[0])
    return (len(consumers) == 1 and consumers[0].op_type in ("Relu", "Clip")
            and ctx.point(consumers[0].outputs[0]) is not None)


def _float_reason(ctx: PlanContext, node: ir.Node, variable: list[ir.Value]) -> str:
    if node.domain != "":
        return f"custom op ({node.domain}): no integer kernel"
    if node.op_type not in INTEGER_KERNELS:
        return f"onnxruntime has no integer kernel for {node.op_type}: it runs in float"
    if _feeds_softmax(ctx, node.outputs[0]) if node.outputs else False:
        return "it feeds a Softmax (kept float so an attention mask is not clipped)"
    missing = [v.name for v in variable if not ctx.is_quantized(v)]
    if missing:
        return f"input '{missing[0]}' is not quantized"
    if _constant_operand(ctx, node):
        return "onnxruntime has no integer kernel for an Add/Mul with a non-scalar constant operand"
    return "its output is not quantized"


INTEGER_RULES: tuple[PlacementRule, ...] = (IntegerOps(), LayerInputs(), IntegerOps(), UnreadQuantizers(),
                                             SaturatingConsumers(), RecurrentLayers(), ScalarOperands(), FloatOps())


def becomes_gemm(matmul: ir.Node) -> bool:
    """Whether onnxruntime's MatMulAddFusion turns ``matmul`` + its bias Add into a Gemm: when the
    MatMul's input is 2-D or its shape is static (benchmarks/zoo/FINDINGS.md, rule 3). A 3-D input with
    a symbolic batch axis (a transformer's [batch, tokens, dim]) stays a MatMul, run as
    MatMulIntegerToFloat followed by the float bias Add (an int32 bias there alone added a DequantizeLinear
    per layer: the zoo's BERT went from 0.91x to 1.06x float); the eval graph writes it as a Gemm itself
    (``linear_gemms.reshapes_to_gemm``). Unknown shapes: assume a Gemm (the int32 bias is then what the
    optimized session computes, optimizations on or off)."""
    x = matmul.inputs[0] if matmul.inputs else None
    if x is None:
        return True
    if x.shape is not None:
        shape = tuple(d if isinstance(d, int) else None for d in x.shape)
    else:
        graph = matmul.graph
        shape = inferred_shapes(graph).get(x.name) if graph is not None else None
    if shape is None:
        return True
    return len(shape) <= 2 or all(d is not None for d in shape)
