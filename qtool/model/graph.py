"""The graph as the rewrites see it: Q/DQ pairs made transparent.

:class:`GraphView` answers "who reads this tensor" and "what produced it"
looking through ``QuantizeLinear -> [Clip/Cast] -> DequantizeLinear`` pairs: a
tensor followed by a quantizer is, for matching, the same tensor (marked
quantized). This is what makes the rewrites idempotent: on an already
rewritten model the same patterns match the same layers, and every
quantization point is found to exist already. Which nodes form a quantizer
is the codec's knowledge (:mod:`qtool.model.codec`).
"""

from __future__ import annotations

import onnx_ir as ir

from qtool.model.codec import DEQUANTIZE, QDQ_INNER, QUANTIZE, QUANTIZER_LOOK_THROUGH, is_onnx


def take_over(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere (graph outputs included) and takes its name and type."""
    name, shape, vtype = old.name, old.shape, old.type
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name = None
    new.name = name
    if vtype is not None:
        new.type, new.shape = vtype, shape


class GraphView:
    """Consumers and producers of a graph with Q/DQ pairs made transparent."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph

    # --- quantizer structure -------------------------------------------------------
    def dequantize_of_quantizer(self, q_node: ir.Node) -> ir.Node | None:
        """The DequantizeLinear closing the quantizer that starts at ``q_node``."""
        current = q_node
        for _ in range(4):
            users = current.outputs[0].consumers()
            if len(users) != 1:
                return None
            user = users[0]
            if is_onnx(user, DEQUANTIZE):
                return user
            if not is_onnx(user, *QDQ_INNER):
                return None
            current = user
        return None

    def quantizer_after(self, value: ir.Value) -> ir.Node | None:
        """A QuantizeLinear reading ``value`` directly or through Identity/Reshape."""
        seen = set()
        stack = [value]
        while stack:
            v = stack.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            for user in v.consumers():
                if is_onnx(user, QUANTIZE) and user.inputs[0] is v:
                    return user
                if is_onnx(user, *QUANTIZER_LOOK_THROUGH) and user.inputs[0] is v:
                    stack.append(user.outputs[0])
        return None

    def is_quantized(self, value: ir.Value) -> bool:
        """True when a quantizer follows ``value`` or ``value`` is a DQ output."""
        if self.quantizer_after(value) is not None:
            return True
        producer = value.producer()
        return producer is not None and is_onnx(producer, DEQUANTIZE)

    def float_source(self, value: ir.Value) -> ir.Value:
        """For a DQ output that closes a Q->DQ pair, the tensor that was quantized."""
        producer = value.producer()
        if producer is None or not is_onnx(producer, DEQUANTIZE):
            return value
        current = producer
        for _ in range(4):
            src = current.inputs[0]
            if src is None:
                return value
            p = src.producer()
            if p is None:
                return value
            if is_onnx(p, QUANTIZE):
                return p.inputs[0] if p.inputs[0] is not None else value
            if not is_onnx(p, *QDQ_INNER):
                return value
            current = p
        return value

    # --- logical edges ------------------------------------------------------------------
    def consumers(self, value: ir.Value) -> list[ir.Node]:
        """Nodes reading ``value``, looking through a quantizer that follows it."""
        result: list[ir.Node] = []
        for user in value.consumers():
            if is_onnx(user, QUANTIZE) and user.inputs[0] is value:
                dq = self.dequantize_of_quantizer(user)
                if dq is not None:
                    for inner in self.consumers(dq.outputs[0]):
                        if inner not in result:
                            result.append(inner)
                    continue
            if user not in result:
                result.append(user)
        return result

    def is_graph_output(self, value: ir.Value) -> bool:
        if value.is_graph_output():
            return True
        q = self.quantizer_after(value)
        if q is not None:
            dq = self.dequantize_of_quantizer(q)
            return dq is not None and dq.outputs[0].is_graph_output()
        return False

    def input(self, node: ir.Node, index: int) -> ir.Value | None:
        """The tensor a node reads at ``index``, as it was before quantization."""
        if index >= len(node.inputs) or node.inputs[index] is None:
            return None
        return self.float_source(node.inputs[index])

    def producer(self, value: ir.Value) -> ir.Node | None:
        return self.float_source(value).producer()


def remove_identities(graph: ir.Graph) -> int:
    """Drop the ``Identity`` nodes of ``graph`` (not of its subgraphs), as onnxruntime's first optimizer
    does: paddle2onnx writes one after nearly every op (``Add -> Identity -> Mul -> Identity -> Add``),
    which hid a conv's learnable affine block from the fold and made every pattern over two ops miss
    (so did the float-to-float Casts of Open-NSFW, which ``same_type_casts_as_identities`` makes Identities).
    The Identity's input takes its output's name (the tensors after it keep their names, and ranges);
    an input that cannot be renamed (a graph input, an initializer, a graph output) is read directly,
    unless the Identity's output is a graph output too (the node stays). Returns how many went."""
    removed = 0
    for node in list(graph):
        if not is_onnx(node, "Identity") or len(node.inputs) != 1 or node.inputs[0] is None:
            continue
        x, y = node.inputs[0], node.outputs[0]
        fixed = x.is_graph_input() or x.is_initializer() or x.is_graph_output() or x.producer() is None
        if fixed and y.is_graph_output():
            continue
        if fixed:
            y.replace_all_uses_with(x)
        else:
            take_over(y, x)
        graph.remove(node, safe=True)
        removed += 1
    return removed
