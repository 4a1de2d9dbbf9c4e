"""Exact eval-graph forms that onnxruntime's (1.32) integer kernels run faster.

Measured in ``benchmarks/zoo/FINDINGS.md`` section 11; each changes the kernels onnxruntime picks,
not the values of the graph as written (the Tile and SpaceToDepth forms compute the same integers in
the same kernels; the pool's depthwise QLinearConv requantizes in other float steps than
QLinearAveragePool and may land one step away on a rare tie, as any fused kernel may):

- :func:`tile_gates`: a squeeze-excite gate ``[N, C, 1, 1]`` multiplying ``[N, C, H, W]``. onnxruntime
  runs the integer graph in NHWC, where its QLinearMul of ``[1, H, W, C] x [1, 1, 1, C]`` makes one
  kernel call per pixel (C elements each: 112 x 112 x 32, 224 us against 89 us for the same-shape
  Mul). The gate's codes go through a uint8 ``Tile`` over the width (``[N, C, 1, W]``, H calls of W x C
  elements): onnxruntime's transpose optimizer moves Tile into NHWC (an ``Expand`` it cannot, and
  kept the graph NCHW around it with 24 more Transposes on EfficientNet).
- :func:`space_to_depth_conv`: a stride-2 Conv with 1 or 2 input channels (a grayscale stem) runs in
  im2col + GEMM, not the fast symmetric kernel (input channels a multiple of 4). The same
  convolution on the input's space-to-depth (``SpaceToDepth`` blocksize 2 of the uint8 codes: 4x the
  channels at half the resolution) is a stride-1 Conv whose weights hold the taps at their phase
  (zeros elsewhere) with the pads halved; it takes the fast kernel.
- :func:`pools_as_depthwise`: an ``AveragePool`` over two or four elements (kernel ``[2, 1]`` / ``[1, 2]``
  / ``[2, 2]``, no pads) becomes a depthwise Conv with weights 1/n (int8 code 1, scale 0.5 or 0.25):
  ``x * 0.5 + y * 0.5`` equals ``(x + y) / 2`` in float, so the two-element QDQ graph computes the same
  values (four terms: the same up to the order of the float sum, one step at a rare rounding tie), and
  onnxruntime's fast depthwise QLinearConv replaces its QLinearAveragePool (4x faster on the OCR's
  ``[2, 1]``; 22x on OSNet's ``[2, 2]`` stride-2 transitions, 1.09 ms -> 0.05 ms of a 9 ms person
  re-identifier: FINDINGS.md section 24).
- :func:`prelus_as_sums`: a ``PRelu`` between integer kernels runs in float either way (onnxruntime has no
  integer PRelu), and in the NHWC layout its integer convolutions put it in, its per-channel slope
  ``[1, 1, 1, C]`` made it the slowest op of MTCNN's proposal net (451 us on 118 x 158 x 10 against the
  float model's 248 us in NCHW). ``Relu(x) + Min(x, 0) * slope`` is the same value for every ``x`` (for
  ``x >= 0``: ``x + (+-0)``; below: ``0 + x * slope``, the same float product) and runs in onnxruntime's
  vectorised elementwise kernels (``benchmarks/real_models.py``, 100 rounds: MTCNN's pnet 1.34x -> 1.11x float,
  onet 0.90x -> 0.72x; FINDINGS.md section 12).
- :func:`relus_on_their_grid`: a ``Relu`` (or a ``Clip`` from 0 whose upper bound the grid does not reach)
  whose output a quantizer with a zero point above its container's low end reads (symmetric activations:
  uint8 zero point 128, or int8 zero point 0 with ``--int8-activations``). onnxruntime folds a Relu into the
  layer before it only when the zero point is the low end (``ReluQuantFusion``); otherwise the layer ran in
  float with its weights dequantized at every run (the zoo U-Net with ``--symmetric``: 14 of 15 Convs,
  1.83x float). The Relu's input is quantized on the output's own grid and the Relu written as
  ``LeakyRelu(alpha=0)``: ``Relu(Q(x)) = Q(Relu(x))`` on a grid that holds 0 (negative values go to the zero
  point either way, the others are on the grid already), so the values are those of the graph as written,
  and onnxruntime runs ``QLinearConv -> QLinearLeakyRelu`` (U-Net 0.49x float, MobileNetV3 1.05x -> 0.84x;
  a plain Relu between the pair runs as DequantizeLinear, Relu, QuantizeLinear: 0.51x / 0.88x).
- :func:`gelus_fused`: a GELU written out with Erf (``Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5``, as
  paddle2onnx and older PyTorch exporters write it) of a dequantized ``x`` becomes onnxruntime's
  ``com.microsoft.Gelu(x)``: what onnxruntime itself fuses the float model's GELU into. In the QDQ model it
  cannot: it gives each reader of a DequantizeLinear a copy of its own (``EnsureUniqueDQForNodeUnit``), and
  its GELU fusion needs the Div and the Mul to read one tensor, so the five ops ran one by one
  (PP-OCRv6 tiny's detector 0.94x -> 0.82x float, its recogniser 0.90x -> 0.77x, outputs equal to the
  bit; FINDINGS.md section 14). The same formula, computed by one kernel. GPT-2's tanh form (``x * 0.5 * (1 +
  tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``, nine ops) becomes ``com.microsoft.FastGelu(x)`` the same way
  (onnxruntime's FastGeluFusion of the float model; FINDINGS.md section 20).
- :func:`residual_adds_as_sums`: a post-norm transformer's float residual ``Add`` read only by its LayerNorm is
  written ``Sum``, the same float addition: onnxruntime fuses ``Add + LayerNormalization`` with static 3-D shapes
  (torch's dynamo exporter declares them) into a SkipLayerNormalization that its CPU kernel runs 4x slower than
  the two ops (BERT exported by dynamo 0.505x -> 0.411x float; FINDINGS.md section 25).
"""

from __future__ import annotations

import math

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from qtool.model.codec import DEQUANTIZE, QUANTIZE, dequantize_node, is_onnx, value_dtype
from qtool.model.constants import clip_bounds, constant_array, constant_source, remove_if_unused
from qtool.model.graph import take_over
from qtool.model.names import NameScope
from qtool.model.opset import inferred_shapes
from qtool.onnx_rewrite.channel_padding import DEPTHWISE_CHANNEL_ALIGN

# Below this many pixels the gate's Tile (3-4 us) costs what the broadcast Mul loses: measured on
# EfficientNet, 14 x 14 gates no gain, 28 x 28 and larger gates 6-56 % faster with the Tile.
MIN_TILED_PIXELS = 256
SPACE_TO_DEPTH_CHANNELS = (1, 2)  # input channels of a stride-2 Conv written on its space-to-depth
READ_BACK = "qtool.prelu_read_back"  # node metadata (not written): a PRelu qtool's own output had as a sum
_EIGHT = (ir.DataType.UINT8, ir.DataType.INT8)

Initializer = Callable[[str, np.ndarray], ir.Value]


def static_shape(graph: ir.Graph, value: ir.Value) -> tuple | None:
    """``value``'s shape (None for symbolic dims) from the graph or onnx shape inference, looking
    through Q/DQ to the float tensor they encode (inference ran before they existed)."""
    shapes = inferred_shapes(graph)
    while value is not None:
        if value.shape is not None:
            return tuple(d if isinstance(d, int) else None for d in value.shape)
        if value.name in shapes:
            return shapes[value.name]
        producer = value.producer()
        if producer is None or not is_onnx(producer, QUANTIZE, DEQUANTIZE):
            return None
        value = producer.inputs[0]
    return None


def per_tensor_dq(value: ir.Value | None) -> ir.Node | None:
    """The DequantizeLinear of 8-bit codes with a scalar scale and zero point that ``value`` comes from."""
    dq = value.producer() if value is not None else None
    if dq is None or not is_onnx(dq, DEQUANTIZE) or value_dtype(dq.inputs[0]) not in _EIGHT or len(dq.inputs) < 3:
        return None
    params = [constant_array(v) for v in dq.inputs[1:]]
    return dq if all(p is not None and p.size == 1 for p in params) else None


def _only_quantized(value: ir.Value) -> bool:
    """onnxruntime fuses ``DQ -> op -> Q`` into an integer kernel only when the Q is the op's sole reader."""
    uses = list(value.uses())
    return len(uses) == 1 and is_onnx(uses[0][0], QUANTIZE) and not value.is_graph_output()


def read_codes_through(graph: ir.Graph, node: ir.Node, index: int, codes: ir.Value, dq: ir.Node, base: str) -> None:
    """``node`` reads ``codes`` (new codes of ``dq``'s parameters) through a DequantizeLinear of its own."""
    new_dq = dequantize_node(codes, dq.inputs[1], dq.inputs[2], base, None, None)
    graph.insert_before(node, [codes.producer(), new_dq])
    node.replace_input_with(index, new_dq.outputs[0])
    remove_if_unused(graph, [dq])


def tile_gates(graph: ir.Graph, names: NameScope, initializer: Initializer) -> list[dict]:
    """Every integer ``Mul`` of ``[N, C, H, W]`` by a gate ``[N, C, 1, 1]`` (H x W >= MIN_TILED_PIXELS,
    W static) reads the gate's codes tiled over the width (module docstring); returns what was tiled."""
    done = []
    for mul in list(graph):
        if not is_onnx(mul, "Mul") or len(mul.inputs) != 2 or not _only_quantized(mul.outputs[0]):
            continue
        dqs = [per_tensor_dq(v) for v in mul.inputs]
        shapes = [static_shape(graph, v) for v in mul.inputs]
        if None in dqs or None in shapes or any(len(s) != 4 for s in shapes):
            continue
        for index in (0, 1):
            gate, full = shapes[index], shapes[1 - index]
            if gate[2:] != (1, 1) or gate[1] != full[1] or full[2] is None or full[3] is None \
                    or full[2] * full[3] < MIN_TILED_PIXELS:
                continue
            base = names.prefix(f"{mul.name or 'Mul'}/gate_tile", ["Tile", DEQUANTIZE],
                                ["repeats", "tiled", "dequantized"])
            tile = ir.node("Tile", [dqs[index].inputs[0], initializer(f"{base}/repeats",
                                                                        np.array([1, 1, 1, full[3]], np.int64))],
                           name=f"{base}/Tile")
            tile.outputs[0].name = f"{base}/tiled"
            tile.outputs[0].dtype = value_dtype(dqs[index].inputs[0])
            read_codes_through(graph, mul, index, tile.outputs[0], dqs[index], base)
            done.append({"mul": mul.name, "gate": list(gate[1:]), "tiled_to": [gate[1], 1, full[3]],
                         "tile": tile.name})
            break
    return done


def _phase_axis(kernel: int, begin: int, end: int, size: int) -> tuple[int, int, int]:
    """Along one axis of a stride-2 kernel: the space-to-depth block offset of tap 0 (``floor(-begin / 2)``),
    the stride-1 kernel size over blocks, and the end pad that keeps the output size (negative: none does)."""
    low, high = (-begin) // 2, (kernel - 1 - begin) // 2
    blocks = high - low + 1
    out = (size + begin + end - kernel) // 2 + 1  # = size / 2 - low + new end - blocks + 1
    return low, blocks, out - size // 2 + low + blocks - 1


def space_to_depth_conv(codes: np.ndarray, pads: list[int],
                        size: tuple[int | None, int | None]) -> tuple[np.ndarray, list[int]] | None:
    """A stride-2 Conv (weight codes ``[O, C, kh, kw]``, ``pads`` [top, left, bottom, right]) on an input of
    spatial ``size`` as a stride-1 Conv on the input's ``SpaceToDepth`` (blocksize 2: channel
    ``(2 * row phase + column phase) * C + c``): its weight codes ``[O, 4C, kh', kw']`` and pads; None
    when a size is odd or the stride-1 form would need negative pads.

    Output row ``i`` of the stride-2 Conv reads input row ``2i + a - top`` with tap ``a``: block row
    ``i + floor((a - top) / 2)`` at phase ``(a - top) mod 2``. Every tap lands on one block offset and
    phase; the other (offset, phase) pairs get weight 0, and the padded rows hold the zero point in both
    forms, so the integer sums are the same."""
    out_c, in_c, kh, kw = codes.shape
    if any(s is None or s % 2 for s in size):
        return None
    (low_h, kh2, end_h), (low_w, kw2, end_w) = (_phase_axis(kh, pads[0], pads[2], size[0]),
                                                _phase_axis(kw, pads[1], pads[3], size[1]))
    if min(end_h, end_w) < 0:
        return None
    new = np.zeros((out_c, 4 * in_c, kh2, kw2), codes.dtype)
    for a in range(kh):
        for b in range(kw):
            ra, rb = a - pads[0], b - pads[1]
            channels = (2 * (ra % 2) + rb % 2) * in_c + np.arange(in_c)
            new[:, channels, ra // 2 - low_h, rb // 2 - low_w] = codes[:, :, a, b]
    return new, [-low_h, -low_w, end_h, end_w]


def pools_as_depthwise(graph: ir.Graph, names: NameScope, initializer: Initializer) -> list[dict]:
    """Every integer two- or four-element ``AveragePool`` (no pads, channels a multiple of 16: onnxruntime's
    fast depthwise kernel) becomes a depthwise Conv of weights 1/n (module docstring); returns what was."""
    done = []
    for pool in list(graph):
        if not is_onnx(pool, "AveragePool") or not _only_quantized(pool.outputs[0]):
            continue
        attrs = pool.attributes
        kernel = list(attrs.get_ints("kernel_shape", []))
        shape = static_shape(graph, pool.inputs[0]) if per_tensor_dq(pool.inputs[0]) else None
        if shape is None or len(kernel) != 2 or int(np.prod(kernel)) not in POOL_SIZES or len(shape) != 4 \
                or shape[1] is None or shape[1] % DEPTHWISE_CHANNEL_ALIGN or any(attrs.get_ints("pads", [0])) \
                or attrs.get_int("ceil_mode", 0) or any(d != 1 for d in attrs.get_ints("dilations", [1])) \
                or attrs.get_string("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            continue
        channels = shape[1]
        base = names.prefix(f"{pool.name or 'AveragePool'}/depthwise", ["Conv", DEQUANTIZE],
                            ["weights", "scale", "zero_point", "dequantized"])
        weights = dequantize_node(initializer(f"{base}/weights", np.ones((channels, 1, *kernel), np.int8)),
                                  initializer(f"{base}/scale", np.array(1 / int(np.prod(kernel)), np.float32)),
                                  initializer(f"{base}/zero_point", np.array(0, np.int8)), base, None, None)
        conv = ir.node("Conv", [pool.inputs[0], weights.outputs[0]],
                       {"kernel_shape": kernel, "strides": list(attrs.get_ints("strides", [1, 1])), "group": channels},
                       name=f"{base}/Conv")
        graph.insert_before(pool, [weights, conv])
        name = pool.outputs[0].name
        pool.outputs[0].replace_all_uses_with(conv.outputs[0])
        graph.remove(pool, safe=True)
        conv.outputs[0].name = name
        done.append({"pool": pool.name, "kernel": kernel, "channels": channels, "conv": conv.name})
    return done


POOL_SIZES = (2, 4)  # elements of a pooling window written as a depthwise Conv (a power of two: 1/n exact)
PRELU_MIN_OPSET = 8  # Min broadcasts from opset 8


def prelus_as_sums(graph: ir.Graph, names: NameScope, initializer: Initializer, opset: int) -> list[dict]:
    """Every ``PRelu`` that reads a tensor computed from dequantized ones becomes ``Relu(x) + Min(x, 0) *
    slope`` (module docstring: the same values, faster in onnxruntime's NHWC integer graphs; a PRelu behind a
    float batch norm or Add of dequantized tensors, SINet's, too); returns what was rewritten. A PRelu of
    the model's float part (no dequantized tensor upstream) is left as it is."""
    done = []
    if opset < PRELU_MIN_OPSET:
        return done
    quantized = _from_dequantized(graph)
    for prelu in list(graph):
        x = prelu.inputs[0] if is_onnx(prelu, "PRelu") and len(prelu.inputs) == 2 else None
        if x not in quantized or prelu.inputs[1] is None:
            continue
        float_type = _float_type(x)
        if float_type is None:
            continue
        base = names.prefix(f"{prelu.name or 'PRelu'}/as_sum", ["Relu", "Min", "Mul", "Add"],
                            ["zero", "positive", "negative", "scaled"])
        zero = initializer(f"{base}/zero", np.zeros((), float_type))
        positive = ir.node("Relu", [x], name=f"{base}/Relu")
        negative = ir.node("Min", [x, zero], name=f"{base}/Min")
        scaled = ir.node("Mul", [negative.outputs[0], prelu.inputs[1]], name=f"{base}/Mul")
        total = ir.node("Add", [positive.outputs[0], scaled.outputs[0]], name=f"{base}/Add")
        dtype = value_dtype(x)
        for node, label in ((positive, "positive"), (negative, "negative"), (scaled, "scaled")):
            node.outputs[0].name = f"{base}/{label}"
            if dtype is not None:
                node.outputs[0].dtype = dtype
        graph.insert_before(prelu, [positive, negative, scaled, total])
        out = prelu.outputs[0]
        name, shape = out.name, out.shape
        out.replace_all_uses_with(total.outputs[0], replace_graph_outputs=True)
        graph.remove(prelu, safe=True)
        total.outputs[0].name, total.outputs[0].shape = name, shape
        if dtype is not None:
            total.outputs[0].dtype = dtype
        done.append({"prelu": prelu.name, "sum": total.name, **({"existing": True} if prelu.meta.get(READ_BACK) else {})})
    return done


def _from_dequantized(graph: ir.Graph) -> set[ir.Value]:
    """The values of ``graph`` computed from a DequantizeLinear's output (it included), in graph order."""
    found: set[ir.Value] = set()
    for node in graph:
        if is_onnx(node, DEQUANTIZE) or any(v in found for v in node.inputs if v is not None):
            found.update(node.outputs)
    return found


def _float_type(x: ir.Value) -> np.dtype | None:
    """The numpy float type of ``x``: its own when known, else the scale's of the nearest DequantizeLinear it
    is computed from (first inputs first); None when neither is a float type."""
    dtype = value_dtype(x)
    if dtype is not None:
        return dtype.numpy() if dtype.is_floating_point() else None
    seen, todo = set(), [x]
    while todo:
        node = todo.pop(0).producer()
        if node is None or node in seen:
            continue
        seen.add(node)
        if is_onnx(node, DEQUANTIZE):
            scale = constant_array(node.inputs[1])
            return scale.dtype if scale is not None and scale.dtype.kind == "f" else None
        todo.extend(v for v in node.inputs if v is not None)
    return None


def prelus_from_sums(graph: ir.Graph) -> int:
    """Undo :func:`prelus_as_sums` before planning (qtool's own output rewritten again): each
    ``Add(Relu(x), Mul(Min(x, 0), slope))`` of a dequantized ``x`` becomes the ``PRelu`` it was, under its
    name, so that placement sees the PRelu (its ``Relu`` is no activation ending a layer chain) and the
    model comes out as it went in. Returns how many."""
    count, quantized = 0, _from_dequantized(graph)
    for add in list(graph):
        found = _prelu_sum(add, quantized)
        if found is None:
            continue
        x, slope, parts = found
        name = add.name[: -len("/as_sum/Add")] if add.name and add.name.endswith("/as_sum/Add") else add.name
        prelu = ir.node("PRelu", [x, slope], name=name)
        prelu.meta[READ_BACK] = True  # written as a sum again: not new (the summary does not count it)
        graph.insert_before(add, prelu)
        out = add.outputs[0]
        value_name, dtype, shape = out.name, out.dtype, out.shape
        out.replace_all_uses_with(prelu.outputs[0], replace_graph_outputs=True)
        zero = parts[1].inputs[1]
        graph.remove([add, *parts], safe=True)
        source = zero.producer()
        remove_if_unused(graph, [source] if source is not None else [], [zero] if source is None else [])
        prelu.outputs[0].name, prelu.outputs[0].shape = value_name, shape
        if dtype is not None:
            prelu.outputs[0].dtype = dtype
        count += 1
    return count


def _prelu_sum(add: ir.Node, quantized: set[ir.Value]) -> tuple[ir.Value, ir.Value, list[ir.Node]] | None:
    """``(x, slope, [Relu, Min, Mul])`` when ``add`` is ``Relu(x) + Min(x, 0) * slope`` of an x among
    ``quantized`` (computed from dequantized tensors), each part read by the next alone."""
    if not is_onnx(add, "Add") or len(add.inputs) != 2 or None in add.inputs:
        return None
    producers = [v.producer() for v in add.inputs]
    relu = next((p for p in producers if p is not None and is_onnx(p, "Relu")), None)
    mul = next((p for p in producers if p is not None and is_onnx(p, "Mul")), None)
    if relu is None or mul is None or len(mul.inputs) != 2:
        return None
    low = mul.inputs[0].producer() if mul.inputs[0] is not None else None
    x = relu.inputs[0]
    if low is None or not is_onnx(low, "Min") or len(low.inputs) != 2 or low.inputs[0] is not x \
            or x not in quantized:
        return None
    zero = constant_array(low.inputs[1])
    if zero is None or zero.size != 1 or zero.item() != 0 or mul.inputs[1] is None:
        return None
    if any(len(p.outputs[0].uses()) != 1 or p.outputs[0].is_graph_output() for p in (relu, low, mul)):
        return None
    return x, mul.inputs[1], [relu, low, mul]


GELU_DOMAIN, GELU, FAST_GELU = "com.microsoft", "Gelu", "FastGelu"
_SQRT2 = math.sqrt(2.0)
_TANH_SCALE = math.sqrt(2.0 / math.pi)


def _scalar(value: ir.Value | None) -> float | None:
    array = constant_array(value) if value is not None else None
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 and array.dtype.kind == "f" else None


def _sole_reader(value: ir.Value, op: str) -> ir.Node | None:
    """The one node reading ``value`` when it is an ``op`` and ``value`` is no graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output() or not is_onnx(uses[0][0], op):
        return None
    return uses[0][0]


def _other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The input of a two-input ``node`` that is not ``value``."""
    if len(node.inputs) != 2 or None in node.inputs or value not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def _gelu_product(core: ir.Node, x: ir.Value, inner: list[ir.Node]) -> list[ir.Node] | None:
    """The nodes of ``x * 0.5 * (1 + core(...))`` once ``core`` (the Erf or Tanh) and the ``inner`` nodes computing
    its input from ``x`` are matched: the 0.5 applied to ``x`` first or to the product last, each intermediate read
    by the next alone; the last node the one giving the GELU's value."""
    add = _sole_reader(core.outputs[0], "Add")
    if add is None or _scalar(_other_input(add, core.outputs[0])) != 1.0:
        return None
    product = _sole_reader(add.outputs[0], "Mul")
    other = _other_input(product, add.outputs[0]) if product is not None else None
    if other is None:
        return None
    if other is x:  # (x * (1 + core)) * 0.5
        half = _sole_reader(product.outputs[0], "Mul")
        if half is None or _scalar(_other_input(half, product.outputs[0])) != 0.5:
            return None
        return [*inner, core, add, product, half]
    first = other.producer()  # (x * 0.5) * (1 + core)
    if first is None or not is_onnx(first, "Mul") or _other_input(first, x) is None \
            or _scalar(_other_input(first, x)) != 0.5 or len(other.uses()) != 1 or other.is_graph_output():
        return None
    return [first, *inner, core, add, product]


def _close(value: float | None, want: float) -> bool:
    return value is not None and abs(value - want) <= 1e-6 * want


def _sole_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


def _written_out_gelu(erf: ir.Node) -> tuple[ir.Value, list[ir.Node]] | None:
    """``(x, nodes)`` when ``erf`` is the core of ``x * 0.5 * (1 + erf(x / sqrt 2))`` written in standard ops
    (``/ sqrt 2`` or ``* (1 / sqrt 2)``; ``_gelu_product``'s forms of the rest)."""
    scaled = erf.inputs[0] if len(erf.inputs) == 1 else None
    scale = scaled.producer() if scaled is not None else None
    if scale is None or not is_onnx(scale, "Div", "Mul") or len(scale.inputs) != 2 or scale.inputs[0] is None:
        return None
    x = scale.inputs[0]
    if not _close(_scalar(scale.inputs[1]), _SQRT2 if scale.op_type == "Div" else 1 / _SQRT2) \
            or not _sole_use(scaled):
        return None
    nodes = _gelu_product(erf, x, [scale])
    return (x, nodes) if nodes else None


def _written_out_tanh_gelu(tanh: ir.Node) -> tuple[ir.Value, list[ir.Node]] | None:
    """``(x, nodes)`` when ``tanh`` is the core of ``x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 *
    x ** 3)))``, GPT-2's ``gelu_new`` (transformers' NewGELU and ``nn.GELU(approximate="tanh")`` as PyTorch exports
    them: Pow or ``x * (x * x)``, Mul, Add, Mul, Tanh; operands either way; ``_gelu_product``'s forms of the
    rest)."""
    scaled = tanh.inputs[0] if len(tanh.inputs) == 1 else None
    scale = scaled.producer() if scaled is not None else None
    if scale is None or not is_onnx(scale, "Mul") or not _sole_use(scaled):
        return None
    inner = next((v for v in scale.inputs if _close(_scalar(_other_input(scale, v)), _TANH_SCALE)), None)
    add = inner.producer() if inner is not None and _sole_use(inner) else None
    if add is None or not is_onnx(add, "Add"):
        return None
    for cubic in add.inputs:
        mul = cubic.producer() if cubic is not None and _sole_use(cubic) else None
        cube = next((v for v in mul.inputs if _close(_scalar(_other_input(mul, v)), 0.044715)), None) \
            if mul is not None and is_onnx(mul, "Mul") else None
        x = _other_input(add, cubic)
        power = _cube(cube, x) if cube is not None and x is not None else None
        if power is not None:
            nodes = _gelu_product(tanh, x, [*power, mul, add, scale])
            return (x, nodes) if nodes else None
    return None


def _cube(value: ir.Value, x: ir.Value) -> list[ir.Node] | None:
    """The nodes computing ``value = x ** 3`` from ``x``, each read by the next alone: ``Pow(x, 3)``, or
    ``x * (x * x)`` with the operands either way (PyTorch's TorchScript export of ``nn.GELU(approximate="tanh")``
    below opset 20)."""
    node = value.producer() if _sole_use(value) else None
    if node is None:
        return None
    if is_onnx(node, "Pow"):
        return [node] if node.inputs[0] is x and _scalar(node.inputs[1]) == 3.0 else None
    square = _other_input(node, x) if is_onnx(node, "Mul") else None
    inner = square.producer() if square is not None and _sole_use(square) else None
    if inner is None or not is_onnx(inner, "Mul") or list(inner.inputs) != [x, x]:
        return None
    return [inner, node]


def gelus_fused(graph: ir.Graph, names: NameScope) -> list[dict]:
    """Every GELU written out with Erf (or Tanh, GPT-2's form) whose input is a dequantized float32 tensor becomes
    one ``com.microsoft.Gelu`` (``FastGelu``) (module docstring: what onnxruntime fuses the float model's GELU into,
    which the QDQ model's DequantizeLinear copies prevent); a tanh GELU also where its float32 input is computed from
    dequantized tensors (a Linear's float output: onnxruntime's FastGeluFusion does not take PyTorch's ``x * (x * x)``
    form, in the float model either); returns what was fused."""
    done, quantized = [], _from_dequantized(graph)
    for core in list(graph):
        op, found = (GELU, _written_out_gelu(core)) if is_onnx(core, "Erf") else \
            (FAST_GELU, _written_out_tanh_gelu(core)) if is_onnx(core, "Tanh") else (None, None)
        if found is None:
            continue
        x, nodes = found
        dq = x.producer()
        dequantized = dq is not None and is_onnx(dq, DEQUANTIZE)
        if not (dequantized or (op == FAST_GELU and x in quantized)) \
                or value_dtype(x) not in (None, ir.DataType.FLOAT):
            continue
        last = nodes[-1]
        base = names.prefix(f"{core.name or core.op_type}/gelu", [op], [])
        gelu = ir.Node(GELU_DOMAIN, op, [x], name=f"{base}/{op}")
        graph.insert_before(last, gelu)
        out = last.outputs[0]
        name, shape, dtype = out.name, out.shape, out.dtype
        out.replace_all_uses_with(gelu.outputs[0], replace_graph_outputs=True)
        remove_if_unused(graph, nodes)  # with the constants only they read
        gelu.outputs[0].name, gelu.outputs[0].shape, gelu.outputs[0].dtype = name, shape, dtype or ir.DataType.FLOAT
        graph.opset_imports.setdefault(GELU_DOMAIN, 1)
        done.append({"gelu": gelu.name, "op": op, "nodes": [n.name for n in nodes], "ops": [n.op_type for n in nodes]})
    return done


def relus_on_their_grid(graph: ir.Graph, names: NameScope) -> list[dict]:
    """Every ``Relu`` (or ``Clip`` from 0 up to at least the grid's top) that only a per-tensor 8-bit quantizer
    whose zero point is above its container's low end reads becomes ``LeakyRelu(alpha=0)`` reading its input on
    that quantizer's grid (module docstring: the same values, an integer kernel in onnxruntime); returns what was
    rewritten. The input gets a Q/DQ pair of its own unless it is dequantized already; an input other nodes
    read too is left (its layer cannot fuse either way)."""
    done = []
    for act in list(graph):
        if not is_onnx(act, "Relu", "Clip") or not act.inputs or act.inputs[0] is None \
                or not _only_quantized(act.outputs[0]):
            continue
        q = next(iter(act.outputs[0].uses()))[0]
        grid = _per_tensor_grid(q)
        if grid is None or not _relu_on_grid(act, *grid):
            continue
        x = act.inputs[0]
        dequantized = x.producer() is not None and is_onnx(x.producer(), DEQUANTIZE)
        if not dequantized and not _sole_use(x):
            continue
        base = names.prefix(f"{act.name or act.op_type}/relu_quant", [QUANTIZE, DEQUANTIZE],
                            ["quantized", "dequantized"])
        if not dequantized:
            quantize = ir.node(QUANTIZE, [x, q.inputs[1], q.inputs[2]], name=f"{base}/{QUANTIZE}")
            quantize.outputs[0].name, quantize.outputs[0].dtype = f"{base}/quantized", value_dtype(q.outputs[0])
            dq = dequantize_node(quantize.outputs[0], q.inputs[1], q.inputs[2], base, None, x.shape)
            graph.insert_before(act, [quantize, dq])
            x = dq.outputs[0]
        sources = [constant_source(v) for v in act.inputs[1:] if v is not None]  # a Clip's bounds
        leaky = ir.node("LeakyRelu", [x], {"alpha": 0.0}, name=act.name)
        graph.insert_before(act, leaky)
        out = act.outputs[0]
        name, shape, dtype = out.name, out.shape, out.dtype
        out.replace_all_uses_with(leaky.outputs[0], replace_graph_outputs=True)
        graph.remove(act, safe=True)
        remove_if_unused(graph, [n for c in sources if c is not None for n in c.nodes],
                         [c.root for c in sources if c is not None])
        leaky.outputs[0].name, leaky.outputs[0].shape = name, shape
        leaky.outputs[0].dtype = dtype or ir.DataType.FLOAT
        done.append({"node": act.name, "op": act.op_type, "input_quantized": not dequantized})
    return done


def _per_tensor_grid(q: ir.Node) -> tuple[float, int, int] | None:
    """``(scale, zero point, container's top)`` of an 8-bit per-tensor QuantizeLinear whose codes only
    DequantizeLinear nodes read (no Clip of a narrower grid), when the zero point is above the low end."""
    if len(q.inputs) < 3 or value_dtype(q.outputs[0]) not in _EIGHT \
            or not all(is_onnx(use, DEQUANTIZE) for use, _ in q.outputs[0].uses()):
        return None
    scale, zero_point = (constant_array(v) for v in q.inputs[1:3])
    if scale is None or zero_point is None or scale.size != 1 or zero_point.size != 1:
        return None
    info = np.iinfo(zero_point.dtype)
    zp = int(zero_point.reshape(-1)[0])
    return (float(scale.reshape(-1)[0]), zp, int(info.max)) if zp > info.min else None


def _relu_on_grid(act: ir.Node, scale: float, zero_point: int, top: int) -> bool:
    """``act`` is a Relu, or a Clip from 0 whose upper bound (if any) is at or above the grid's top value."""
    if act.op_type == "Relu":
        return True
    bounds = clip_bounds(act)
    return bounds is not None and bounds[0] == 0.0 and (bounds[1] is None or bounds[1] >= (top - zero_point) * scale)


def _layer_norm_reader(value: ir.Value) -> ir.Node | None:
    """The LayerNormalization that alone reads ``value`` (at its input 0), or the ``ReduceMean`` of a LayerNorm
    written out (``Sub(value, ReduceMean(value))``, what onnxruntime's LayerNormFusion makes one first) when those
    two are its only readers; None otherwise."""
    if value.is_graph_output():
        return None
    readers = list(value.uses())
    if len(readers) == 1 and is_onnx(readers[0][0], "LayerNormalization") and readers[0][1] == 0:
        return readers[0][0]
    if len(readers) != 2 or any(index != 0 for _, index in readers):
        return None
    by_op = {node.op_type: node for node, _ in readers if node.domain == ""}
    mean, sub = by_op.get("ReduceMean"), by_op.get("Sub")
    if mean is None or sub is None or len(sub.inputs) != 2 or sub.inputs[1] is not mean.outputs[0]:
        return None
    return mean


def residual_adds_as_sums(graph: ir.Graph, names: NameScope) -> list[dict]:
    """Each float ``Add`` of two tensors computed from dequantized ones whose only reader is a LayerNormalization
    (a post-norm transformer's residual Add, float before its LayerNorm since FINDINGS.md section 9) is written as
    ``Sum`` of the same two inputs: the same float addition, which onnxruntime's SkipLayerNormFusion does not match.
    That fusion (float models with static 3-D shapes: torch's dynamo exporter declares them) makes it one
    ``com.microsoft.SkipLayerNormalization``, which onnxruntime 1.32's CPU kernel runs 4x slower than the Add and
    the LayerNormalization it replaces (1 x 128 x 256: 180 us against 40 us; FINDINGS.md section 25). Returns
    what was rewritten."""
    done = []
    quantized = _from_dequantized(graph)
    for add in list(graph):
        if not is_onnx(add, "Add") or len(add.inputs) != 2 or any(
                v is None or constant_array(v) is not None or v not in quantized for v in add.inputs):
            continue
        norm = _layer_norm_reader(add.outputs[0])
        if norm is None:
            continue
        total = ir.node("Sum", list(add.inputs), name=names.node(f"{add.name or 'Add'}/as_sum"))
        graph.insert_before(add, [total])
        take_over(add.outputs[0], total.outputs[0])
        graph.remove(add, safe=True)
        done.append({"add": add.name, "sum": total.name, "layer_norm": norm.name})
    return done
