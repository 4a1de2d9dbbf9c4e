"""The training graph's encoding (spec/rewrites.md sections 4 and 5), and its removal.

A :class:`~qtool.onnx_rewrite.placement.QuantPlan` (computed on the eval fold
of the model, so both rewrites place quantizers by the same rules) becomes:

- **weights**: ``qtool::FakeQuant(w, min, max, num_bits, narrow_range=1)``
  with ``min``/``max`` recomputed every step from the current weight
  (``ReduceMin``/``ReduceMax`` over all axes but the output channel, shape
  ``[C, 1, 1, 1]`` for a Conv; scalars per tensor), widened to contain 0, or
  made symmetric with TF's ratio. For a folded batch norm ``w`` is the
  folded weight ``w * gamma / sigma_mv``.
- **activations**: state initializers ``<quantizer>/min`` and ``/max``
  (initial values from calibration, else (-6, 6), or (0, 6) after
  Relu/Clip), updated with the batch's range (widened to 0, or symmetric)::

      min' = min - (min - batch_min) * float32(1 - 0.999)      # TF's assign_moving_average

  and ``FakeQuant(x, min', max')`` uses the updated values (TF consumes the
  assign outputs), also during the quant delay.
- **integer HardSigmoid gates** (``plan.integer_gates``, ``hard_activations``): the gate
  ``g = HardSigmoid(x)``, whose range is the fixed [0, 1] (constants ``<quantizer>/min``,
  ``/max``; scale ``s``), is computed from ``x`` in the eval graph's float32 operations,
  ``Mul(FakeQuant(Clip(Div(Add(x, beta/alpha), s/alpha), 0, 255), 0, 255), s)``; the FakeQuant
  on the levels has scale 1 and only rounds. ``HardSigmoid(x)`` stays in the graph: the quant
  delay's ``Where`` reads it, and removing the quantizer gives its readers back to it.
- **quant delay**: ``Where(qtool_step >= quant_delay, FakeQuant(x), x)``
  when ``quant_delay > 0``.
- **state**: every state initializer is also a graph input (so a training
  loop can feed it back) and has a graph output ``<state>:updated``.
  ``metadata_props["qtool.training"]`` records the contract as JSON; see
  :func:`training_contract` and ``docs/training.md``.

:func:`strip_training_graph` undoes the encoding from the metadata: the
float graph (batch norms restored with the trained moving statistics) and
the trained activation ranges, for ``rewrite_eval``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper
import onnx_ir as ir

from qtool.errors import QtoolError
from qtool.onnx_rewrite import fake_quant_function as fqf
from qtool.onnx_rewrite._train_ops import Ops
from qtool.onnx_rewrite.branches import BRANCHES, extract_branch, replace_if
from qtool.config import QuantConfig
from qtool.model.codec import bias_fit_factor, symmetric_ratio, widen
from qtool.model.io import load_model
from qtool.model.validate import check_finite_parameters
from qtool.onnx_rewrite.hard_activations import gate_shift

METADATA_KEY = "qtool.training"
CONTRACT_VERSION = 1
STEP_INPUT = "qtool_step"
# a float scalar input, 1 by default (an initializer of the same name): the share of each batch's range that
# the activation ranges take in; 0 holds them (evaluation: the graph then computes what rewrite-eval deploys)
RANGE_UPDATE_INPUT = "qtool_range_update"
UPDATED_SUFFIX = ":updated"
EMA_DECAY = 0.999
SHARED_PREFIX = "qtool"  # shared nodes: qtool/activate_quant, qtool/use_moving_average


# --- the plan, as the training encoder receives it ---------------------------------------------
@dataclass
class TrainWeightPoint:
    name: str  # quantizer name, e.g. conv1/weights_quant
    layers: list[ir.Node]
    axis: int | None


@dataclass
class TrainActivationPoint:
    name: str  # quantizer name, e.g. conv1/act_quant
    value: ir.Value
    kind: str
    rule: str
    initial: tuple[float, float]
    range_source: str  # calibration | default | fixed
    shares: str | None = None  # the key of the range it uses when not its own (a carried or grouped point)
    key: str | None = None  # the key others share it by (its tensor, or its group)
    batch_values: list[ir.Value] = field(default_factory=list)  # a group's tensors: one EMA over their union
    bound: tuple[float, float] | None = None  # the batch range is clipped to it (ActivationPoint.bound)
    gate: tuple[float, float] | None = None  # an integer HardSigmoid gate: its (alpha, beta)


@dataclass
class TrainBiasPoint:
    name: str  # quantizer name, e.g. conv1/bias_quant
    layer: ir.Node
    bias: ir.Value  # the bias the layer adds (a [C] vector)
    uses: list  # (node, input index) that read it
    channels: int
    per_channel: bool = True  # one weight scale per output-channel-axis entry (else one per tensor)
    groups: int = 1  # a grouped ConvTranspose repeats its weight scales per group
    saturate: bool = True  # int32 saturation (the eval graph's rule when 8-bit kernels may run the layer)
    widen_weight: bool = False  # the weight range widened so that the bias fits int32 (``_widen_for_bias``)


@dataclass
class TrainEncoding:
    weights: list[dict] = field(default_factory=list)
    activations: list[dict] = field(default_factory=list)
    biases: list[dict] = field(default_factory=list)
    state: dict[str, str] = field(default_factory=dict)  # state -> updated output
    left_in_float: list[dict] = field(default_factory=list)


def step_at_least(ops: Ops, step: ir.Value, delay: int, base: str) -> ir.Value:
    c = ops.const(f"{base}/delay", np.asarray(delay, np.int64), np.int64)
    return ops.op("GreaterOrEqual", [step, c], base, dtype=ir.DataType.BOOL, shape=[])


class TrainEncoder:
    def __init__(self, graph: ir.Graph, ops: Ops, config: QuantConfig, step: ir.Value, quant_delay: int,
                 range_update: ir.Value | None = None):
        self.graph = graph
        self.ops = ops
        self.config = config
        self.step = step
        self.range_update = range_update
        self.active = step_at_least(ops, step, quant_delay, f"{SHARED_PREFIX}/activate_quant") \
            if quant_delay > 0 else None
        self.result = TrainEncoding()
        self.updates: dict[str, ir.Value] = {}  # state name -> value of its update
        # key (tensor or group) -> (updated min, updated max, min name, max name, initial range)
        self.ranges: dict[str, tuple] = {}
        self.range_readers: set[int] = set()  # the batch min/max nodes: they read the float tensors

    # --- pieces ------------------------------------------------------------------------------
    def _widen(self, lo: ir.Value, hi: ir.Value, bits: int, narrow: bool, base: str, symmetric: bool):
        ops = self.ops
        if symmetric:
            r = ops.const(f"{base}/min_max_ratio", symmetric_ratio(bits, narrow))
            new_lo = ops.op("Min", [lo, ops.op("Div", [hi, r], f"{base}/max_over_ratio")], f"{base}/range_min")
            new_hi = ops.op("Max", [hi, ops.op("Mul", [lo, r], f"{base}/min_times_ratio")], f"{base}/range_max")
            return new_lo, new_hi
        zero = ops.const(f"{base}/zero", np.float32(0))
        return (ops.op("Min", [lo, zero], f"{base}/range_min"), ops.op("Max", [hi, zero], f"{base}/range_max"))

    def _fake_quant_node(self, x: ir.Value, lo: ir.Value, hi: ir.Value, bits: int, narrow: bool, base: str) -> ir.Value:
        attributes = {"num_bits": int(bits), "narrow_range": int(narrow)}
        if self.config.half_to_even:  # absent: TF's half up (the function's default)
            attributes["half_to_even"] = 1
        return self.ops.op(fqf.NAME, [x, lo, hi], f"{base}/FakeQuant", attributes, domain=fqf.DOMAIN, shape=x.shape)

    def _delayed(self, quantized: ir.Value, x: ir.Value, base: str) -> ir.Value:
        """``quantized`` once the quant delay has passed, ``x`` before."""
        if self.active is None:
            return quantized
        return self.ops.op("Where", [self.active, quantized, x], f"{base}/delayed_quant", shape=x.shape)

    def _fake_quant(self, x: ir.Value, lo: ir.Value, hi: ir.Value, bits: int, narrow: bool, base: str) -> ir.Value:
        return self._delayed(self._fake_quant_node(x, lo, hi, bits, narrow, base), x, base)

    def _integer_gate(self, gate: ir.Value, lo: ir.Value, hi: ir.Value, alpha_beta, base: str) -> ir.Value:
        """The eval graph's integer HardSigmoid (``EvalEncoder.encode_gate``) op by op, from the HardSigmoid's
        input ``x``: ``Add(x, beta/alpha)``, QuantizeLinear's quotient by ``s/alpha`` (``s``: the scale of the
        gate's range ``[lo, hi]``), its saturation ``Clip(0, 255)`` and rounding (a FakeQuant on the levels:
        range [0, 255], scale 1), the DequantizeLinear's ``Mul(s)``; ``HardSigmoid(x)`` during the quant delay."""
        ops = self.ops
        bits = self.config.activation_bits
        alpha = ops.const(f"{base}/alpha", np.float32(alpha_beta[0]))
        shift = ops.const(f"{base}/shift", gate_shift(*alpha_beta))
        scale = self._range_scale(lo, hi, bits, False, f"{base}/scale")
        x = gate.producer().inputs[0]
        total = ops.op("Add", [x, shift], f"{base}/sum", shape=x.shape)
        quotient = ops.op("Div", [total, ops.op("Div", [scale, alpha], f"{base}/quantize_scale", shape=[])],
                          f"{base}/quotient", shape=x.shape)
        level_min = ops.const(f"{base}/level_min", np.float32(0))
        level_max = ops.const(f"{base}/level_max", np.float32(2**bits - 1))
        # the FakeQuant clamps too; the Clip keeps the gate a HardSigmoid where FakeQuant is the identity
        # (the float model, finetune's teacher)
        clipped = ops.op("Clip", [quotient, level_min, level_max], f"{base}/saturated", shape=x.shape)
        levels = self._fake_quant_node(clipped, level_min, level_max, bits, False, base)
        out = ops.op("Mul", [levels, scale], f"{base}/dequantized", shape=gate.shape)
        return self._delayed(out, gate, base)

    # --- weights ---------------------------------------------------------------------------------
    def encode_weight(self, point: TrainWeightPoint, weight: ir.Value, rank: int) -> None:
        cfg = self.config
        ops = self.ops
        base = ops.names.prefix(point.name)
        if point.axis is None:
            axes = None
            keep = False
        else:
            axes = [a for a in range(rank) if a != point.axis]
            keep = True
        lo = ops.reduce("ReduceMin", weight, axes, keep, f"{base}/BatchMin")
        hi = ops.reduce("ReduceMax", weight, axes, keep, f"{base}/BatchMax")
        lo, hi = self._widen(lo, hi, cfg.weight_bits, True, base, cfg.weights_symmetric)
        q = self._fake_quant(weight, lo, hi, cfg.weight_bits, True, base)
        for layer in point.layers:
            for i, v in enumerate(layer.inputs):
                if v is weight and i == 1:
                    layer.replace_input_with(1, q)
        self.result.weights.append({
            "quantizer": base,
            "layers": [n.name for n in point.layers],
            "op": point.layers[0].op_type,
            "input": weight.name,
            "output": q.name,
            "axis": point.axis,
            "bits": cfg.weight_bits,
        })

    def encode_recurrent(self, name: str, layer: ir.Node, per_channel: bool, symmetric: bool) -> None:
        """An LSTM's ``W`` and ``R`` fake-quantized on the grid ``DynamicQuantizeLSTM`` is given in the
        eval graph (``codec.dynamic_lstm_weight``): ranges per (direction, gate row), ``[D, 4H, 1]``,
        or one per tensor. The kernel's run-time quantization of the input and hidden state is not
        modelled (its ranges are each matrix's own, known only at run time)."""
        cfg, ops = self.config, self.ops
        for index, what in ((1, "W"), (2, "R")):
            weight = layer.inputs[index]
            base = ops.names.prefix(f"{name}/{what}")
            axes = [2] if per_channel else None
            lo = ops.reduce("ReduceMin", weight, axes, per_channel, f"{base}/BatchMin")
            hi = ops.reduce("ReduceMax", weight, axes, per_channel, f"{base}/BatchMax")
            lo, hi = self._widen(lo, hi, cfg.weight_bits, True, base, symmetric)
            q = self._fake_quant(weight, lo, hi, cfg.weight_bits, True, base)
            layer.replace_input_with(index, q)
            self.result.weights.append({
                "quantizer": base,
                "layers": [layer.name],
                "op": layer.op_type,
                "input": weight.name,
                "output": q.name,
                "axis": [0, 1] if per_channel else None,
                "bits": cfg.weight_bits,
                "symmetric": symmetric,
            })

    # --- biases ------------------------------------------------------------------------------------
    def _scale(self, fq: ir.Node, base: str) -> ir.Value:
        """The scale a FakeQuant node quantizes with (:meth:`_range_scale`)."""
        bits = fq.attributes["num_bits"].as_int() if "num_bits" in fq.attributes else 8
        narrow = fq.attributes["narrow_range"].as_int() if "narrow_range" in fq.attributes else 0
        return self._range_scale(fq.inputs[1], fq.inputs[2], bits, bool(narrow), base)

    def _range_scale(self, lo: ir.Value, hi: ir.Value, bits: int, narrow: bool, base: str) -> ir.Value:
        """The scale of the range ``[lo, hi]``, ``(max - min) / (qmax - qmin)`` in the FakeQuant function's
        float32 operations, 1 where that is not a normal float32 (as the eval graph's parameters)."""
        ops = self.ops
        qrange = ops.const(f"{base}/levels", np.float32((2**bits - 1) - (1 if narrow else 0)))
        raw = ops.op("Div", [ops.op("Sub", [hi, lo], f"{base}/range"), qrange], f"{base}/raw")
        tiny = ops.op("Less", [raw, ops.const(f"{base}/flt_min", np.finfo(np.float32).tiny)], f"{base}/degenerate",
                      dtype=ir.DataType.BOOL)
        return ops.op("Where", [tiny, ops.const(f"{base}/one", np.float32(1.0)), raw], base)

    def _widen_for_bias(self, point: TrainBiasPoint, w_fq: ir.Node, s_in: ir.Value, base: str) -> None:
        """TFLite's AdjustWeightsForBiasScale, every step: the weight FakeQuant's per-channel range
        ``[lo, hi]`` becomes ``[min(lo, -m), max(hi, m)]`` with ``m = (|b| / input_scale) * k``,
        ``k = float32((2**(bits-1) - 1) * (1 + 2**-16) / (2**31 - 1))``, so the weight scale is at least
        ``|b| / (input_scale * (2**31 - 1))`` and the bias code fits int32 (a batch norm's dead channel: tiny
        weights beside a large folded bias). A channel whose range is wider is unchanged (``Max``/``Min``);
        the widened range contains the channel's weights, so the weight's straight-through gradient is the
        identity there, and a weight range gets no gradient (last-value ranges). ``rewrite-eval`` of the graph
        repeats these float32 operations (``eval_graph.QuantizeBias``)."""
        ops = self.ops
        bits = w_fq.attributes["num_bits"].as_int() if "num_bits" in w_fq.attributes else 8
        k = bias_fit_factor(bits)
        lo, hi = w_fq.inputs[1], w_fq.inputs[2]
        at = f"{base}/weight_widening"
        code = ops.op("Div", [ops.op("Abs", [point.bias], f"{at}/abs_bias"), s_in], f"{at}/bias_code")
        half = ops.op("Mul", [code, ops.const(f"{at}/factor", k)], f"{at}/half_range")
        shape = ops.op("Shape", [lo], f"{at}/range_shape", dtype=ir.DataType.INT64)
        half = ops.op("Reshape", [half, shape], f"{at}/per_channel")
        new_lo = ops.op("Min", [lo, ops.op("Neg", [half], f"{at}/neg")], f"{at}/min")
        new_hi = ops.op("Max", [hi, half], f"{at}/max")
        w_fq.replace_input_with(1, new_lo)
        w_fq.replace_input_with(2, new_hi)

    def encode_bias(self, point: TrainBiasPoint, x_fq: ir.Node, w_fq: ir.Node) -> None:
        """The deployed int32 bias in float: ``qtool::FakeQuantBias(b, input_scale * weight_scale)`` with
        the scales of the FakeQuant nodes on the layer's input and weight (the input's range as updated
        by this batch, as its FakeQuant uses it); with ``point.widen_weight``, the weight's range first
        widened where the bias would not fit int32 (:meth:`_widen_for_bias`)."""
        ops = self.ops
        base = ops.names.prefix(point.name)
        s_in = self._scale(x_fq, f"{base}/input_scale")
        if point.widen_weight:
            self._widen_for_bias(point, w_fq, s_in, base)
        s_w = self._scale(w_fq, f"{base}/weight_scale")
        if point.per_channel:
            s_w = ops.reshape(s_w, [-1], f"{base}/weight_scale_vector")
            if point.groups > 1:
                repeats = ops.const(f"{base}/groups", np.asarray([point.groups], np.int64), np.int64)
                s_w = ops.op("Tile", [s_w, repeats], f"{base}/weight_scale_per_output")
        b_scale = ops.op("Mul", [s_in, s_w], f"{base}/scale")
        q = ops.op(fqf.BIAS_NAME, [point.bias, b_scale], f"{base}/FakeQuantBias",
                   {"saturate": int(point.saturate)}, domain=fqf.DOMAIN, shape=point.bias.shape)
        if self.active is not None:
            q = ops.op("Where", [self.active, q, point.bias], f"{base}/delayed_quant", shape=point.bias.shape)
        for node, index in point.uses:
            node.replace_input_with(index, q)
        self.result.biases.append({
            "quantizer": base,
            "layer": point.layer.name,
            "input": point.bias.name,
            "output": q.name,
            "saturate": bool(point.saturate),
        })
        if point.widen_weight:
            self.result.biases[-1]["widen_weight"] = True

    # --- activations -------------------------------------------------------------------------------
    def encode_activation(self, point: TrainActivationPoint) -> None:
        cfg = self.config
        value, tensor = point.value, point.value.name
        base = self.ops.names.prefix(point.name)
        entry = {"quantizer": base, "tensor": tensor, "kind": point.kind, "rule": point.rule, "input": tensor,
                 "range_source": point.range_source, "bits": cfg.activation_bits}
        if point.bound is not None:
            entry["bound"] = [b if math.isfinite(b) else None for b in point.bound]
        if point.shares is not None and point.shares in self.ranges:
            new_min, new_max, lo_name, hi_name, initial = self.ranges[point.shares]
        elif point.range_source == "fixed":
            lo0, hi0 = _widen_numpy(*point.initial, cfg.activation_bits, cfg.symmetric)
            new_min = self.ops.const(f"{base}/min", lo0)
            new_max = self.ops.const(f"{base}/max", hi0)
            lo_name, hi_name, initial = new_min.name, new_max.name, [float(lo0), float(hi0)]
        else:
            new_min, new_max, lo_name, hi_name, initial = self._ema_range(point, base)
        if point.key is not None:
            self.ranges[point.key] = (new_min, new_max, lo_name, hi_name, initial)
        # the batch range reads the float tensor: every other reader reads the fake-quantized one
        uses = [(node, i) for node, i in value.uses() if id(node) not in self.range_readers]
        outputs = [i for i, out in enumerate(self.graph.outputs) if out is value]
        if point.gate is not None:
            q = self._integer_gate(value, new_min, new_max, point.gate, base)
            entry["gate"] = {"alpha": float(point.gate[0]), "beta": float(point.gate[1])}
        else:
            q = self._fake_quant(value, new_min, new_max, cfg.activation_bits, False, base)
        for node, index in uses:
            node.replace_input_with(index, q)
        if outputs:
            value.name = self.ops.names.value(f"{tensor}/float")
            q.name = tensor
            for i in outputs:
                self.graph.outputs[i] = q
        q.dtype = ir.DataType.FLOAT
        entry.update({"input": value.name, "output": q.name, "min": lo_name, "max": hi_name, "initial_range": initial})
        self.result.activations.append(entry)

    def _bounded(self, lo: ir.Value, hi: ir.Value, bound, base: str) -> tuple[ir.Value, ir.Value]:
        """The batch range clipped to the point's bound (where its consumers saturate), as the initial range."""
        if bound is None:
            return lo, hi
        if math.isfinite(bound[0]):
            lo = self.ops.op("Max", [lo, self.ops.const(f"{base}/bound_min", np.float32(bound[0]))], f"{base}/BoundMin")
        if math.isfinite(bound[1]):
            hi = self.ops.op("Min", [hi, self.ops.const(f"{base}/bound_max", np.float32(bound[1]))], f"{base}/BoundMax")
        return lo, hi

    def _ema_range(self, point: TrainActivationPoint, base: str):
        """State ``<base>/min``/``max`` and their update with the batch's range (TF's EMA), over the
        point's tensor and its group's."""
        cfg, ops = self.config, self.ops
        lo0, hi0 = _widen_numpy(*point.initial, cfg.activation_bits, cfg.symmetric)
        min_state = ops.state(f"{base}/min", lo0)
        max_state = ops.state(f"{base}/max", hi0)
        values = point.batch_values or [point.value]  # a group: its members (the Concat inputs)
        lows = [ops.reduce("ReduceMin", v, None, False, f"{base}/BatchMin") for v in values]
        highs = [ops.reduce("ReduceMax", v, None, False, f"{base}/BatchMax") for v in values]
        batch_lo = lows[0] if len(lows) == 1 else ops.op("Min", lows, f"{base}/GroupMin")
        batch_hi = highs[0] if len(highs) == 1 else ops.op("Max", highs, f"{base}/GroupMax")
        self.range_readers.update(id(v.producer()) for v in lows + highs)
        batch_lo, batch_hi = self._bounded(batch_lo, batch_hi, point.bound, base)
        range_lo, range_hi = self._widen(batch_lo, batch_hi, cfg.activation_bits, False, base, cfg.symmetric)
        decay = ops.const(f"{base}/decay", np.float32(1.0 - EMA_DECAY))
        if self.range_update is not None:
            decay = ops.op("Mul", [decay, self.range_update], f"{base}/decay_applied", shape=[])
        new_min = ops.op("Sub", [min_state, ops.op("Mul", [ops.op("Sub", [min_state, range_lo], f"{base}/AssignMinEma/delta"), decay],
                                                   f"{base}/AssignMinEma/update_delta")], f"{base}/AssignMinEma")
        new_max = ops.op("Sub", [max_state, ops.op("Mul", [ops.op("Sub", [max_state, range_hi], f"{base}/AssignMaxEma/delta"), decay],
                                                   f"{base}/AssignMaxEma/update_delta")], f"{base}/AssignMaxEma")
        self.updates[min_state.name] = new_min
        self.updates[max_state.name] = new_max
        if point.batch_values:
            # a group (a Concat's inputs and output) quantizes with the range it had before this batch:
            # its members read each other's quantized values (a residual Add inside a C2f block reads a
            # Slice of another member), so the range updated from this batch would be a cycle
            return min_state, max_state, min_state.name, max_state.name, [float(lo0), float(hi0)]
        return new_min, new_max, min_state.name, max_state.name, [float(lo0), float(hi0)]

    # --- state outputs -----------------------------------------------------------------------------
    def add_state_outputs(self, updates: dict[str, ir.Value]) -> dict[str, str]:
        """An Identity ``<state>:updated`` graph output for each state update."""
        contract = {}
        initializers = self.graph.initializers
        for state, update in updates.items():
            shape = initializers[state].const_value.shape
            out = self.ops.op("Identity", [update], f"{state}/update", shape=list(shape))
            out.name = f"{state}{UPDATED_SUFFIX}"
            self.ops.names.reserve_value(out.name)
            self.graph.outputs.append(out)
            contract[state] = out.name
        return contract


def _widen_numpy(lo, hi, bits: int, symmetric: bool):
    lo, hi = widen(lo, hi, bits=bits, narrow=False, symmetric=symmetric)
    return np.float32(lo), np.float32(hi)


# --- the contract ------------------------------------------------------------------------------------
def is_training_graph(model: ir.Model) -> bool:
    """True for a model with qtool's training metadata or any ``qtool`` node."""
    return METADATA_KEY in model.metadata_props or any(n.domain == fqf.DOMAIN for n in model.graph.all_nodes())


def training_contract(model) -> dict:
    """The parsed ``qtool.training`` metadata of a model (path, ModelProto or onnx_ir.Model)."""
    if isinstance(model, onnx.ModelProto):
        props = {p.key: p.value for p in model.metadata_props}
    elif isinstance(model, ir.Model):
        props = dict(model.metadata_props)
    else:
        props = dict(load_model(model).model.metadata_props)
    if METADATA_KEY not in props:
        raise QtoolError("the model is not a qtool training graph (no 'qtool.training' metadata)")
    try:
        contract = json.loads(props[METADATA_KEY])
    except ValueError as exc:
        raise QtoolError(f"the model's 'qtool.training' metadata is not valid JSON ({exc})") from exc
    if not isinstance(contract, dict) or contract.get("version") != CONTRACT_VERSION:
        raise QtoolError("the model's 'qtool.training' metadata is not a version-1 qtool training contract")
    check_contract(contract, model if isinstance(model, ir.Model) else None)
    return contract


# the contract's layout (docs/training.md): key -> the types its value may have
_STR, _NUM, _OPT_NUM = (str,), (int, float), (int, float, type(None))
_CONTRACT_KEYS = {"step_input": _STR, "quant_delay": (int,), "freeze_bn_delay": (int, type(None)),
                  "state": (dict,), "parameters": (list,), "activation_quantizers": (list,),
                  "weight_quantizers": (list,), "batch_norms": (list,)}
_ACTIVATION_KEYS = {"quantizer": _STR, "tensor": _STR, "input": _STR, "output": _STR, "min": _STR, "max": _STR,
                    "bits": (int,)}
_WEIGHT_KEYS = {"quantizer": _STR, "input": _STR, "output": _STR, "layers": (list,), "bits": (int,)}
_BATCH_NORM_KEYS = {"name": _STR, "layer": _STR, "prefix": _STR, "output": _STR, "layer_inputs": (list,),
                    "layer_output": _STR, "scale": _STR, "bias": _STR, "moving_mean": _STR,
                    "moving_variance": _STR, "epsilon": _NUM, "momentum": _NUM, "gemm_beta": _OPT_NUM,
                    "bias_add": (dict, type(None))}
_BIAS_ADD_KEYS = {"name": _STR, "inputs": (list,), "output": _STR}
_BIAS_QUANT_KEYS = {"quantizer": _STR, "layer": _STR, "input": _STR, "output": _STR}


def _check_fields(entry, keys: dict, where: str) -> None:
    if not isinstance(entry, dict):
        raise QtoolError(f"the 'qtool.training' contract is garbled: {where} is not an object")
    for key, types in keys.items():
        if key not in entry:
            raise QtoolError(f"the 'qtool.training' contract is garbled: {where} has no '{key}'")
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise QtoolError(f"the 'qtool.training' contract is garbled: '{key}' of {where} is "
                             f"{json.dumps(value)[:60]}")


def _check_strings(items, where: str, empty_ok: bool = False) -> None:
    for item in items:
        if not isinstance(item, str) or (not item and not empty_ok):
            raise QtoolError(f"the 'qtool.training' contract is garbled: {where} holds {json.dumps(item)[:60]}")


def check_contract(contract: dict, model: ir.Model | None = None) -> None:
    """The contract has the documented layout and, with ``model``, every name it mentions is in it.

    A forged or garbled contract is refused here, before any rewrite trusts it.
    """
    _check_fields(contract, _CONTRACT_KEYS, "the contract")
    _check_strings(contract["state"].keys(), "'state'")
    _check_strings(contract["state"].values(), "'state'")
    _check_strings(contract["parameters"], "'parameters'")
    for i, q in enumerate(contract["activation_quantizers"]):
        _check_fields(q, _ACTIVATION_KEYS, f"activation quantizer {i}")
    for i, q in enumerate(contract["weight_quantizers"]):
        _check_fields(q, _WEIGHT_KEYS, f"weight quantizer {i}")
        _check_strings(q["layers"], f"'layers' of weight quantizer {i}")
    if not isinstance(contract.get("bias_quantizers", []), list):
        raise QtoolError("the 'qtool.training' contract is garbled: 'bias_quantizers' is not a list")
    for i, q in enumerate(contract.get("bias_quantizers", [])):
        _check_fields(q, _BIAS_QUANT_KEYS, f"bias quantizer {i}")
        if not isinstance(q.get("widen_weight", False), bool):
            raise QtoolError(f"the 'qtool.training' contract is garbled: 'widen_weight' of bias quantizer {i} is "
                             f"{json.dumps(q['widen_weight'])[:60]}")
    for i, b in enumerate(contract["batch_norms"]):
        _check_fields(b, _BATCH_NORM_KEYS, f"batch norm {i}")
        _check_strings(b["layer_inputs"], f"'layer_inputs' of batch norm {i}", empty_ok=True)
        for key in ("epsilon", "momentum", "gemm_beta"):
            if b[key] is not None and not (np.isfinite(b[key]) and (b[key] >= 0 or key == "gemm_beta")):
                raise QtoolError(f"the 'qtool.training' contract is garbled: '{key}' of batch norm {i} is {b[key]}")
        if b["bias_add"] is not None:
            _check_fields(b["bias_add"], _BIAS_ADD_KEYS, f"the bias Add of batch norm {i}")
            _check_strings(b["bias_add"]["inputs"], f"the bias Add inputs of batch norm {i}", empty_ok=True)
    if model is not None:
        _check_contract_names(contract, model.graph)


def _check_contract_names(contract: dict, graph: ir.Graph) -> None:
    values = values_by_name(graph)
    for body in graph.subgraphs():  # quantizers of If branches (train_branches)
        values.update(values_by_name(body))
    outputs = {v.name for v in graph.outputs}
    inputs = {v.name for v in graph.inputs}
    nodes = {n.name for n in graph.all_nodes() if n.name}

    def missing(what: str, name: str) -> QtoolError:
        return QtoolError(f"the 'qtool.training' contract names {what} '{name}', which is not in the graph "
                          "(forged or garbled metadata)")

    def need_value(name: str, what: str = "tensor") -> None:
        if name not in values:
            raise missing(what, name)

    if contract["step_input"] not in inputs:
        raise missing("the step input", contract["step_input"])
    range_update = contract.get("range_update_input")
    if range_update is not None and (not isinstance(range_update, str) or range_update not in inputs
                                     or range_update not in graph.initializers):
        raise missing("the range-update input", str(range_update))
    for state, updated in contract["state"].items():
        if state not in graph.initializers:
            raise missing("the state initializer", state)
        if updated not in outputs:
            raise missing("the state output", updated)
    for name in contract["parameters"]:
        if name not in graph.initializers:
            raise missing("the parameter", name)
    for q in contract["activation_quantizers"]:
        need_value(q["input"])
        need_value(q["output"])
        for key in ("min", "max"):
            init = graph.initializers.get(q[key])
            if init is None or init.const_value is None:
                raise missing(f"the range state ({key})", q[key])
            if init.const_value.size != 1 or init.const_value.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
                raise QtoolError(f"the 'qtool.training' contract names '{q[key]}' as a range, but it is not a "
                                 "float scalar")
            if not np.isfinite(init.const_value.numpy()).all():
                raise QtoolError(f"the trained range '{q[key]}' of quantizer '{q['quantizer']}' is not finite")
    for q in contract["weight_quantizers"]:
        need_value(q["input"])
        need_value(q["output"])
        for layer in q["layers"]:
            if layer not in nodes:
                raise missing("the layer", layer)
    for q in contract.get("bias_quantizers", []):
        need_value(q["input"])
        need_value(q["output"])
        if q["layer"] not in nodes:
            raise missing("the layer", q["layer"])
    for b in contract["batch_norms"]:
        if b["layer"] not in nodes:
            raise missing("the layer", b["layer"])
        for name in b["layer_inputs"]:
            if name:
                need_value(name)
        for key in ("scale", "bias", "moving_mean", "moving_variance", "output"):
            need_value(b[key])
        if b["bias_add"] is not None:
            for name in b["bias_add"]["inputs"]:
                if name and name != b["layer_output"]:
                    need_value(name)


def foreign_training_state(model: ir.Model) -> str | None:
    """Why ``model`` holds training-only state that qtool did not write (None if it does not)."""
    graph = model.graph
    for node in graph.all_nodes():
        if node.domain in ("ai.onnx.preview.training", "ai.onnx.training"):
            return f"node '{node.name}' is a training op ({node.domain}::{node.op_type})"
        if "fakequant" in node.op_type.lower() and node.domain != fqf.DOMAIN:
            return f"node '{node.name}' is a fake-quant op of another tool ({node.domain or 'ai.onnx'}::{node.op_type})"
        if node.domain == "" and node.op_type == "BatchNormalization":
            attr = node.attributes.get("training_mode")
            if attr is not None and attr.as_int() == 1:
                return f"BatchNormalization '{node.name}' is in training mode (training_mode=1)"
            if any(out.uses() or out.is_graph_output() for out in node.outputs[1:]):
                return f"BatchNormalization '{node.name}' outputs its running statistics (a training graph)"
    for out in graph.outputs:
        if out.name and out.name.endswith(UPDATED_SUFFIX):
            return f"graph output '{out.name}' is a state update of another tool"
    for name in graph.initializers:
        if name.endswith(("/act_quant/min", "/act_quant/max", "/weights_quant/min", "/weights_quant/max")):
            return f"initializer '{name}' is quantization state of another tool (TensorFlow-style range variable)"
    return None


def held_ranges(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a training graph whose activation ranges do not move with the batch it runs on: every
    EMA update's decay term (``<quantizer>/decay``, ``1 - ema_decay``) is 0, so the FakeQuant nodes use
    the stored ranges, which are what ``rewrite-eval`` deploys with. For evaluating a training graph
    against its deployed model; the copy is not for training (its ranges never learn from data)."""
    held = onnx.ModelProto()
    held.CopyFrom(model)
    props = {p.key: p.value for p in held.metadata_props}
    if METADATA_KEY not in props:
        raise QtoolError("the model is not a qtool training graph (no 'qtool.training' metadata)")
    quantizers = {q["quantizer"] for q in json.loads(props[METADATA_KEY]).get("activation_quantizers", [])}
    for t in held.graph.initializer:
        if t.name.endswith("/decay") and t.name[: -len("/decay")] in quantizers:
            t.CopyFrom(numpy_helper.from_array(np.zeros(tuple(t.dims), np.float32), t.name))
    return held


def metadata_json(contract: dict) -> str:
    return json.dumps(contract, sort_keys=True, separators=(",", ":"))


# --- removal: the float graph and the trained ranges -------------------------------------------
@dataclass
class TrainedState:
    """What ``rewrite_eval`` takes from a training graph."""

    ranges: dict[str, tuple[float, float]]  # float tensor name -> trained (min, max)
    batch_norm_outputs: dict[str, str]  # batch norm name -> its output tensor name
    contract: dict
    # the trained If branches' ranges, named as rewrite-eval names a branch's: "<If>:<branch>:<tensor>"
    # (None: no branch was trained; a branch without activation quantizers, an LSTM's, has none)
    branch_ranges: dict[str, tuple[float, float]] | None = None

    def ranges_after_fold(self, graph: ir.Graph, folds) -> dict[str, tuple[float, float]]:
        """The ranges keyed by tensor names after the eval fold (a folded batch norm's output
        is carried by its layer's output, or a MatMul's bias Add)."""
        ranges = dict(self.ranges)
        by_name = {n.name: n for n in graph}
        for record in folds.folded:
            out = self.batch_norm_outputs.get(record.batch_norm)
            if out is None or out not in self.ranges:
                continue
            end = fold_end(graph, record, by_name)
            if end is not None and end.name:
                ranges.setdefault(end.name, self.ranges[out])
        return ranges


def fold_end(graph: ir.Graph, record, by_name=None) -> ir.Value | None:
    """The tensor that carries a folded batch norm's output after the eval fold."""
    by_name = by_name if by_name is not None else {n.name: n for n in graph}
    layer = by_name.get(record.layer)
    if layer is None:
        return None
    if record.op_type != "MatMul":
        return layer.outputs[0]
    if record.bias_add and record.bias_add in by_name:
        return by_name[record.bias_add].outputs[0]
    adds = [u for u in layer.outputs[0].consumers() if u.op_type == "Add" and u.domain == ""]
    return adds[0].outputs[0] if len(adds) == 1 else None


def values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.inputs if v.name}
    values.update({name: v for name, v in graph.initializers.items()})
    for node in graph:
        for out in node.outputs:
            if out.name:
                values[out.name] = out
    return values


def strip_training_graph(model: ir.Model, label: str = "<model>") -> TrainedState:
    """Turn a qtool training graph back into its float graph, in place; returns the trained ranges.

    Batch norms come back as inference BatchNormalization nodes reading the
    trained moving statistics; weights and biases keep their trained values;
    every quantizer, state update, the step input, the function and the
    metadata go away.
    """
    if METADATA_KEY not in model.metadata_props:
        raise QtoolError(f"'{label}' has qtool::FakeQuant nodes but no 'qtool.training' metadata: "
                         "not a graph qtool wrote, or its metadata was removed")
    try:
        state = _strip_with_branches(model, training_contract(model))
        check_finite_parameters(model.graph, label)  # the trained statistics and weights
        return state
    except QtoolError as exc:
        if str(exc).startswith(f"'{label}'"):
            raise
        raise QtoolError(f"'{label}': {exc}") from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise QtoolError(f"'{label}' is a qtool training graph whose contract does not match its graph ({exc!r})") from exc


def _strip_with_branches(model: ir.Model, contract: dict) -> TrainedState:
    """``_strip`` of the graph and, as models of their own, of the If branches it trains (theirs in turn)."""
    branches = _detach_branches(model, contract)
    state = _strip(model, contract)
    state.branch_ranges = _strip_branches(model, contract, branches) if branches else None
    return state


BRANCH_KEYS = ("activation_quantizers", "weight_quantizers", "bias_quantizers", "batch_norms")  # an If branch's part


def _detach_branches(model: ir.Model, contract: dict) -> list[dict]:
    """The If branches ``train_branches`` encoded (the contract's ``branches``) leave the enclosing graph's
    strip: each If loses its state outputs, their quantizers leave the contract. Returns their records."""
    records = contract.pop("branches", None) or []
    graph = model.graph
    for name, count in {r["if"]: r["outputs"] for r in records}.items():
        node = _the_if(graph, name)
        for attr in BRANCHES:
            body = node.attributes[attr].as_graph()
            kept = list(body.outputs)[:count]
            body.outputs.clear()
            body.outputs.extend(kept)
            for inner in [n for n in body if n.name and n.name.endswith(f"/{attr}/keep")]:
                body.remove(inner, safe=True)  # the other branch's state, passed through
        replace_if(graph, node, count)
    for record in records:
        for key in BRANCH_KEYS:
            contract[key] = [q for q in contract.get(key, []) if q not in record.get(key, [])]
    return records


def _strip_branches(model: ir.Model, contract: dict, records: list[dict]) -> dict[str, tuple[float, float]]:
    """After the enclosing graph's strip (the branches read its float tensors again): each detached branch
    stripped as a model of its own with its part of the contract. Returns their trained ranges named
    ``<If>:<branch>:<tensor>`` (``rewrite-eval``'s names for a branch's ranges)."""
    graph, ranges = model.graph, {}
    for record in records:
        extracted = extract_branch(_the_if(graph, record["if"]), record["branch"], model)
        part = {**contract, **{k: record.get(k, []) for k in BRANCH_KEYS}, "state": {}, "parameters": [],
                "branches": record.get("branches", [])}
        extracted.model.metadata_props[METADATA_KEY] = metadata_json(part)
        try:
            trained = _strip_with_branches(extracted.model, part)
        finally:
            extracted.splice()
        scope = f"{record['if']}:{record['branch']}:"
        ranges.update({scope + t: r for t, r in {**trained.ranges, **(trained.branch_ranges or {})}.items()})
    owned = {contract.get("range_update_input")} | {s for r in records for s in r["state"]}
    for name in [n for n in graph.initializers if n in owned]:
        if not graph.initializers[name].uses():
            graph.initializers.pop(name)
    return ranges


def _the_if(graph: ir.Graph, name: str) -> ir.Node:
    node = next((n for n in graph if n.name == name and n.op_type == "If" and n.domain == ""), None)
    if node is None:
        raise QtoolError(f"the training contract names If '{name}', which is not in the graph")
    return node


def _strip(model: ir.Model, contract: dict) -> TrainedState:
    graph = model.graph
    values = values_by_name(graph)
    prefixes = {SHARED_PREFIX}

    def value(name: str) -> ir.Value:
        if name not in values:
            raise QtoolError(f"the training contract names tensor '{name}', which is not in the graph")
        return values[name]

    ranges: dict[str, tuple[float, float]] = {}
    for q in contract["activation_quantizers"]:
        prefixes.add(q["quantizer"])
        lo = graph.initializers[q["min"]].const_value.numpy()
        hi = graph.initializers[q["max"]].const_value.numpy()
        ranges[q["tensor"]] = (float(lo), float(hi))
    # quantizers: readers read the float tensor again; graph outputs get their names back
    quantizers = (list(contract["activation_quantizers"]) + list(contract["weight_quantizers"])
                  + list(contract.get("bias_quantizers", [])))
    for q in quantizers:
        prefixes.add(q["quantizer"])
        out, inp = value(q["output"]), value(q["input"])
        was_output = out.is_graph_output()
        out.replace_all_uses_with(inp, replace_graph_outputs=True)
        if was_output and q.get("tensor") and inp.name != q["tensor"]:
            out.name = None
            inp.name = q["tensor"]
    # batch norms: the layer with its own inputs, [the bias Add], BatchNormalization(moving stats)
    bn_outputs = {}
    for b in contract["batch_norms"]:
        # by name, afresh: a batch norm restored before may be this layer's input (a folded output
        # read by another folded layer), and its output value changed
        values = values_by_name(graph)
        prefixes.add(b["prefix"])
        layer = next((n for n in graph if n.name == b["layer"]), None)
        if layer is None:
            raise QtoolError(f"layer '{b['layer']}' of the folded batch norm '{b['name']}' is not in the graph")
        inputs = [values[n] if n else None for n in b["layer_inputs"]]
        layer.resize_inputs(len(inputs))
        for i, v in enumerate(inputs):
            layer.replace_input_with(i, v)
        if b.get("gemm_beta") is not None and b["gemm_beta"] != 1.0:
            layer.attributes["beta"] = ir.AttrFloat32("beta", b["gemm_beta"])
        x = layer.outputs[0]
        new_nodes = []
        if b.get("bias_add"):
            add_info = b["bias_add"]
            add_inputs = [x if n == b["layer_output"] else values[n] for n in add_info["inputs"]]
            add = ir.node("Add", add_inputs, name=add_info["name"])
            new_nodes.append(add)
            x = add.outputs[0]
        bn = ir.node(
            "BatchNormalization",
            [x, value(b["scale"]), value(b["bias"]), value(b["moving_mean"]), value(b["moving_variance"])],
            {"epsilon": ir.AttrFloat32("epsilon", b["epsilon"]), "momentum": ir.AttrFloat32("momentum", b["momentum"])},
            name=b["name"],
        )
        new_nodes.append(bn)
        graph.extend(new_nodes)
        end = value(b["output"])
        shape, dtype = end.shape, end.dtype
        end.replace_all_uses_with(bn.outputs[0], replace_graph_outputs=True)
        end.name = None
        if b.get("bias_add"):
            x.name = b["bias_add"]["output"]
        bn.outputs[0].name = b["output"]
        bn.outputs[0].shape, bn.outputs[0].dtype = shape, dtype
        bn_outputs[b["name"]] = b["output"]
    # the contract's inputs and outputs
    state = contract["state"]
    updated = set(state.values())
    graph.outputs[:] = [o for o in graph.outputs if o.name not in updated]
    range_update = contract.get("range_update_input")
    owned_inputs = set(state) | set(contract.get("parameters", [])) | {contract["step_input"], range_update}
    graph.inputs[:] = [v for v in graph.inputs if v.name not in owned_inputs]
    for name in state:
        if name in graph.initializers:
            graph.initializers[name].type = None
            graph.initializers[name].shape = None
    _remove_dead(graph, prefixes | set(state))
    if range_update in graph.initializers and not graph.initializers[range_update].uses():
        graph.initializers.pop(range_update)
    for key in [k for k in model.functions if k[0] == fqf.DOMAIN]:
        del model.functions[key]
    model.opset_imports.pop(fqf.DOMAIN, None)
    model.graph.opset_imports.pop(fqf.DOMAIN, None)
    del model.metadata_props[METADATA_KEY]
    leftover = [n.name for n in graph if n.domain == fqf.DOMAIN]
    if leftover:
        raise QtoolError(f"qtool::FakeQuant node '{leftover[0]}' is not described by the training contract")
    return TrainedState(ranges, bn_outputs, contract)


def _owned(name: str | None, prefixes: set[str]) -> bool:
    return bool(name) and any(name == p or name.startswith(p + "/") for p in prefixes)


def _remove_dead(graph: ir.Graph, prefixes: set[str]) -> None:
    """Remove nodes and initializers the training rewrite created once nothing reads them."""
    removed = True
    while removed:
        removed = False
        for node in reversed(list(graph)):
            if not (_owned(node.name, prefixes) or node.domain == fqf.DOMAIN):
                continue
            if all(not o.uses() and not o.is_graph_output() for o in node.outputs):
                graph.remove(node, safe=True)
                removed = True
    for name in list(graph.initializers):
        v = graph.initializers[name]
        if _owned(name, prefixes) and not v.uses() and not v.is_graph_output():
            graph.initializers.pop(name)
