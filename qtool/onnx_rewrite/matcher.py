"""A small forward graph matcher with reasons, in the style of TF's graph_matcher.

Patterns are declared as a chain of steps that follow data forward from a
start node (``layer -> [bias Add] -> BatchNormalization`` ...). Each step
names the op types it accepts, whether it is optional, whether the tensor it
reads must have no other consumer, and an optional ``where`` check that
returns a reason string when a candidate node does not fit. Matching returns
a :class:`Match` with the nodes by step name, or the reason the chain
stopped, so that callers can report *why* a rule did not apply (as the
onnxscript rewriter's ``check`` does).

The matcher sees the graph through :class:`GraphView`, which looks through
``QuantizeLinear -> DequantizeLinear`` pairs: a tensor followed by a
quantizer is, for matching, the same tensor (marked quantized). This is what
makes the rewrites idempotent: on an already rewritten model the same
patterns match the same layers, and every quantization point is found to
exist already.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from qtool.onnx_rewrite.constants import is_constant

QUANTIZE = "QuantizeLinear"
DEQUANTIZE = "DequantizeLinear"
# Ops a quantizer may sit behind (TF's _FollowedByFakeQuant looks through these).
QUANTIZER_LOOK_THROUGH = ("Identity", "Reshape")
# Ops between Q and DQ in qtool's own encoding of odd bit widths.
_QDQ_INNER = ("Clip", "Cast")


def _is_onnx(node: ir.Node, *op_types: str) -> bool:
    return node.domain == "" and node.op_type in op_types


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
            if _is_onnx(user, DEQUANTIZE):
                return user
            if not _is_onnx(user, *_QDQ_INNER):
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
                if _is_onnx(user, QUANTIZE) and user.inputs[0] is v:
                    return user
                if _is_onnx(user, *QUANTIZER_LOOK_THROUGH) and user.inputs[0] is v:
                    stack.append(user.outputs[0])
        return None

    def is_quantized(self, value: ir.Value) -> bool:
        """True when a quantizer follows ``value`` or ``value`` is a DQ output."""
        if self.quantizer_after(value) is not None:
            return True
        producer = value.producer()
        return producer is not None and _is_onnx(producer, DEQUANTIZE)

    def float_source(self, value: ir.Value) -> ir.Value:
        """For a DQ output that closes a Q->DQ pair, the tensor that was quantized."""
        producer = value.producer()
        if producer is None or not _is_onnx(producer, DEQUANTIZE):
            return value
        current = producer
        for _ in range(4):
            src = current.inputs[0]
            if src is None:
                return value
            p = src.producer()
            if p is None:
                return value
            if _is_onnx(p, QUANTIZE):
                return p.inputs[0] if p.inputs[0] is not None else value
            if not _is_onnx(p, *_QDQ_INNER):
                return value
            current = p
        return value

    # --- logical edges ------------------------------------------------------------------
    def consumers(self, value: ir.Value) -> list[ir.Node]:
        """Nodes reading ``value``, looking through a quantizer that follows it."""
        result: list[ir.Node] = []
        for user in value.consumers():
            if _is_onnx(user, QUANTIZE) and user.inputs[0] is value:
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


@dataclass(frozen=True)
class Step:
    """One node of a forward chain pattern."""

    name: str
    op_types: tuple[str, ...]
    optional: bool = False
    # The tensor this step reads must have this node as its only consumer.
    sole_consumer: bool = False
    # Extra check on a candidate: returns None when it fits, else a reason.
    where: Callable[[ir.Node, ir.Value, GraphView], str | None] | None = None
    # Which output of the matched node the next step follows.
    output: int = 0
    # Only tried when this earlier step matched.
    requires: str | None = None


@dataclass
class Match:
    nodes: dict[str, ir.Node] = field(default_factory=dict)
    # The tensor the chain ends at (output of its last matched node).
    end: ir.Value | None = None
    # Steps that did not match, with the reason (optional steps included).
    reasons: dict[str, str] = field(default_factory=dict)
    failed: str | None = None  # reason the whole match failed

    def __bool__(self) -> bool:
        return self.failed is None

    def get(self, name: str) -> ir.Node | None:
        return self.nodes.get(name)


@dataclass(frozen=True)
class ChainPattern:
    """A start node followed by a chain of steps along consumer edges."""

    start: Step
    steps: Sequence[Step] = ()

    def match(self, node: ir.Node, view: GraphView) -> Match:
        result = Match()
        if node.domain != "" or node.op_type not in self.start.op_types:
            result.failed = f"{node.op_type} is not one of {', '.join(self.start.op_types)}"
            return result
        result.nodes[self.start.name] = node
        current = node.outputs[self.start.output]
        for step in self.steps:
            if step.requires is not None and step.requires not in result.nodes:
                continue
            users = view.consumers(current)
            candidates = []
            last_reason = None
            for user in users:
                if user.domain != "" or user.op_type not in step.op_types:
                    continue
                if step.where is not None:
                    reason = step.where(user, current, view)
                    if reason is not None:
                        last_reason = f"{user.op_type} '{user.name}': {reason}"
                        continue
                candidates.append(user)
            reason = None
            if not candidates:
                reason = last_reason or f"no {'/'.join(step.op_types)} follows"
            elif len(candidates) > 1:
                reason = f"{len(candidates)} candidate {'/'.join(step.op_types)} nodes follow"
            elif step.sole_consumer and (len(users) != 1 or view.is_graph_output(current)):
                reason = (
                    f"'{current.name}' has other consumers besides {candidates[0].op_type} "
                    f"'{candidates[0].name}'"
                )
            if reason is not None:
                result.reasons[step.name] = reason
                if step.optional:
                    continue
                result.failed = reason
                return result
            chosen = candidates[0]
            result.nodes[step.name] = chosen
            current = chosen.outputs[step.output]
        result.end = current
        return result


# --- reusable step checks ------------------------------------------------------------
def other_input(node: ir.Node, value: ir.Value, view: GraphView) -> ir.Value | None:
    """For a binary node reading ``value``, its other input (as before quantization)."""
    ins = [view.input(node, i) for i in range(len(node.inputs))]
    if len(ins) != 2:
        return None
    if ins[0] is value and ins[1] is not value:
        return ins[1]
    if ins[1] is value and ins[0] is not value:
        return ins[0]
    return None


def with_constant_operand(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    other = other_input(node, value, view)
    if other is None:
        return "not a binary op on this tensor"
    if not is_constant(other):
        return "its other input is not a constant"
    return None


def with_variable_operand(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    other = other_input(node, value, view)
    if other is None:
        return "not a binary op on this tensor"
    if is_constant(other):
        return "its other input is a constant"
    return None
