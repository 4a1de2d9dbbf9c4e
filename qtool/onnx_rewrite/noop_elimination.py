"""Multiplications by one and additions of zero removed before placement (spec section 2b), as onnxruntime's
NoopElimination does in the float model.

``x * 1``, ``1 * x``, ``x / 1``, ``x + 0``, ``0 + x`` and ``x - 0`` with a constant 1 or 0 that holds one value
and has no more dims than ``x`` (the output is ``x``, same shape and type) are what a model that learns a scale
or a shift holds at initialisation: HGNetV2-B0's LearnableAffineBlock (``ReLU -> Mul(scale) -> Add(bias)`` after
each of its 31 convs; timm initialises them to 1 and 0) and a layer scale set to 1. onnxruntime's NoopElimination
drops them from the float model; in a QDQ model the placement quantized each one's output, and onnxruntime ran a
QLinearMul and a QLinearAdd per block (HGNetV2-B0: 1.0 ms of its 4.8 ms int8 run, and the int8 model 1.2x the
latency of onnxruntime's own ``quantize_static``, whose ``quant_pre_process`` had dropped them:
``benchmarks/zoo/FINDINGS.md`` section 26).

:func:`neutral_ops_removed` (eval rewrite only: a training graph keeps the initial value of a parameter it may
train) reads ``x`` in place of each such node's output (the output's name goes to ``x`` where ``x`` can be renamed,
as ``remove_identities`` does, so that the tensors after it keep their names) and removes the node, and the
constant if nothing else reads it. Exact: ``x * 1``, ``x / 1`` and ``x - 0`` are ``x`` in IEEE arithmetic; ``x + 0``
is ``x`` except that ``-0 + 0`` is ``+0``, equal as a number.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from qtool.model.constants import constant_array, remove_if_unused
from qtool.model.graph import remove_identities
from qtool.model.opset import inferred_ranks

NEUTRAL = {"Mul": (1.0, True), "Div": (1.0, False), "Add": (0.0, True), "Sub": (0.0, False)}  # op: (value, commutes)


def _neutral_operand(node: ir.Node) -> int | None:
    """The position of ``node``'s neutral constant operand, or None."""
    value, commutes = NEUTRAL[node.op_type]
    for position in ((1, 0) if commutes else (1,)):
        array = constant_array(node.inputs[position])
        if array is not None and array.size == 1 and array.dtype.kind == "f" and float(array.reshape(())) == value:
            return position
    return None


def neutral_ops_removed(graph: ir.Graph, out_of_scope: Callable[[ir.Node], str | None] = lambda _: None) -> list[str]:
    """Remove the neutral Mul/Div/Add/Sub of ``graph`` (module docstring) in its scope, in place; returns their names."""
    found = []
    for node in graph:
        if node.domain in ("", "ai.onnx") and node.op_type in NEUTRAL and len(node.inputs) == 2 \
                and all(v is not None for v in node.inputs) and out_of_scope(node) is None:
            position = _neutral_operand(node)
            if position is not None:
                found.append((node, position))
    ranks = inferred_ranks(graph) if any(node.inputs[1 - p].shape is None for node, p in found) else {}
    removed = []
    for node, position in found:
        x, const = node.inputs[1 - position], node.inputs[position]
        rank = len(x.shape) if x.shape is not None else ranks.get(x.name)
        const_rank = np.ndim(constant_array(const))
        if const_rank and (rank is None or const_rank > rank):  # the constant would add dims to x
            continue
        if x.dtype is not None and const.dtype is not None and x.dtype != const.dtype:
            continue
        producer = const.producer()
        node.op_type = "Identity"
        node.replace_input_with(0, x)
        node.resize_inputs(1)
        remove_if_unused(graph, [producer] if producer is not None else [], [const])
        removed.append(node.name)
    if removed:
        remove_identities(graph)
    return removed
