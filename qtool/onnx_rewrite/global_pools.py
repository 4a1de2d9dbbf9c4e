"""A mean over every spatial axis written as ``ReduceMean``, as the ``GlobalAveragePool`` it is (spec section 2b).

PyTorch's dynamo exporter (``torch.onnx.export``'s default since torch 2.9) writes ``nn.AdaptiveAvgPool2d(1)``
as ``ReduceMean(x, axes=[-1, -2], keepdims=1)``, and every exporter writes ``x.mean((2, 3))`` (timm's
squeeze-excite, many classifier heads) as a ReduceMean. onnxruntime 1.32 has no integer kernel and no QDQ
selector for ReduceMean: in the int8 model each one dequantized its whole uint8 map and averaged it in float,
inside every squeeze-excite block. On the zoo's EfficientNet exported by dynamo that was 1439 us of ReduceMean
and 358 us of DequantizeLinear per run, against 122 us for QLinearGlobalAveragePool on the TorchScript export
of the same weights: its int8 model ran at 0.98x float instead of 0.80x.

:func:`means_as_global_pools` (before placement) writes such a ReduceMean as a GlobalAveragePool, which
onnxruntime fuses with its Q/DQ into ``QLinearGlobalAveragePool``: a ReduceMean of a float tensor of known rank
4 or 5 over exactly the axes after the first two (the spatial axes of NCHW / NCDHW), with ``keepdims=1``; with
``keepdims=0``, a GlobalAveragePool then a Squeeze of those axes, which writes the ReduceMean's output.
Both compute the mean of the same values (up to float summation order). Rank 3 is left alone: a mean over the
last axis of ``[N, T, D]`` is a LayerNorm's, not a pool.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.model.constants import remove_if_unused
from qtool.model.graph import take_over
from qtool.model.names import NameScope
from qtool.model.opset import inferred_ranks_and_types
from qtool.model.weight_expressions import ExpressionFolder

FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)


def _axes(node: ir.Node, folder: ExpressionFolder, rank: int) -> list[int] | None:
    """The ReduceMean's axes, non-negative and sorted, or None when they are not constant (or empty)."""
    if "axes" in node.attributes:  # opset < 18
        axes = node.attributes.get_ints("axes")
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        array = folder.value(node.inputs[1])
        if array is None:
            return None
        axes = [int(a) for a in np.asarray(array).reshape(-1)]
    else:
        return None  # every axis (or none, with noop_with_empty_axes): not a spatial pool
    if not axes or any(not -rank <= a < rank for a in axes):
        return None
    return sorted(a % rank for a in axes)


class _Inferred:
    """Ranks and element types from onnx shape inference, for values the model does not declare (the TorchScript
    exporter writes no value_info), computed once and only when asked."""

    def __init__(self, graph: ir.Graph):
        self.graph, self.ranks, self.types = graph, None, None

    def rank_and_type(self, x: ir.Value) -> tuple[int | None, ir.DataType | None]:
        rank = len(x.shape) if x.shape is not None else None
        dtype = x.dtype
        if rank is None or dtype is None:
            if self.ranks is None:
                self.ranks, self.types = inferred_ranks_and_types(self.graph)  # one shape inference
            rank = rank if rank is not None else self.ranks.get(x.name)
            dtype = dtype if dtype is not None else self.types.get(x.name)
        return rank, dtype


def _spatial_mean(node: ir.Node, folder: ExpressionFolder, inferred: _Inferred) -> tuple[ir.Value, int, bool] | None:
    """``(x, rank, keepdims)`` when ``node`` is a ReduceMean of a float ``x`` of rank 4 or 5 over its spatial
    axes."""
    if node.domain != "" or node.op_type != "ReduceMean" or not node.inputs or node.inputs[0] is None:
        return None
    x = node.inputs[0]
    rank, dtype = inferred.rank_and_type(x)
    if rank not in (4, 5) or dtype not in FLOATS:
        return None
    if _axes(node, folder, rank) != list(range(2, rank)):
        return None
    return x, rank, bool(node.attributes.get_int("keepdims", 1))


def means_as_global_pools(graph: ir.Graph, opset: int, names: NameScope, skip=lambda node: None) -> list[str]:
    """Each ReduceMean over the spatial axes of a 4-D / 5-D float tensor as a GlobalAveragePool (and a Squeeze
    when it drops the axes), in place (module docstring); returns the ReduceMeans' names. ``skip(node)``: a
    reason to leave a node as it is (``QuantConfig.out_of_scope``)."""
    done, folder, inferred = [], ExpressionFolder(opset), _Inferred(graph)
    for node in [n for n in graph if n.domain == "" and n.op_type == "ReduceMean" and not skip(n)]:
        found = _spatial_mean(node, folder, inferred)
        if found is None:
            continue
        x, rank, keepdims = found
        base = names.prefix(node.name or "ReduceMean", ["GlobalAveragePool", "Squeeze"], ["pooled", "axes"])
        pool = ir.node("GlobalAveragePool", [x], name=f"{base}/GlobalAveragePool")
        new = [pool]
        if not keepdims:
            axes = list(range(2, rank))
            pooled = pool.outputs[0]
            pooled.name = f"{base}/pooled"
            if x.shape is not None and x.dtype is not None:
                pooled.type, pooled.shape = ir.TensorType(x.dtype), ir.Shape([x.shape[0], x.shape[1]] + [1] * len(axes))
            if opset >= 13:
                const = ir.Value(name=f"{base}/axes", const_value=ir.tensor(np.array(axes, np.int64)))
                graph.register_initializer(const)
                new.append(ir.node("Squeeze", [pool.outputs[0], const], name=f"{base}/Squeeze"))
            else:
                new.append(ir.node("Squeeze", [pool.outputs[0]], {"axes": axes}, name=f"{base}/Squeeze"))
        graph.insert_before(node, new)
        take_over(node.outputs[0], new[-1].outputs[0])
        remove_if_unused(graph, [node])  # with its axes' initializer or Constant
        done.append(node.name)
    return done
