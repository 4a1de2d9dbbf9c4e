"""Linear attention's normaliser in the same tensor as its values: the MatMul that writes both stays float.

ReLU linear attention (timm's / MIT-HAN's EfficientViT ``LiteMLA``, EfficientViT-SAM and -L) pads ``v`` with a
column of ones, so that ``kv = k^T [v, 1]`` holds the numerators and, in its last column, the denominators
``sum(k)``; then ``out = q kv`` and ``out[..., :-1] / (out[..., -1:] + eps)``. Quantized as an input of ``q kv``,
``kv`` is one per-tensor range over both: on EfficientViT-B0 its numerator entries reach |1000-11000| while the
median denominator is 3-18, so most denominators round to 0 or one step, and the quotient is noise (output SQNR
0.5 dB against float, onnxruntime's tool -1.3 dB; benchmarks/zoo/FINDINGS.md section 26). Measured per attention
on held-out images (uint8 min/max ranges of 32 calibration images): ``kv`` per tensor -127 to 19 dB, its
denominator column split off with its own range 10-19 dB, a range per column 13-20 dB, ``q kv`` in float 23-36 dB.

:func:`shared_normaliser_layers` finds a ``Div`` (or ``Mul`` by a ``Reciprocal``) whose numerator and denominator
are both selected (Slice, Split, Gather) from one tensor, through ops that move values (Reshape, Transpose,
(Un)Squeeze, Flatten, Identity) and, on the denominator's side, an ``eps`` added or a floor (Add/Max/Clip with a
constant); when a MatMul of two activations writes that tensor, the placement treats it as out of scope with its
reason (``QuantConfig.shared_normaliser``): its inputs keep no quantizer, and onnxruntime runs that one (small:
``[tokens, dim] x [dim, dim + 1]`` per head) MatMul in float. A MatMul with a constant weight is not one of them:
its weight is quantized per output column, so the normaliser column has its own scale already.
"""

from __future__ import annotations

import onnx_ir as ir

from qtool.model.constants import is_constant
from qtool.model.layers import is_layer

_MOVES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten"}
_SELECTS = {"Slice", "Split", "Gather"}
_FLOORS = {"Add", "Max", "Clip"}  # ``den + eps``, ``max(den, eps)``, ``clip(den, eps)``: with a constant operand


def _selected_from(value: ir.Value | None, floors: bool) -> ir.Value | None:
    """The tensor ``value`` selects part of (through at least one Slice/Split/Gather of its data input, and moves;
    with ``floors``, also an eps added or a floor), or None."""
    selected = False
    for _ in range(32):
        producer = value.producer() if value is not None else None
        if producer is None or producer.domain != "" or not producer.inputs or producer.inputs[0] is None:
            return value if selected else None
        op = producer.op_type
        if op in _SELECTS:
            selected = True
        elif op in _FLOORS and floors:
            variable = [v for v in producer.inputs if v is not None and not is_constant(v)]
            if len(variable) != 1:
                return value if selected else None
            value = variable[0]
            continue
        elif op not in _MOVES:
            return value if selected else None
        value = producer.inputs[0]
    return None


def _writer(value: ir.Value) -> ir.Node | None:
    """The layer that writes ``value``, through moves."""
    for _ in range(32):
        producer = value.producer()
        if producer is None or producer.domain != "" or not producer.inputs:
            return None
        if is_layer(producer):
            return producer
        if producer.op_type not in _MOVES or producer.inputs[0] is None:
            return None
        value = producer.inputs[0]
    return None


def _quotients(graph: ir.Graph):
    """(numerator, denominator) of each Div, and of each Mul by a Reciprocal."""
    for node in graph:
        if node.domain != "" or len(node.inputs) != 2 or None in node.inputs:
            continue
        if node.op_type == "Div":
            yield node.inputs[0], node.inputs[1]
        elif node.op_type == "Mul":
            for x, r in (node.inputs, reversed(node.inputs)):
                inv = r.producer()
                if inv is not None and inv.domain == "" and inv.op_type == "Reciprocal" and inv.inputs:
                    yield x, inv.inputs[0]


def shared_normaliser_layers(graph: ir.Graph) -> list[ir.Node]:
    """The MatMuls of two activations whose one output holds both a quotient's numerator and its denominator."""
    found: dict[int, ir.Node] = {}
    for numerator, denominator in _quotients(graph):
        source = _selected_from(numerator, floors=False)
        if source is None or _selected_from(denominator, floors=True) is not source:
            continue
        layer = _writer(source)
        if (layer is not None and layer.op_type == "MatMul" and len(layer.inputs) == 2
                and not any(v is None or is_constant(v) for v in layer.inputs)):
            found[id(layer)] = layer
    return list(found.values())
