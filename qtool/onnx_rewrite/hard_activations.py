"""HardSwish and HardSigmoid in onnxruntime's integer Add and Mul kernels (spec section 2b).

onnxruntime has no integer HardSwish or HardSigmoid: between a DequantizeLinear and a
QuantizeLinear they run in float (a HardSwish as HardSigmoid + Mul), a DQ, two float ops and a
Q per activation -- 39 % of MobileNetV3's int8 time (``benchmarks/zoo/FINDINGS.md`` section 7).
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
  (exact in float); the Mul writes the HardSwish's output tensor (same name).
- the placement (``placement.integer``) gives a HardSigmoid of a quantized tensor the fixed
  output range [0, 1] and lists it in ``plan.integer_gates``; the training graph fake-quantizes
  that output on [0, 1] (the same grid: ``fq[0,1](HardSigmoid(x)) = alpha * fq[0,1/alpha](x +
  beta/alpha)``), so fine-tuning trains what deploys;
- the eval encoding (``eval_graph``) writes the Add in the HardSigmoid's place.

Only with 8-bit unsigned activations (the default): a signed grid has no saturation at 0, and
onnxruntime's QLinearAdd/QLinearMul are 8-bit kernels.
"""

from __future__ import annotations

import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.model.names import NameScope

HARD_SWISH_ALPHA, HARD_SWISH_BETA = 1.0 / 6.0, 0.5
GATE_RANGE = (0.0, 1.0)


def uses_integer_gates(config: QuantConfig) -> bool:
    """The integer form applies: 8-bit asymmetric (uint8) activations."""
    return config.activation_bits == 8 and not config.symmetric


def split_hard_swish(graph: ir.Graph, config: QuantConfig, names: NameScope) -> list[str]:
    """Each HardSwish in scope as ``Mul(x, HardSigmoid(x))`` (in place); returns their names."""
    if not uses_integer_gates(config):
        return []
    split = []
    for node in [n for n in graph if n.domain == "" and n.op_type == "HardSwish"]:
        if config.out_of_scope(node) is not None or not node.inputs or node.inputs[0] is None:
            continue
        x, out = node.inputs[0], node.outputs[0]
        base = names.prefix(node.name or "HardSwish", ["HardSigmoid", "Mul"], ["gate"])
        gate = ir.node("HardSigmoid", [x], {"alpha": HARD_SWISH_ALPHA, "beta": HARD_SWISH_BETA},
                       name=f"{base}/HardSigmoid")
        gate.outputs[0].name = f"{base}/gate"
        mul = ir.node("Mul", [x, gate.outputs[0]], name=f"{base}/Mul")
        graph.insert_before(node, [gate, mul])
        name, shape, vtype = out.name, out.shape, out.type
        out.replace_all_uses_with(mul.outputs[0], replace_graph_outputs=True)
        out.name = None
        mul.outputs[0].name = name
        if vtype is not None:
            mul.outputs[0].type, mul.outputs[0].shape = vtype, shape
        graph.remove(node, safe=True)
        split.append(node.name)
    return split
