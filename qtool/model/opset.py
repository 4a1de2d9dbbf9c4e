"""Raising the opset with ``onnx.version_converter`` (real models arrive at opset 11).

The converter serializes the whole model, which fails beyond 2 GB and copies
every weight; it never reads weight values, so it gets a light proto whose
large initializers are external-data placeholders, and the converted model
gets the original tensors back.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from qtool.errors import QtoolError
from qtool.model.constants import constant_array
from qtool.model.graph import take_over
from qtool.model.io import external_tensors, light_proto, restore_tensors

_SOFTMAX_FAMILY = ("Softmax", "LogSoftmax", "Hardmax")


def default_opset(model: ir.Model) -> int:
    version = model.opset_imports.get("")
    if version is None:
        version = model.opset_imports.get("ai.onnx")
    if version is None:
        raise QtoolError("the model imports no version of the standard ONNX operator set")
    return int(version)


def convert_opset(model: ir.Model, target: int, why: str) -> ir.Model:
    """A copy of ``model`` at opset ``target`` (weights shared, not copied)."""
    current = default_opset(model)
    if current >= target:
        return model
    proto, saved = light_proto(model)
    try:
        converted = onnx.version_converter.convert_version(proto, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError/ValueError/...
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise QtoolError(
            f"cannot convert the model from opset {current} to {target}, which {why} "
            f"(onnx version converter: {message})"
        ) from exc
    del proto
    new = ir.serde.deserialize_model(converted)
    # external tensors the light proto kept (Constant nodes' values) are read from where the model lives,
    # not from the working folder
    base_dirs = {tensor.base_dir for _, tensor in external_tensors(model) if tensor.base_dir}
    if len(base_dirs) == 1:
        ir.external_data.set_base_dir(new.graph, base_dirs.pop())
    restore_tensors(new, saved)
    if current < 11 <= target:
        _asymmetric_resizes(new.graph)
    if current < 13 <= target:
        _unwrap_last_axis_softmax(new.graph)
        _drop_empty_resize_operands(new.graph)
    return new


def _asymmetric_resizes(graph: ir.Graph) -> int:
    """Give each Resize of a model converted from below opset 11 (every one was an ``Upsample`` or an opset-10
    ``Resize``) the sampling it had.

    Before opset 11 a Resize (and Upsample) maps an output pixel to ``x_out / scale`` (``asymmetric``); at 11 the
    default is ``half_pixel``, and onnx's version converter (1.23) writes the opset-11 Resize without the
    attribute, so a bilinear upsampling moved by half a pixel: an opset-8 DeepLab's decoder upsampling (scale 7.89)
    came out 17.6 dB from the float model it was converted from, before any quantization. A nearest one rounds
    its source coordinate as onnxruntime did before opset 11 (``UpsampleBase``'s SIMPLE mode): down when it
    upsamples (every Upsample: its scales are >= 1), up when every scale is at most 1. Returns how many Resizes
    were given their sampling."""
    given = 0
    for node in graph.all_nodes():
        if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") \
                or "coordinate_transformation_mode" in node.attributes:
            continue
        node.attributes["coordinate_transformation_mode"] = ir.AttrString("coordinate_transformation_mode",
                                                                          "asymmetric")
        if node.attributes.get_string("mode", "nearest") == "nearest":
            scales = constant_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
            down = scales is not None and scales.size > 0 and bool((scales <= 1).all() and (scales < 1).any())
            node.attributes["nearest_mode"] = ir.AttrString("nearest_mode", "ceil" if down else "floor")
        given += 1
    return given


def _drop_empty_resize_operands(graph: ir.Graph) -> int:
    """Give a Resize's empty ``roi`` and ``scales`` (opset 11 needs them: PyTorch's exporter writes one empty
    initializer for both) as missing inputs, the opset-13 way, where ``sizes`` follows.

    The converter keeps them; onnxruntime's opset-13 shape inference takes an empty ``scales`` for "not given"
    only when it can read it, and cannot where the initializer is also listed as a graph input (hpc203's
    NanoDet-m, PyTorch 1.7: "Either `sizes` or `scales` must be provided, but not both"; the float model at
    opset 11 runs). Returns how many operands were dropped."""
    dropped = 0
    for node in graph:
        if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 4 \
                or node.inputs[3] is None:
            continue
        for index in (1, 2):
            array = constant_array(node.inputs[index]) if node.inputs[index] is not None else None
            if array is not None and array.size == 0:
                node.replace_input_with(index, None)
                dropped += 1
    return dropped


def _unwrap_last_axis_softmax(graph: ir.Graph) -> int:
    """Undo the converter's opset-13 wrapping of a Softmax over the last axis.

    Before opset 13 a Softmax (LogSoftmax, Hardmax) flattened its input to 2-D at ``axis``; the
    converter keeps that meaning with ``Flatten(x, axis) -> Softmax(axis=-1) -> Reshape(Shape(x))``
    whatever the axis. Where ``axis`` is the last one, ``Softmax(x, axis)`` at opset 13 computes the
    same values without the two copies, and a Softmax that writes the model output directly runs at
    its float speed: onnxruntime 1.32 took 458 us for UltraFace's [1, 17640, 3] scores between two
    tensors of its arena against 242 us into the output (benchmarks/zoo/FINDINGS.md section 15).
    Returns how many were unwrapped."""
    ranks = None
    unwrapped = 0
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in _SOFTMAX_FAMILY or len(node.inputs) != 1:
            continue
        flatten = node.inputs[0].producer() if node.inputs[0] is not None else None
        out = node.outputs[0]
        uses = list(out.uses())
        if flatten is None or flatten.op_type != "Flatten" or flatten.domain not in ("", "ai.onnx") \
                or len(flatten.outputs[0].uses()) != 1 or node.attributes.get_int("axis", -1) not in (-1, 1) \
                or len(uses) != 1 or out.is_graph_output():
            continue
        reshape = uses[0][0]
        x = flatten.inputs[0]
        shape = reshape.inputs[1].producer() if len(reshape.inputs) == 2 and reshape.inputs[1] is not None else None
        if reshape.op_type != "Reshape" or uses[0][1] != 0 or shape is None or shape.op_type != "Shape" \
                or shape.inputs[0] is not x or "start" in shape.attributes or "end" in shape.attributes:
            continue
        axis = flatten.attributes.get_int("axis", 1)
        known = x.shape if x.shape is not None else reshape.outputs[0].shape  # Reshape(Shape(x)): x's shape
        if known is not None:
            rank = len(known)
        else:
            ranks = inferred_ranks(graph) if ranks is None else ranks
            rank = ranks.get(x.name)
            if rank is None:  # x = Reshape(_, target) with a target computed at run time: the target's length
                rank = _reshape_rank(graph, x)
        if rank is None or axis != rank - 1:
            continue
        node.replace_input_with(0, x)
        node.attributes["axis"] = ir.AttrInt64("axis", axis)
        take_over(reshape.outputs[0], out)
        for dead in (reshape, flatten, shape):
            if all(not v.uses() and not v.is_graph_output() for v in dead.outputs):
                graph.remove(dead, safe=True)
        unwrapped += 1
    if unwrapped:
        graph.meta.pop("qtool.inferred_shapes", None)  # values removed
    return unwrapped


def _reshape_rank(graph: ir.Graph, value: ir.Value) -> int | None:
    """The rank of a Reshape's output from its target's static length (PyTorch computes a target as
    ``Concat(Unsqueeze(Gather(Shape(x))), -1)``, whose values shape inference may not know, but whose
    length it does)."""
    producer = value.producer()
    if producer is None or producer.op_type != "Reshape" or len(producer.inputs) != 2 or producer.inputs[1] is None:
        return None
    target = producer.inputs[1]
    shape = target.shape if target.shape is not None else inferred_shapes(graph).get(target.name)
    return shape[0] if shape is not None and len(shape) == 1 and isinstance(shape[0], int) else None


def inferred_ranks(graph: ir.Graph) -> dict[str, int]:
    """Tensor name -> rank from onnx shape inference, for values whose shape the model does not declare.

    Exporters often write no ``value_info`` (the legacy torch exporter at opset
    11, models restyled to Constant-node weights), so a value's rank can be
    unknown until shape inference runs. Failures give an empty map: the rank
    stays unknown and the caller reports why it cannot use it.
    """
    return inferred_ranks_and_types(graph)[0]


def inferred_shapes(graph: ir.Graph) -> dict[str, tuple]:
    """Tensor name -> shape from onnx shape inference (ints for static dims, None for symbolic ones),
    computed once per graph (kept in ``graph.meta``; a rewrite that changes shapes must not rely on it)."""
    key = "qtool.inferred_shapes"
    if key not in graph.meta:
        graph.meta[key], graph.meta[_DIMS_KEY] = _current_shapes_and_dims(graph)
    return graph.meta[key]


_DIMS_KEY = "qtool.inferred_dims"


def inferred_dims(graph: ir.Graph) -> dict[str, tuple]:
    """``inferred_shapes`` with the names of the symbolic dims (``dim_param``; None where a dim has neither a value
    nor a name), from the same inference."""
    if _DIMS_KEY not in graph.meta:
        inferred_shapes(graph)
        graph.meta.setdefault(_DIMS_KEY, {})  # shapes kept by a caller before the names were: none known
    return graph.meta[_DIMS_KEY]


def current_shapes(graph: ir.Graph) -> dict[str, tuple]:
    """``inferred_shapes`` of the graph as it is now, not kept: for a caller that must not fix the shapes a later
    ``inferred_shapes`` sees (the placement runs on a graph that later rewrites still change)."""
    return _current_shapes_and_dims(graph)[0]


def _current_shapes_and_dims(graph: ir.Graph) -> tuple[dict[str, tuple], dict[str, tuple]]:
    shapes: dict[str, tuple] = {}
    dims: dict[str, tuple] = {}
    for vi in _inferred(graph):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
            dims[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                  for d in t.shape.dim)
    return shapes, dims


def inferred_types(graph: ir.Graph) -> dict[str, ir.DataType]:
    """Tensor name -> element type from onnx shape inference (for values the model does not type)."""
    return inferred_ranks_and_types(graph)[1]


def inferred_ranks_and_types(graph: ir.Graph) -> tuple[dict[str, int], dict[str, ir.DataType]]:
    """:func:`inferred_ranks` and :func:`inferred_types` from one run of shape inference."""
    ranks: dict[str, int] = {}
    types: dict[str, ir.DataType] = {}
    for vi in _inferred(graph):
        if not vi.type.HasField("tensor_type"):
            continue
        t = vi.type.tensor_type
        if t.HasField("shape"):
            ranks[vi.name] = len(t.shape.dim)
        if t.elem_type:
            types[vi.name] = ir.DataType(t.elem_type)
    return ranks, types


def _inferred(graph: ir.Graph) -> list:
    """The value infos onnx shape inference finds (empty when it fails: a best effort)."""
    import onnx.shape_inference

    model = ir.Model(graph, ir_version=max(8, _ir_version_for(graph)))
    try:
        proto, _ = light_proto(model)
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is a best effort
        return []
    return list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)


def _ir_version_for(graph: ir.Graph) -> int:
    version = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 11))
    return 8 if version <= 18 else 10
