"""HardSwish and HardSigmoid in onnxruntime's integer Add and Mul kernels (spec section 2b).

onnxruntime has no integer HardSwish or HardSigmoid: between a DequantizeLinear and a
QuantizeLinear they run in float (a HardSwish as HardSigmoid + Mul), a DQ, two float ops and a
Q per activation -- 39 % of MobileNetV3's int8 time (``benchmarks/zoo/FINDINGS.md`` section 8).
Both are a clipped affine map, and an unsigned 8-bit quantizer clips for free::

    HardSigmoid(x) = clip(alpha x + beta, 0, 1) = alpha * clip(x + beta/alpha, 0, 1/alpha)
    HardSwish(x)   = x * HardSigmoid(x)          (alpha = 1/6, beta = 1/2)

so a HardSigmoid whose output is quantized on the fixed range [0, 1] (scale ``s = 1/255``,
zero point 0) is, in the eval graph, ``Add(x, beta/alpha) -> QuantizeLinear(scale s/alpha, 0)``
read by the same ``DequantizeLinear(s, 0)``: the uint8 saturation of that Q *is* the clip to
[0, 1/alpha], and the DQ's scale multiplies by alpha. onnxruntime fuses the Add into QLinearAdd
(the constant comes in through its own DQ), and the HardSwish's Mul of two quantized tensors
into QLinearMul. MobileNetV3 (224 px): 0.87x -> 0.72x float, accuracy unchanged.

- :func:`split_hard_swish` (before placement, in the eval and the training graph alike): each
  HardSwish in scope becomes ``Mul(x, HardSigmoid(x; 1/6, 1/2))``, which ONNX defines it to be
  (exact in float); the Mul writes the HardSwish's output tensor (same name). Exports below
  opset 14 already write torch's hardswish that way; a hand-written Relu6 form
  (``Clip(x + 3, 0, 6) / 6``, ``x * Clip(x + 3, 0, 6) / 6``) becomes the same ops first
  (:func:`written_out`).
- the placement (``placement.integer``) gives a HardSigmoid of a quantized tensor the fixed
  output range [0, 1] and lists it in ``plan.integer_gates``;
- the eval encoding (``eval_graph``) writes the Add in the HardSigmoid's place;
- the training graph (``train_graph.TrainEncoder``) computes that gate in the eval graph's float32
  operations: ``Add(x, beta/alpha) -> Div(s/alpha)`` (QuantizeLinear's quotient) ``-> Clip(0, 255)
  -> FakeQuant`` on the levels (range [0, 255], scale 1: the rounding alone) ``-> Mul(s)`` (the
  DequantizeLinear), so fine-tuning trains what deploys, bit for bit with ``--round-mode
  half_to_even``. ``fq[0,1](HardSigmoid(x))`` is equal in exact arithmetic but rounds differently
  in float32 near ties, and ``level * (s/alpha) * alpha`` is not ``level * s``.

Only with 8-bit unsigned activations (the default): a signed grid has no saturation at 0, and
onnxruntime's QLinearAdd/QLinearMul are 8-bit kernels.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.model.constants import clip_bounds, constant_array, constant_source, remove_if_unused
from qtool.model.graph import take_over
from qtool.model.layers import float_attr
from qtool.model.names import NameScope

HARD_SWISH_ALPHA, HARD_SWISH_BETA = 1.0 / 6.0, 0.5
GATE_RANGE = (0.0, 1.0)


def gate_parameters(node: ir.Node) -> tuple[np.float32, np.float32]:
    """A HardSigmoid's ``(alpha, beta)`` in float32 (ONNX's defaults 0.2 and 0.5)."""
    return np.float32(float_attr(node, "alpha", 0.2)), np.float32(float_attr(node, "beta", 0.5))


def gate_shift(alpha, beta) -> np.float32:
    """The integer gate's shift ``beta/alpha`` in float32, as the eval graph writes it (its QuantizeLinear's
    scale is ``float32(s / alpha)``, ``s`` the scale of the [0, 1] range)."""
    return np.float32(np.float32(beta) / np.float32(alpha))


def uses_integer_gates(config: QuantConfig) -> bool:
    """The integer form applies: 8-bit asymmetric (uint8) activations."""
    return config.activation_bits == 8 and not config.symmetric


def _hard_sigmoid(x: ir.Value, alpha: float, beta: float, base: str) -> ir.Node:
    gate = ir.node("HardSigmoid", [x], {"alpha": alpha, "beta": beta}, name=f"{base}/HardSigmoid")
    gate.outputs[0].name = f"{base}/gate"
    return gate


def split_hard_swish(graph: ir.Graph, config: QuantConfig, names: NameScope) -> list[str]:
    """Each HardSwish in scope as ``Mul(x, HardSigmoid(x))`` (in place), and the HardSigmoid/HardSwish
    written out with a Relu6 (:func:`written_out`) as those ops; returns the names of what was split."""
    if not uses_integer_gates(config):
        return []
    split = written_out(graph, config, names)
    for node in [n for n in graph if n.domain == "" and n.op_type == "HardSwish"]:
        if config.out_of_scope(node) is not None or not node.inputs or node.inputs[0] is None:
            continue
        x = node.inputs[0]
        base = names.prefix(node.name or "HardSwish", ["HardSigmoid", "Mul"], ["gate"])
        gate = _hard_sigmoid(x, HARD_SWISH_ALPHA, HARD_SWISH_BETA, base)
        mul = ir.node("Mul", [x, gate.outputs[0]], name=f"{base}/Mul")
        graph.insert_before(node, [gate, mul])
        take_over(node.outputs[0], mul.outputs[0])
        graph.remove(node, safe=True)
        split.append(node.name)
    return split


def _scalar(value: ir.Value | None) -> float | None:
    array = constant_array(value) if value is not None else None
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def _only_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0][0] if len(uses) == 1 and not value.is_graph_output() else None


def _factor(node: ir.Node | None, value: ir.Value) -> float | None:
    """c when ``node`` is ``Mul(value, c)``, ``Mul(c, value)`` or ``Div(value, 1/c)`` with a scalar constant."""
    if node is None or node.domain != "" or node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if node.op_type == "Div":
        d = _scalar(b) if a is value else None
        return 1.0 / d if d else None
    return _scalar(b) if a is value else _scalar(a) if b is value else None


def _relu6_of_shift(clip: ir.Node) -> tuple[ir.Value, float, float, ir.Node] | None:
    """``Clip(Add(x, b), 0, m)`` (the Add read by the Clip alone): ``(x, b, m, add)``."""
    bounds = clip_bounds(clip)
    add = clip.inputs[0].producer() if clip.inputs and clip.inputs[0] is not None else None
    if bounds is None or bounds[0] != 0.0 or not bounds[1] or add is None or add.domain != "" \
            or add.op_type != "Add" or len(add.inputs) != 2 or _only_reader(add.outputs[0]) is not clip:
        return None
    for x, c in (add.inputs, reversed(add.inputs)):
        b = _scalar(c)
        if b is not None and x is not None and constant_array(x) is None:
            return x, b, bounds[1], add
    return None


def written_out(graph: ir.Graph, config: QuantConfig, names: NameScope) -> list[str]:
    """HardSigmoid and HardSwish written with a Relu6 (hand-written MobileNetV3 ``h_sigmoid`` /
    ``h_swish``), as the ops (in place): ``Clip(x + b, 0, m) * (1/m)`` (or ``/ m``) becomes
    ``HardSigmoid(x; 1/m, b/m)``, and ``x * Clip(x + b, 0, m) * (1/m)`` becomes ``x *`` that
    HardSigmoid (equal in float up to rounding). Returns the names of the Clips replaced."""
    done = []
    for clip in [n for n in graph if n.domain == "" and n.op_type == "Clip"]:
        found = _relu6_of_shift(clip)
        if found is None:
            continue
        x, b, m, add = found
        reader = _only_reader(clip.outputs[0])
        product = None
        if reader is not None and reader.op_type == "Mul" and x in reader.inputs and _factor(reader, x) is None:
            product, reader = reader, _only_reader(reader.outputs[0])  # x * Clip(...), then the scale
        factor = _factor(reader, product.outputs[0] if product is not None else clip.outputs[0])
        nodes = [add, clip] + ([product] if product is not None else []) + [reader]
        if factor is None or abs(factor * m - 1) > 1e-6 or any(config.out_of_scope(n) for n in nodes):
            continue
        base = names.prefix(clip.name or "Clip", ["HardSigmoid", "Mul"], ["gate"])
        new = [_hard_sigmoid(x, 1.0 / m, b / m, base)]
        if product is not None:
            new.append(ir.node("Mul", [x, new[0].outputs[0]], name=f"{base}/Mul"))
        graph.insert_before(add, new)
        take_over(reader.outputs[0], new[-1].outputs[0])
        constants = [v for n in nodes for v in n.inputs if v is not None and constant_array(v) is not None]
        for node in reversed(nodes):
            graph.remove(node, safe=True)
        for source in filter(None, map(constant_source, constants)):
            remove_if_unused(graph, source.nodes, [source.root])
        done.append(clip.name)
    return done
