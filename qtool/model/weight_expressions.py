"""Layer weights that the graph computes from constants, folded into initializers.

Exporters do not always fold what a layer's weight is made of. PyTorch's TorchScript exporter writes
an ``nn.LSTM``'s ``W`` and ``R`` as ``Unsqueeze(Concat(Slice(weight_ih, ...), ...))`` (its gate order
IFGO re-cut into ONNX's IOFC) and folds that only where its constant folding runs: not inside an
``If`` branch (silero-vad's decoder LSTM), nor with ``do_constant_folding=False``. A weight that is
not a constant cannot be quantized, so the layer stayed in float ("W is not a constant").

:func:`fold_weight_expressions` evaluates such an expression when every op in it only moves or
converts data (:data:`FOLDABLE`: no arithmetic, so the folded tensor holds exactly the values
onnxruntime computes), or computes on shapes in integers (:data:`SHAPE_OPS`: the Shape of a constant, the
product of its dims, as tf2onnx writes an Einsum's weight: g2p-id's BERT), and every leaf is a constant, and gives the layer an initializer with the
result; the expression's nodes go when nothing else reads them. The chains
:mod:`qtool.model.constants` already reads through (``Transpose``/``Reshape``/``Cast`` ... of one
constant) are left as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from qtool.model.constants import constant_array, contiguous, is_constant, remove_if_unused
from qtool.model.layers import BIAS_INPUT, WEIGHT_INPUT
from qtool.model.names import NameScope

# ops that only select, reorder, join or convert values
FOLDABLE = ("Identity", "Reshape", "Transpose", "Cast", "Unsqueeze", "Squeeze", "Flatten", "Slice", "Concat",
            "Split", "Gather", "Expand", "Tile")
# integer arithmetic on shapes (tf2onnx writes an Einsum's weight as Reshape(w, Concat([-1],
# ReduceProd(Gather(Shape(w), axes))))): exact, folded when their inputs are integers
SHAPE_OPS = ("Shape", "Size", "ReduceProd")
RECURRENT_WEIGHTS = {"LSTM": (1, 2, 3), "GRU": (1, 2, 3), "RNN": (1, 2, 3)}  # W, R, B
_MAX_DEPTH = 32


def _weight_inputs(node: ir.Node) -> tuple[int, ...]:
    if node.domain != "":
        return ()
    if node.op_type in RECURRENT_WEIGHTS:
        return RECURRENT_WEIGHTS[node.op_type]
    return tuple(i for i in (WEIGHT_INPUT.get(node.op_type), BIAS_INPUT.get(node.op_type)) if i is not None)


def _evaluate(node: ir.Node, arrays: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """``node``'s outputs on constant inputs, by onnx's reference implementation at ``opset``."""
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(arrays)]
    outs = [f"out{i}" for i in range(len(node.outputs))]
    attrs = {name: ir.serde.serialize_attribute(attr) for name, attr in node.attributes.items()}
    proto = onnx.helper.make_node(node.op_type, names, outs)
    proto.attribute.extend(attrs.values())
    graph = onnx.helper.make_graph([proto], "fold", [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in names if n],
                                   [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in outs])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    feeds = {n: a for n, a in zip(names, arrays) if n}
    return ReferenceEvaluator(model).run(None, feeds)


def _shape_arithmetic(node: ir.Node, inputs: list[np.ndarray | None]) -> bool:
    """A :data:`SHAPE_OPS` node that computes exactly: Shape/Size of anything, ReduceProd of integers."""
    return node.op_type != "ReduceProd" or all(a.dtype.kind in "iu" for a in inputs if a is not None)


class ExpressionFolder:
    """Values the graph computes from constants through :data:`FOLDABLE` and :data:`SHAPE_OPS` nodes
    (``value(v)``: the array, or None), and the nodes it evaluated for them (``nodes``)."""

    def __init__(self, opset: int):
        self.opset = opset
        self.values: dict[int, np.ndarray | None] = {}
        self.nodes: dict[int, ir.Node] = {}  # the nodes of the folded expressions

    def value(self, value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
        if value is None:
            return None
        if id(value) in self.values:
            return self.values[id(value)]
        array = constant_array(value)
        producer = value.producer()
        if array is None and producer is not None and depth < _MAX_DEPTH and producer.domain == "" \
                and producer.op_type in FOLDABLE + SHAPE_OPS and producer.graph is value.graph:
            inputs = [self.value(v, depth + 1) if v is not None else None for v in producer.inputs]
            if all(a is not None for v, a in zip(producer.inputs, inputs) if v is not None) \
                    and (producer.op_type in FOLDABLE or _shape_arithmetic(producer, inputs)):
                try:
                    outputs = _evaluate(producer, inputs, self.opset)
                except Exception:  # noqa: BLE001 - an expression the reference cannot run stays as it is
                    outputs = None
                if outputs is not None:
                    array = np.asarray(outputs[list(producer.outputs).index(value)])
                    self.nodes[id(producer)] = producer
        self.values[id(value)] = array
        return array


def fold_weight_expressions(graph: ir.Graph, opset: int, skip=lambda node: False) -> list[dict]:
    """Give every layer weight (and bias) that the graph computes from constants through
    :data:`FOLDABLE` ops an initializer with its value (module docstring), except in the layers
    ``skip(node)`` names (excluded, outside the scope); returns what was folded."""
    folder = ExpressionFolder(opset)
    used = {v.name for v in graph.initializers.values()} | {v.name for n in graph for v in n.outputs if v.name}
    done = []
    for node in list(graph):
        if skip(node):
            continue
        for index in _weight_inputs(node):
            value = node.inputs[index] if index < len(node.inputs) else None
            if value is None or is_constant(value) or value.producer() is None:
                continue
            array = folder.value(value)
            if array is None:
                continue
            name = NameScope.fresh(f"{value.name or f'{node.name}/input_{index}'}/folded", used)
            used.add(name)
            folded = ir.Value(name=name, const_value=ir.Tensor(contiguous(array), name=name))
            graph.register_initializer(folded)
            producer = value.producer()
            node.replace_input_with(index, folded)
            done.append({"layer": node.name, "op": node.op_type, "input": index, "value": value.name,
                         "computed_by": producer.op_type, "initializer": name})
    remove_if_unused(graph, [n for n in graph if id(n) in folder.nodes])
    return done
