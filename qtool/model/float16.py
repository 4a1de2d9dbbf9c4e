"""A float16 model with float32 inputs and outputs, computed in float32 before it is quantized.

onnxconverter-common's ``convert_float_to_float16(model, keep_io_types=True)`` (and the exporters' ``--half``
options that call it) store every weight as float16 and cast the graph inputs to float16 and the outputs
back: the float32 interface of the original model around a float16 body. No layer of it has a float32
weight, so nothing would be quantized. Every float16 value is exact in float32: the weights, Constant
values and intermediate types become float32 again and the Casts between the two types become Identities
(which ``remove_identities`` then drops). A model whose own inputs or outputs are float16 is left as it is
(its interface would change).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.model.opset import inferred_types

FLOAT16 = ir.DataType.FLOAT16


def float16_as_float32(model: ir.Model) -> int:
    """Make the float16 body of ``model`` float32 (in place, subgraphs too); returns how many weights and
    Constant values were float16 (0: nothing changed)."""
    graph = model.graph
    if any(v.dtype == FLOAT16 for v in (*graph.inputs, *graph.outputs)):
        return 0
    graphs = [graph, *graph.subgraphs()]
    count = sum(_as_float32(v) for g in graphs for v in g.initializers.values())
    if not count:
        return 0
    types = inferred_types(graph)  # before: the float16 types tell the converter's Casts apart
    for node in graph.all_nodes():
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR and attr.value.dtype == FLOAT16:  # Constant, ConstantOfShape
                node.attributes[attr.name] = ir.AttrTensor(attr.name, _float32(attr.value))
                count += 1
        if node.domain in ("", "ai.onnx") and node.op_type == "Cast":
            _cast_as_float32(node, types)
        for out in node.outputs:
            if out is not None and out.dtype == FLOAT16:
                out.type = ir.TensorType(ir.DataType.FLOAT)
    return count


def _cast_as_float32(node: ir.Node, types: dict[str, ir.DataType]) -> None:
    """A Cast to float16 casts to float32; one between float16 and float32 is an Identity."""
    to = node.attributes.get_int("to")
    if to == FLOAT16.value:
        node.attributes["to"] = ir.AttrInt64("to", ir.DataType.FLOAT.value)
    x = node.inputs[0] if node.inputs else None
    source = None if x is None else (x.dtype or types.get(x.name))
    if to in (FLOAT16.value, ir.DataType.FLOAT.value) and source in (FLOAT16, ir.DataType.FLOAT):
        node.op_type = "Identity"
        node.attributes.pop("to")


def same_type_casts_as_identities(graph: ir.Graph) -> int:
    """Make the ``Cast`` nodes of ``graph`` (not of its subgraphs) to a floating-point type their input already has
    Identities (shape inference's type where the model does not say; a Cast in integer shape arithmetic stays), as
    onnxruntime's Cast elimination does; ``remove_identities`` then drops them. A Caffe ResNet carried through
    PyTorch (Open-NSFW) has a float-to-float Cast on either side of nearly every op (309), which hid its bias and
    batch-norm arithmetic from the affine fold. Returns how many."""
    casts = [n for n in graph if n.domain in ("", "ai.onnx") and n.op_type == "Cast" and n.inputs
             and n.inputs[0] is not None and "to" in n.attributes
             and ir.DataType(n.attributes.get_int("to")).is_floating_point()]
    types = inferred_types(graph) if any(n.inputs[0].dtype is None for n in casts) else {}
    count = 0
    for node in casts:
        if (node.inputs[0].dtype or types.get(node.inputs[0].name)) == ir.DataType(node.attributes.get_int("to")):
            node.op_type = "Identity"
            node.attributes.pop("to")
            node.attributes.pop("saturate", None)
            count += 1
    return count


def _as_float32(value: ir.Value) -> bool:
    if value.dtype != FLOAT16 or value.const_value is None:
        return False
    value.const_value = _float32(value.const_value, value.name)
    value.type = ir.TensorType(ir.DataType.FLOAT)  # a new type: a clone shares the old one
    return True


def _float32(tensor: ir.TensorProtocol, name: str | None = None) -> ir.Tensor:
    return ir.Tensor(np.asarray(tensor.numpy(), np.float32), name=name or tensor.name)
