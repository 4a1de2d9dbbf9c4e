"""Zero padding written as a ``Pad`` before a Conv, folded into the Conv's ``pads`` (spec section 2b).

TensorFlow pads a stride-2 convolution with ``padding='same'`` unevenly, and tf2onnx writes that as an explicit
``Pad`` (constant 0, spatial axes only) before the Conv: M-LSD's MobileNetV2 has three. onnxruntime's PadFusion
folds the Pad into the Conv in the float model; in a QDQ model it cannot (the Pad carries its input's
quantizer, so a QuantizeLinear/DequantizeLinear pair stands between it and the Conv), and the int8 model ran
each Pad on its own over the whole uint8 map: M-LSD tiny's int8 model was slower than onnxruntime's
``quantize_static`` (whose pre-processing runs PadFusion first).

:func:`pads_into_convs` (before placement) does what PadFusion does, for the exact case: a ``Pad`` in
``constant`` mode with the value 0 and constant (or computed from constants: tf2onnx writes them as
``Concat(Split(constant))``), non-negative pads on the spatial axes only, every reader of
which is a Conv (input 0, no ``auto_pad``); the Conv then reads the Pad's input with the pads added to its own.
Padding with zeros inside the Conv is the same sum as over the zero-padded map.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.model.constants import constant_array, remove_if_unused
from qtool.model.weight_expressions import ExpressionFolder


def _spatial_pads(pad: ir.Node, folder: ExpressionFolder) -> np.ndarray | None:
    """The Pad's ``[begin..., end...]`` pads when it pads zeros on the axes after the first two only, else None."""
    if pad.attributes.get_string("mode", "constant") != "constant":
        return None
    if "pads" in pad.attributes:  # opset < 11
        pads, value = np.array(pad.attributes.get_ints("pads")), np.array(pad.attributes.get_float("value", 0.0))
    else:
        pads = folder.value(pad.inputs[1]) if len(pad.inputs) > 1 else None  # tf2onnx: Concat(Split(constant))
        given = len(pad.inputs) > 2 and pad.inputs[2] is not None
        value = constant_array(pad.inputs[2]) if given else np.zeros(1)
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:  # opset 18's axes
            return None
    if pads is None or value is None or value.size != 1 or float(value.reshape(-1)[0]) != 0.0:
        return None
    rank = len(pads) // 2
    pads = pads.astype(np.int64).reshape(-1)
    if rank < 3 or np.any(pads < 0) or np.any(pads[[0, 1, rank, rank + 1]] != 0):
        return None
    return pads


def pads_into_convs(graph: ir.Graph, opset: int, skip=lambda node: None) -> list[str]:
    """Fold every zero ``Pad`` that only Convs read into their ``pads`` (module docstring, in place); returns the
    Pads' names. ``skip(node)``: a reason to leave a Pad or Conv as it is (``QuantConfig.out_of_scope``)."""
    done, folder = [], ExpressionFolder(opset)
    for pad in [n for n in graph if n.domain == "" and n.op_type == "Pad" and not skip(n)]:
        out = pad.outputs[0]
        readers = list(out.uses())
        pads = _spatial_pads(pad, folder)
        if pads is None or not readers or out.is_graph_output() or any(
                node.domain != "" or node.op_type != "Conv" or index != 0 or skip(node)
                or node.attributes.get_string("auto_pad", "NOTSET") != "NOTSET" for node, index in readers):
            continue
        rank = len(pads) // 2
        extra = np.concatenate([pads[2:rank], pads[rank + 2:]])
        for conv, _ in readers:
            own = np.array(conv.attributes.get_ints("pads", [0] * len(extra)), np.int64)
            conv.attributes["pads"] = ir.AttrInt64s("pads", (own + extra).tolist())
            conv.replace_input_with(0, pad.inputs[0])
        remove_if_unused(graph, [pad])
        done.append(pad.name)
    remove_if_unused(graph, [n for n in graph if id(n) in folder.nodes])  # the pads' expressions, once unread
    return done
