"""An ``If`` branch as a model of its own, and back.

Exporters put whole models inside ``If`` nodes (Silero VAD runs everything in
one ``If`` on its sample rate; its 16 kHz and 8 kHz networks are the two
branches). qtool quantizes such a branch as the model it is: the branch's body
moves into a model of its own (:func:`extract_branch`) whose inputs are the
tensors it reads from the enclosing graph and whose initializers are the
constants it reads from there (the weights stay weights), the usual fold,
plan, calibration and encoding run on that model, and the body moves back
(:meth:`Extracted.splice`), reading the enclosing graph's tensors again.
Bodies of ``Loop`` and ``Scan`` are not rewritten (their iterations carry
state the calibration cannot see). Pure graph edits: nothing runs here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.model.constants import constant_array
from qtool.model.layers import LAYER_OPS
from qtool.model.names import NameScope

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
BRANCHES = ("then_branch", "else_branch")


def _layer_ops(body: ir.Graph) -> list[ir.Node]:
    """The layer ops (recurrent ones included) of ``body``, at any depth."""
    return [n for n in body.all_nodes() if n.domain == "" and n.op_type in (*LAYER_OPS, *RECURRENT_OPS)]


def if_branches(graph: ir.Graph) -> list[tuple[ir.Node, str]]:
    """The ``(If node, attribute name)`` of every branch of ``graph``'s own If nodes that holds a layer op
    (at any depth: an If inside the branch is the branch-model's own, handled when it is rewritten)."""
    found = []
    for node in graph:
        if node.domain != "" or node.op_type != "If":
            continue
        for name in BRANCHES:
            attr = node.attributes.get(name)
            if attr is not None and attr.type == ir.AttributeType.GRAPH and _layer_ops(attr.as_graph()):
                found.append((node, name))
    return found


def _graphs_in(body: ir.Graph) -> set[int]:
    """``id`` of ``body`` and of every graph nested in it."""
    return {id(body), *(id(sub) for sub in _bodies(body))}


def _defined_in(value: ir.Value, graphs: set[int]) -> bool:
    producer = value.producer()
    graph = producer.graph if producer is not None else value.graph
    return graph is not None and id(graph) in graphs


def outer_reads(body: ir.Graph) -> list[ir.Value]:
    """The enclosing graphs' tensors that ``body`` (or a graph nested in it) reads, in first-use order."""
    graphs = _graphs_in(body)
    seen: dict[int, ir.Value] = {}
    for node in body.all_nodes():
        for value in node.inputs:
            if value is not None and id(value) not in seen and not _defined_in(value, graphs):
                seen[id(value)] = value
    for value in body.outputs:  # a branch may return an enclosing tensor as it is
        if id(value) not in seen and not _defined_in(value, graphs):
            seen[id(value)] = value
    return list(seen.values())


@dataclass
class Extracted:
    """A branch moved into ``model``; :meth:`splice` moves it back (it must be called, also on errors)."""

    node: ir.Node
    attribute: str
    model: ir.Model
    inputs: dict[str, ir.Value]  # the model's input name -> the enclosing tensor it stands for
    # id(copied initializer) -> (the enclosing constant, the tensor copied): a copy the rewrite left as it was
    # reads the enclosing constant again
    constants: dict[int, tuple[ir.Value, object]] = field(default_factory=dict)

    @property
    def body(self) -> ir.Graph:
        return self.node.attributes[self.attribute].as_graph()

    def type_inputs(self, dtypes: dict) -> None:
        """Inputs the enclosing graph does not type take the element type (numpy's, by input name) of the
        arrays it fed them."""
        for value in self.model.graph.inputs:
            if value.type is None and value.name in dtypes:
                value.type = ir.TensorType(ir.DataType.from_numpy(dtypes[value.name]))

    def splice(self) -> None:
        """The (rewritten) branch model's nodes back in the If's body, reading the enclosing tensors
        again; its new initializers (quantized weights, scales) become the body's."""
        graph, body = self.model.graph, self.body
        outer = {id(v): self.inputs[v.name] for v in graph.inputs}
        for value in graph.initializers.values():
            source, tensor = self.constants.get(id(value), (None, None))
            if source is not None and value.const_value is tensor:
                outer[id(value)] = source
        outputs = [outer.get(id(v), v) for v in graph.outputs]
        graph.outputs.clear()
        _rewire(graph, outer)
        for name, value in list(graph.initializers.items()):
            graph.initializers.pop(name)
            if id(value) not in outer and (value.uses() or value.is_graph_output()):
                body.register_initializer(value)
        for node in list(graph):
            graph.remove(node)
            body.append(node)
        graph.inputs.clear()
        body.outputs.extend(outputs)


def _rewire(graph: ir.Graph, mapping: dict[int, ir.Value]) -> None:
    """Every read (at any depth) of a value in ``mapping`` reads its replacement instead."""
    for node in graph.all_nodes():
        for index, value in enumerate(node.inputs):
            if value is not None and id(value) in mapping:
                node.replace_input_with(index, mapping[id(value)])


def extract_branch(node: ir.Node, attribute: str, model: ir.Model,
                   types: dict[str, ir.DataType] | None = None) -> Extracted:
    """Move the body of ``node.<attribute>`` into a model of its own (opsets and IR version of
    ``model``): the enclosing tensors it reads become graph inputs of the same names (typed from
    ``types``, onnx's inference, where the model does not type them), the enclosing constants
    (initializers, Constant nodes) initializers of the same names. The body is left empty until
    :meth:`Extracted.splice`."""
    body = node.attributes[attribute].as_graph()
    inputs, initializers, by_name, constants, mapping = [], [], {}, {}, {}
    for value in outer_reads(body):
        vtype = value.type or (ir.TensorType(types[value.name]) if value.name in (types or {}) else None)
        copy = ir.Value(name=value.name, type=vtype,
                        shape=ir.Shape(value.shape) if value.shape is not None else None)
        array = constant_array(value) if value.is_initializer() or _is_constant_node(value) else None
        if array is not None:
            copy.const_value = ir.tensor(array, name=value.name)
            copy.type, copy.shape = ir.TensorType(copy.const_value.dtype), ir.Shape(array.shape)
            initializers.append(copy)
            constants[id(copy)] = (value, copy.const_value)
        else:
            inputs.append(copy)
            by_name[value.name] = value
        mapping[id(value)] = copy
    graph = ir.Graph(inputs=inputs, outputs=[], nodes=[], initializers=initializers,
                     opset_imports=dict(model.opset_imports), name=f"{node.name}.{attribute}")
    outputs = [mapping.get(id(v), v) for v in body.outputs]
    body.outputs.clear()
    for name, value in list(body.initializers.items()):
        body.initializers.pop(name)
        graph.register_initializer(value)
    for inner in list(body):
        body.remove(inner)
        graph.append(inner)
    _rewire(graph, mapping)
    graph.outputs.extend(outputs)
    sub = ir.Model(graph, ir_version=model.ir_version, producer_name=model.producer_name)
    return Extracted(node, attribute, sub, by_name, constants)


def _is_constant_node(value: ir.Value) -> bool:
    producer = value.producer()
    return producer is not None and producer.domain == "" and producer.op_type == "Constant"


def replace_if(graph: ir.Graph, node: ir.Node, count: int) -> ir.Node:
    """``node`` (an If whose branches now return ``count`` values) replaced by an If with ``count`` outputs;
    its first outputs keep their names, types and readers."""
    new = ir.Node("", "If", node.inputs, node.attributes.values(), num_outputs=count, name=node.name)
    graph.insert_after(node, new)
    for old, out in zip(node.outputs, new.outputs):
        name, shape, vtype = old.name, old.shape, old.type
        old.replace_all_uses_with(out, replace_graph_outputs=True)
        old.name, out.name, out.shape, out.type = None, name, shape, vtype
    for old in node.outputs[count:]:
        if old.is_graph_output():
            graph.outputs.remove(old)
    graph.remove(node, safe=True)
    return new


def branch_layers(node: ir.Node, attribute: str) -> list[tuple[str, str]]:
    """``(name, op)`` of the layer ops in a branch (at any depth), for the report of a branch left float."""
    return [(n.name, n.op_type) for n in _layer_ops(node.attributes[attribute].as_graph())]


def branch_config(config: QuantConfig, graph: ir.Graph) -> QuantConfig | None:
    """``config`` for a branch model: the ``--exclude`` names in it (the others are elsewhere in the
    model, checked there); None when ``--scope`` matches none of its nodes (nothing to quantize)."""
    names = {n.name for n in graph.all_nodes() if n.name}
    if config.scope and not any(name.startswith(config.scope) for name in names):
        return None
    return dataclasses.replace(config, exclude=frozenset(e for e in config.exclude if e in names))


def finish_branches(graph: ir.Graph) -> None:
    """After the branches moved back: every tensor name defined once in the whole model (a branch model
    named its new tensors without seeing the enclosing graph's names), and the enclosing constants
    only the branches read before they were quantized removed."""
    used = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    used |= {v.name for node in graph for v in node.outputs if v.name}
    for body in _bodies(graph):
        defined = [*body.inputs, *body.initializers.values(), *(v for n in body for v in n.outputs)]
        for value in defined:
            if value.name in used:
                value.name = NameScope.fresh(value.name, used)
            if value.name:
                used.add(value.name)
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output() and not value.is_graph_input():
            graph.initializers.pop(name)


def _bodies(graph: ir.Graph) -> list[ir.Graph]:
    """Every graph nested in ``graph``, enclosing ones first."""
    out = []
    for node in graph:
        for attr in node.attributes.values():
            subs = ([attr.as_graph()] if attr.type == ir.AttributeType.GRAPH else
                    list(attr.as_graphs()) if attr.type == ir.AttributeType.GRAPHS else [])
            for sub in subs:
                out.append(sub)
                out += _bodies(sub)
    return out
