"""Constant tensors as real exporters write them.

A weight is constant when it is an initializer, the output of a ``Constant``
node, or an ``Identity``/``Reshape``/``Transpose``/``Cast``/``Unsqueeze``/
``Squeeze`` of a constant (PyTorch writes ``Transpose`` of a ``Constant`` for
``Linear`` weights, Keras converters write ``Identity`` of an initializer, old
exporters write ``Reshape``, spox writes an LSTM's ``W``/``R`` as ``Unsqueeze``
of a ``Constant``: silero-vad's OpenVINO export). :func:`constant_source` finds the root and the chain of nodes
without touching tensor data; :func:`constant_array` computes the value.

An initializer that is also listed as a graph input (models from IR < 4
exporters) counts as constant, as every deployment tool treats it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

CONSTANT_PASS_THROUGH = ("Identity", "Reshape", "Transpose", "Cast", "Unsqueeze", "Squeeze")
_MAX_DEPTH = 16


@dataclass(frozen=True)
class ConstantSource:
    root: ir.Value  # an initializer, or the output of a Constant node
    chain: tuple[ir.Node, ...]  # nodes from the root to the value, in data-flow order

    @property
    def nodes(self) -> tuple[ir.Node, ...]:
        """Every node that computes the value (the Constant node included)."""
        producer = self.root.producer()
        return ((producer,) if producer is not None else ()) + self.chain


def _is_root(value: ir.Value) -> bool:
    if value.is_initializer() and value.const_value is not None:
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain == ""


def _constant_operands(node: ir.Node) -> bool:
    """A Reshape's shape, and an Unsqueeze/Squeeze's axes when given as an input, are constants."""
    operand = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op_type == "Reshape" or operand is not None:
        return constant_source(operand) is not None
    return True


def constant_source(value: ir.Value | None) -> ConstantSource | None:
    """The constant behind ``value``, or None when it is computed at run time."""
    chain: list[ir.Node] = []
    current = value
    for _ in range(_MAX_DEPTH):
        if current is None:
            return None
        if _is_root(current):
            return ConstantSource(current, tuple(reversed(chain)))
        producer = current.producer()
        if producer is None or producer.domain != "" or producer.op_type not in CONSTANT_PASS_THROUGH:
            return None
        if not _constant_operands(producer):
            return None
        chain.append(producer)
        current = producer.inputs[0] if producer.inputs else None
    return None


def is_constant(value: ir.Value | None) -> bool:
    return constant_source(value) is not None


def not_constant_reason(value: ir.Value | None) -> str:
    """Why ``value`` is not a constant, in words for the report."""
    if value is None:
        return "input is missing"
    current = value
    for _ in range(_MAX_DEPTH):
        producer = current.producer()
        if producer is None:
            if current.is_graph_input():
                return f"'{current.name}' is a graph input"
            return f"'{current.name}' has no value"
        if producer.op_type in CONSTANT_PASS_THROUGH and producer.inputs and producer.inputs[0] is not None:
            if not _constant_operands(producer):  # a constant reshaped to a shape computed at run time
                return (f"'{current.name}' is computed at run time: {producer.op_type} node '{producer.name}' "
                        "has an operand that is not a constant")
            current = producer.inputs[0]
            continue
        return f"'{current.name}' is computed at run time by {producer.op_type} node '{producer.name}'"
    return f"'{value.name}' is computed through too many nodes"


def contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous with the same shape (``np.ascontiguousarray`` turns 0-d into 1-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


def _constant_node_array(node: ir.Node) -> np.ndarray | None:
    attrs = node.attributes
    if "value" in attrs:
        return np.asarray(attrs["value"].as_tensor().numpy())
    if "value_float" in attrs:
        return np.asarray(attrs["value_float"].as_float(), dtype=np.float32)
    if "value_floats" in attrs:
        return np.asarray(attrs["value_floats"].as_floats(), dtype=np.float32)
    if "value_int" in attrs:
        return np.asarray(attrs["value_int"].as_int(), dtype=np.int64)
    if "value_ints" in attrs:
        return np.asarray(attrs["value_ints"].as_ints(), dtype=np.int64)
    return None


def _reshape(data: np.ndarray, shape: np.ndarray, allowzero: int) -> np.ndarray:
    target = [int(d) for d in shape.reshape(-1)]
    if not allowzero:
        target = [data.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return data.reshape(target)


def root_array(root: ir.Value) -> np.ndarray | None:
    if root.const_value is not None:
        return np.asarray(root.const_value.numpy())
    producer = root.producer()
    if producer is not None and producer.op_type == "Constant":
        return _constant_node_array(producer)
    return None


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value of a constant tensor as numpy, or None when it is not constant."""
    source = constant_source(value)
    if source is None:
        return None
    array = root_array(source.root)
    if array is None:
        return None
    for node in source.chain:
        if node.op_type == "Identity":
            continue
        if node.op_type == "Transpose":
            perm = node.attributes.get("perm")
            array = np.transpose(array, perm.as_ints() if perm is not None else None)
        elif node.op_type == "Cast":
            to = ir.DataType(node.attributes["to"].as_int())
            array = array.astype(to.numpy())
        elif node.op_type == "Reshape":
            shape = constant_array(node.inputs[1])
            allowzero = node.attributes.get("allowzero")
            array = _reshape(array, shape, allowzero.as_int() if allowzero is not None else 0)
        elif node.op_type == "Unsqueeze":
            axes = _axes(node)
            array = np.expand_dims(array, tuple(sorted(a % (array.ndim + len(axes)) for a in axes)))
        elif node.op_type == "Squeeze":
            axes = _axes(node)
            array = np.squeeze(array, None if axes is None else tuple(a % array.ndim for a in axes))
    return contiguous(array)


def squeezed_axes(node: ir.Node) -> list[int] | None:
    """The axes a Squeeze / Unsqueeze names (None: not given, or not a constant)."""
    if len(node.inputs) > 1 and node.inputs[1] is not None and constant_array(node.inputs[1]) is None:
        return None
    return _axes(node)


def _axes(node: ir.Node) -> list[int] | None:
    """The ``axes`` of an Unsqueeze/Squeeze: an attribute up to opset 12, an input from 13."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return [int(a) for a in constant_array(node.inputs[1]).reshape(-1)]
    attr = node.attributes.get("axes")
    return list(attr.as_ints()) if attr is not None else None


def constant_dtype(value: ir.Value) -> ir.DataType | None:
    """The element type of a constant without computing it."""
    source = constant_source(value)
    if source is None:
        return None
    for node in reversed(source.chain):
        if node.op_type == "Cast":
            return ir.DataType(node.attributes["to"].as_int())
    root = source.root
    if root.const_value is not None:
        return root.const_value.dtype
    producer = root.producer()
    if producer is not None and "value" in producer.attributes:
        return producer.attributes["value"].as_tensor().dtype
    array = root_array(root)
    return None if array is None else ir.DataType.from_numpy(array.dtype)


def remove_if_unused(graph: ir.Graph, nodes: Iterable[ir.Node], values: Iterable[ir.Value] = ()) -> None:
    """Remove the given nodes and initializers once nothing reads them.

    Nodes are tried from the last to the first, so a chain whose end was
    disconnected goes away entirely. Only what the caller names is removed:
    qtool never deletes dead code it did not create (a Constant node read
    only by a removed node goes with it).
    """
    pending = list(nodes)
    removed = True
    while removed:
        removed = False
        for node in reversed(list(pending)):
            if node.graph is not graph:
                pending.remove(node)
                continue
            if all(not out.uses() and not out.is_graph_output() for out in node.outputs):
                inputs = [v for v in node.inputs if v is not None]
                graph.remove(node, safe=True)
                pending.remove(node)
                removed = True
                values = list(values) + inputs
                # the Constant nodes that fed only this node (a Reshape's shape) were part of it
                for v in inputs:
                    producer = v.producer()
                    if producer is not None and producer.op_type == "Constant" and producer.domain == "" \
                            and producer not in pending:
                        pending.append(producer)
    for value in values:
        if value is None or not value.is_initializer() or value.uses() or value.is_graph_output():
            continue
        name = value.name
        if name in graph.initializers and graph.initializers[name] is value:
            graph.initializers.pop(name)
        if value.is_graph_input():
            graph.inputs.remove(value)


def clip_bounds(node: ir.Node) -> tuple[float | None, float | None] | None:
    """(min, max) of a Clip (None for a missing bound), from its attributes (opset < 11) or its
    constant inputs; None when a bound is computed at run time."""
    if "min" in node.attributes or "max" in node.attributes:  # opset < 11
        return (node.attributes.get_float("min", None), node.attributes.get_float("max", None))
    bounds = []
    for v in list(node.inputs[1:3]) + [None] * (3 - len(node.inputs)):
        array = constant_array(v) if v is not None else None
        if v is not None and array is None:
            return None
        bounds.append(None if array is None else float(array.reshape(-1)[0]))
    return tuple(bounds)
