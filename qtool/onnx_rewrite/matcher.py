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

from qtool.model.constants import is_constant
from qtool.model.graph import GraphView
from qtool.model.layers import weight_is_quantized

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


def _constant_operand(value: ir.Value) -> bool:
    """A constant, or a dequantized one (a bias Add that rewrite-eval already stored as int32)."""
    if is_constant(value):
        return True
    return weight_is_quantized(value) and bool(value.producer().inputs) and is_constant(value.producer().inputs[0])


def with_constant_operand(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    other = other_input(node, value, view)
    if other is None:
        return "not a binary op on this tensor"
    if not _constant_operand(other):
        return "its other input is not a constant"
    return None


def with_variable_operand(node: ir.Node, value: ir.Value, view: GraphView) -> str | None:
    other = other_input(node, value, view)
    if other is None:
        return "not a binary op on this tensor"
    if _constant_operand(other):
        return "its other input is a constant"
    return None
