"""A depthwise convolution with a channel multiplier written as a plain depthwise one (spec section 2b).

A grouped Conv with one input channel per group and ``m > 1`` output channels per group (``group = C``, weight
``[C * m, 1, kh, kw]``: a depthwise convolution with channel multiplier ``m``, TensorFlow's
``DepthwiseConv2D(depth_multiplier=m)`` and FastViT's stride-2 7x7 patch-embedding convs, ``C -> 2C``) is not
depthwise to onnxruntime's QLinearConv, which runs it group by group as ``C`` tiny matrix products: FastViT-T8's
first one (48 -> 96 channels on a 56 px map) took 6.3 ms in int8 against 0.59 ms in float, the whole int8 model 1.35x
float (``benchmarks/zoo/FINDINGS.md`` section 26).

:func:`multipliers_as_depthwise` (eval rewrite, before placement) writes it as ``Gather(x, [0]*m + [1]*m + ...,
axis=1)`` (each input channel repeated ``m`` times, in the order of the output channels that read it) and the same
Conv with ``group = C * m``: output channel ``o`` of group ``o // m`` read input channel ``o // m``, which is channel
``o`` of the gathered map. The weight and bias are unchanged, the sum the same (exact). The Gather of the quantized
input runs on its uint8 codes (the placement carries the quantizer through it), and the conv on onnxruntime's
depthwise kernel: 6.3 -> 0.21 ms for FastViT-T8's first (whole model: 0.61x float).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from qtool.model.constants import constant_array
from qtool.model.names import NameScope


def _multiplier(conv: ir.Node) -> int | None:
    """``m`` when ``conv`` is a 2-D depthwise conv with channel multiplier ``m > 1`` (module docstring), else None."""
    group = conv.attributes.get_int("group", 1)
    if group <= 1 or len(conv.inputs) < 2 or conv.inputs[0] is None:
        return None
    w = constant_array(conv.inputs[1])
    if w is None or w.ndim != 4 or w.shape[1] != 1 or w.shape[0] % group or w.shape[0] == group:
        return None
    return w.shape[0] // group


def multipliers_as_depthwise(graph: ir.Graph, names: NameScope,
                             skip: Callable[[ir.Node], str | None] = lambda _: None) -> list[str]:
    """Each depthwise Conv with a channel multiplier as ``Gather`` + depthwise Conv, in place (module docstring);
    returns the Convs' names. ``skip(node)``: a reason to leave a node as it is (``QuantConfig.out_of_scope``)."""
    done = []
    for conv in [n for n in graph if n.domain in ("", "ai.onnx") and n.op_type == "Conv" and not skip(n)]:
        m = _multiplier(conv)
        if m is None:
            continue
        group = conv.attributes.get_int("group")
        base = names.prefix(conv.name or "Conv", ["repeat"], ["channels", "repeated"])
        index = ir.Value(name=f"{base}/channels", const_value=ir.tensor(np.repeat(np.arange(group, dtype=np.int64), m)))
        graph.register_initializer(index)
        gather = ir.node("Gather", [conv.inputs[0], index], {"axis": 1}, name=f"{base}/repeat")
        gather.outputs[0].name = f"{base}/repeated"
        x = conv.inputs[0]
        if x.dtype is not None:
            gather.outputs[0].type = ir.TensorType(x.dtype)
        if x.shape is not None and len(x.shape) == 4:
            gather.outputs[0].shape = ir.Shape([x.shape[0], group * m, x.shape[2], x.shape[3]])
        graph.insert_before(conv, gather)
        conv.replace_input_with(0, gather.outputs[0])
        conv.attributes["group"] = ir.AttrInt64("group", group * m)
        done.append(conv.name)
    return done
