"""The deployable eval graph: a quantization plan encoded as QuantizeLinear/DequantizeLinear.

Spec section 6. For each point of a :class:`~qtool.onnx_rewrite.placement.QuantPlan`:

- **weights**: quantized offline with qtool's kernels (``quantize_codes``,
  narrow range, last-value range widened to 0 or symmetric) and stored as a
  signed integer initializer ``<ctx>/weights_quant/quantized`` (values
  ``q - 2**(bits-1)``) with ``scale``/``zero_point`` initializers, read by a
  ``DequantizeLinear`` (``axis`` = the layer's output-channel axis when
  per-channel);
- **activations**: ``QuantizeLinear -> [Clip] -> DequantizeLinear`` on the
  tensor, every reader (graph outputs included, which keep their names) reads
  the dequantized value. Scale and zero point are TF's nudged ones for the
  calibrated (or default) range; uint8 for asymmetric ranges, int8 (zero point
  ``zp - 128``) for symmetric ones.

Two additions make onnxruntime run the layers in int8, as TF's converter
does for TFLite; neither changes the values TF's fake-quant graph computes
beyond the rounding of an int32 bias:

- **carried quantizers** (placed by ``placement.integer``; formerly "propagated input
  quantizers"): a layer whose input comes from a quantized
  tensor through range-keeping ops (MaxPool, Reshape, Flatten, Transpose,
  (Un)Squeeze, Identity, AveragePool, GlobalAveragePool, ReduceMean/Max/Min) gets a Q/DQ with the
  same parameters on its input (TFLite also runs these ops on the input's
  scale);
- **int32 biases**: the bias of a Conv/ConvTranspose/Gemm whose weight and
  input are quantized is stored as int32 with scale ``input_scale *
  weight_scale`` and zero point 0 (TFLite's bias encoding; onnxruntime only
  fuses a QDQ Conv into QLinearConv with such a bias): ``round_half_even(
  float32(b / scale))``, saturated to int32 when the layer may run in 8-bit
  kernels. The constant of a MatMul's bias ``Add`` too: onnxruntime's basic
  optimizations fuse MatMul + Add into a Gemm and quantize its float bias
  that way themselves, so leaving it float made the results depend on the
  optimization level (where it makes that Gemm: ``becomes_gemm``; where it does
  not, an input with symbolic dims, the eval graph writes the Gemm itself:
  ``linear_gemms``). A
  qtool training graph models this rounding
  (``qtool::FakeQuantBias``), so a trained bias deploys unchanged.

QuantizeLinear rounds half to even where TF's FakeQuant rounds half up;
weights are rounded offline by the kernels in the asked round mode, so with
``half_up`` only activations can differ, by one step on exact ties, and with
``half_to_even`` (a training graph's FakeQuant computing QuantizeLinear's
level) nothing does.

**LSTMs** (``plan.recurrent``, placed by ``placement.integer.RecurrentLayers``) become
onnxruntime's ``com.microsoft.DynamicQuantizeLSTM``: ``W``/``R`` quantized by the codec
(``dynamic_lstm_weight``: the same weight grid as the layers', stored transposed to
``[num_directions, K, 4*hidden_size]`` with scales ``[num_directions, 4*hidden_size]`` per
channel), the bias, sequence lengths, initial states, peepholes and attributes passed through.
The kernel quantizes its input and hidden state itself at run time (uint8, the range of each
matrix it multiplies), so no Q/DQ pair is written around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.config import QuantConfig
from qtool.model.codec import (
    DEQUANTIZE,
    QUANTIZE,
    Storage,
    activation_params,
    bias_fit_range,
    dequantize_node,
    dynamic_lstm_weight,
    eight_bit_kernel_types,
    qdq_names,
    qdq_nodes,
    storage,
    weight_params,
    weight_params_in_range,
)
from qtool.model.constants import constant_array, constant_source, contiguous, remove_if_unused
from qtool.model.graph import GraphView, take_over
from qtool.model.layers import float_attr, group_of, layer_bias, layer_input, layer_weight, per_output_channel
from qtool.model.names import NameScope, context_of
from qtool.onnx_rewrite.channel_padding import pad_axis, pad_depthwise_channels, symmetric_int8_codes, widen_outputs
from qtool.onnx_rewrite.hard_activations import gate_parameters, gate_shift
from qtool.onnx_rewrite.kernel_forms import (
    SPACE_TO_DEPTH_CHANNELS,
    pools_as_depthwise,
    gelus_fused,
    prelus_as_sums,
    read_codes_through,
    relus_on_their_grid,
    residual_adds_as_sums,
    space_to_depth_conv,
    static_shape,
    tile_gates,
)
from qtool.onnx_rewrite.placement import ActivationPoint, LeftInFloat, QuantPlan, RecurrentPoint, WeightPoint
from qtool.onnx_rewrite.linear_gemms import linears_as_gemms, reshapes_to_gemm
from qtool.onnx_rewrite.placement.integer import DYNAMIC_LSTM, DYNAMIC_LSTM_DOMAIN, becomes_gemm

_INT32 = np.iinfo(np.int32)


@dataclass
class EvalEncoding:
    """What the encoder did, for the report."""

    weights: list[dict] = field(default_factory=list)
    activations: list[dict] = field(default_factory=list)
    propagated: list[dict] = field(default_factory=list)
    biases: list[dict] = field(default_factory=list)
    recurrent: list[dict] = field(default_factory=list)  # LSTMs written as DynamicQuantizeLSTM
    integer_gates: list[dict] = field(default_factory=list)  # HardSigmoids written as an integer Add
    scalar_operands: list[dict] = field(default_factory=list)  # Add/Mul constants read through their own DQ
    padded_inputs: list[dict] = field(default_factory=list)  # Convs whose input channels were padded to 4k
    padded_depthwise: list[dict] = field(default_factory=list)  # depthwise Convs widened to 16k channels
    widened_outputs: list[dict] = field(default_factory=list)  # narrow Convs widened to 16 / 8k output channels
    float_inputs_per_channel: list[str] = field(default_factory=list)  # float layers kept float in onnxruntime
    space_to_depth: list[dict] = field(default_factory=list)  # stride-2 Convs read through a SpaceToDepth
    tiled_gates: list[dict] = field(default_factory=list)  # squeeze-excite gates tiled over the width
    depthwise_pools: list[dict] = field(default_factory=list)  # two-element AveragePools as depthwise Convs
    prelu_sums: list[dict] = field(default_factory=list)  # PRelus of dequantized tensors as Relu + Min * slope
    fused_gelus: list[dict] = field(default_factory=list)  # written-out GELUs as com.microsoft.Gelu / FastGelu
    relus_on_grid: list[dict] = field(default_factory=list)  # Relus before a symmetric grid as LeakyRelu(0)
    residual_sums: list[dict] = field(default_factory=list)  # float Adds before a LayerNormalization as Sum
    linear_gemms: list[dict] = field(default_factory=list)  # MatMul + bias Add on symbolic dims as a Gemm
    left_in_float: list[LeftInFloat] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def activation_storage(config: QuantConfig):
    """The container of ``config``'s activations (uint8 / uint16, or signed with ``int8_activations``)."""
    return storage(config.activation_bits, signed=config.int8_activations, narrow=False)


def needed_opset(config: QuantConfig) -> int:
    """The opset the eval encoding of ``config`` needs."""
    need = 10
    if config.per_channel:
        need = 13
    w = storage(config.weight_bits, signed=True, narrow=True, int4=config.pack_int4)
    a = activation_storage(config)
    need = max(need, w.opset, a.opset)
    if a.needs_clip and a.dtype in (ir.DataType.UINT8, ir.DataType.INT8):
        need = max(need, 12)  # Clip on integer types
    return need


def _tensor(array: np.ndarray, name: str, dtype: ir.DataType | None = None) -> ir.Tensor:
    return ir.Tensor(contiguous(array), dtype=dtype, name=name)


@dataclass
class TrainedWeight:
    """A training graph's weight as ``encode_weight`` quantized it, for the widening its biases may ask."""

    weight: np.ndarray  # the float weight
    axis: int  # its per-channel axis
    lo: np.ndarray  # its range (after widening to 0 or symmetric), one value per channel
    hi: np.ndarray
    dq: ir.Node  # its DequantizeLinear
    scale: np.ndarray  # the array of ``weight_scales`` (updated in place)


class EvalEncoder:
    def __init__(self, graph: ir.Graph, plan: QuantPlan, names: NameScope, opset: int, trained: bool = False,
                 widen_for_bias: frozenset[str] = frozenset()):
        self.graph = graph
        self.trained = trained  # a qtool training graph: its FakeQuantBias saturates, so the deployed bias does
        # a training graph's layers whose weight range it widens for their bias (contract: widen_weight)
        self.widen_for_bias = widen_for_bias
        self.trained_weights: dict[int, TrainedWeight] = {}  # layer id -> its weight (training graphs, per channel)
        self.plan = plan
        self.config = plan.config
        self.names = names
        self.opset = opset
        self.view = GraphView(graph)
        self.result = EvalEncoding()
        self.weight_scales: dict[int, tuple[np.ndarray, int | None]] = {}  # layer id -> (scale, axis)
        self.parameters: dict[str, tuple[ir.Value, ir.Value]] = {}  # tensor -> its quantizer's scale, zero point

    # --- helpers ---------------------------------------------------------------------------
    def initializer(self, name: str, array: np.ndarray, dtype: ir.DataType | None = None) -> ir.Value:
        tensor = _tensor(array, name, dtype)
        # no type/shape on the value: they would be written as redundant value_info
        value = ir.Value(name=name, const_value=tensor)
        self.graph.register_initializer(value)
        return value

    def _insert_after(self, value: ir.Value, nodes: list[ir.Node]) -> None:
        producer = value.producer()
        if producer is not None and producer.graph is self.graph:
            self.graph.insert_after(producer, nodes)
        elif len(self.graph):
            self.graph.insert_before(self.graph[0], nodes)
        else:
            self.graph.extend(nodes)

    def insert_qdq(self, value: ir.Value, base: str, scale: ir.Value, zero_point: ir.Value, store: Storage) -> ir.Node:
        """Q -> [Clip] -> DQ on ``value`` (the codec's nodes); every reader of ``value`` reads the DQ output,
        except those that read only its shape: they read the integers (same shape), so no DequantizeLinear
        is computed for a Shape and the producer keeps the QuantizeLinear as its only reader (fusion)."""
        uses = list(value.uses())
        shape_readers = [(n, i) for n, i in uses if n.domain == "" and n.op_type in ("Shape", "Size")]
        uses = [u for u in uses if u not in shape_readers]
        was_output = [i for i, out in enumerate(self.graph.outputs) if out is value]
        nodes, out = qdq_nodes(value, base, scale, zero_point, store, self.initializer)
        self._insert_after(value, nodes)
        for node, index in uses:
            node.replace_input_with(index, out)
        for node, index in shape_readers:
            node.replace_input_with(index, nodes[0].outputs[0])
        if was_output:
            name = value.name
            value.name = self.names.value(f"{name}/float")
            out.name = name
            for i in was_output:
                self.graph.outputs[i] = out
        return nodes[-1]

    def _qdq_prefix(self, base: str, store: Storage) -> str:
        return self.names.prefix(base, *qdq_names(store))

    # --- weights ---------------------------------------------------------------------------
    def encode_weight(self, point: WeightPoint) -> None:
        w = constant_array(point.value)
        layer_names = [n.name for n in point.layers]
        if w is None or w.dtype != np.float32:
            for n in point.layers:
                self.result.left_in_float.append(LeftInFloat(n.name, n.op_type, "weights not quantized: not a float32 constant"))
            return
        if not np.all(np.isfinite(w)):
            for n in point.layers:
                self.result.left_in_float.append(LeftInFloat(n.name, n.op_type, "weights not quantized: the weight has inf or NaN values"))
            return
        cfg = self.config
        stored, params = weight_params(w, bits=cfg.weight_bits, symmetric=cfg.weights_symmetric, axis=point.axis,
                                       int4=cfg.pack_int4, round_mode=cfg.round_mode)
        base = self.names.prefix(point.name, ["DequantizeLinear"], ["quantized", "scale", "zero_point", "dequantized"])
        q_init = self.initializer(f"{base}/quantized", stored, params.storage.dtype)
        scale = self.initializer(f"{base}/scale", params.scale)
        zp = self.initializer(f"{base}/zero_point", params.zero_point, params.storage.dtype)
        dq = dequantize_node(q_init, scale, zp, base, point.axis, w.shape)
        first = min(point.layers, key=lambda n: self._position(n))
        self.graph.insert_before(first, dq)
        source = constant_source(point.value)
        trained = None
        if self.trained and point.axis is not None and any(n.name in self.widen_for_bias for n in point.layers):
            trained = TrainedWeight(w, point.axis, np.asarray(params.range[0], np.float32),
                                    np.asarray(params.range[1], np.float32), dq, params.scale)
        for layer in point.layers:
            for i, v in enumerate(layer.inputs):
                if v is point.value and i == 1:
                    layer.replace_input_with(i, dq.outputs[0])
            self.weight_scales[id(layer)] = (params.scale, point.axis)
            if trained is not None:
                self.trained_weights[id(layer)] = trained
        if source is not None:
            remove_if_unused(self.graph, source.nodes, [source.root])
        entry = {
            "tensor": point.value.name,
            "layers": layer_names,
            "op": point.layers[0].op_type,
            "quantizer": base,
            "axis": point.axis,
            "bits": cfg.weight_bits,
            "channels": int(np.size(params.scale)),
            "dtype": params.storage.dtype.name.lower(),
        }
        if params.degenerate:
            entry["all_zero_channels"] = params.degenerate
        self.result.weights.append(entry)

    def _position(self, node: ir.Node) -> int:
        if not hasattr(self, "_order"):
            self._order = {id(n): i for i, n in enumerate(self.graph)}
        return self._order.get(id(node), 0)

    # --- LSTMs -----------------------------------------------------------------------------------
    def encode_recurrent(self, point: RecurrentPoint) -> None:
        """The LSTM becomes ``com.microsoft.DynamicQuantizeLSTM`` reading int8 ``W``/``R``."""
        lstm, cfg = point.node, self.config
        w, r = constant_array(lstm.inputs[1]), constant_array(lstm.inputs[2])
        for what, array in (("W", w), ("R", r)):
            if array is None or not np.all(np.isfinite(array)):
                self.result.left_in_float.append(LeftInFloat(
                    lstm.name, lstm.op_type, f"weights not quantized: {what} has inf or NaN values"))
                return
        quantized = {what: dynamic_lstm_weight(a, bits=cfg.weight_bits, symmetric=point.symmetric,
                                               per_channel=point.per_channel, round_mode=cfg.round_mode)
                     for what, a in (("W", w), ("R", r))}
        values = [f"{what}_{part}" for what in "WR" for part in ("quantized", "scale", "zero_point")]
        base = self.names.prefix(point.name, [DYNAMIC_LSTM], values)
        extra = []
        for what, q in quantized.items():
            dtype = q.params.storage.dtype
            extra.append((self.initializer(f"{base}/{what}_quantized", q.stored, dtype),
                          self.initializer(f"{base}/{what}_scale", q.scale),
                          self.initializer(f"{base}/{what}_zero_point", q.zero_point, dtype)))
        (wq, ws, wz), (rq, rs, rz) = extra
        passed = list(lstm.inputs[3:8]) + [None] * (8 - len(lstm.inputs[:8]))
        attributes = [a for name, a in lstm.attributes.items() if name != "layout"]
        if "hidden_size" not in lstm.attributes:
            attributes.append(ir.AttrInt64("hidden_size", int(r.shape[2])))
        node = ir.Node(DYNAMIC_LSTM_DOMAIN, DYNAMIC_LSTM, [lstm.inputs[0], wq, rq, *passed[:5], ws, wz, rs, rz],
                       attributes, num_outputs=len(lstm.outputs), name=f"{base}/{DYNAMIC_LSTM}")
        self.graph.insert_before(lstm, node)
        for old, new in zip(lstm.outputs, node.outputs):
            take_over(old, new)
        sources = [constant_source(v) for v in lstm.inputs[1:3]]
        self.graph.remove(lstm, safe=True)
        for source in sources:
            if source is not None:
                remove_if_unused(self.graph, source.nodes, [source.root])
        self.graph.opset_imports.setdefault(DYNAMIC_LSTM_DOMAIN, 1)
        entry = {"layer": lstm.name, "op": lstm.op_type, "node": node.name,
                 "kernel": f"{DYNAMIC_LSTM_DOMAIN}.{DYNAMIC_LSTM}", "quantizer": base, "bits": cfg.weight_bits,
                 "per_channel": point.per_channel,
                 "symmetric": point.symmetric, "channels": int(np.size(quantized["W"].scale)),
                 "dtype": quantized["W"].params.storage.dtype.name.lower()}
        if point.note:
            entry["note"] = point.note
            self.result.notes.append(f"LSTM '{lstm.name}': {point.note}")
        self.result.recurrent.append(entry)

    # --- HardSigmoid as an integer Add ----------------------------------------------------------
    def encode_gate(self, node: ir.Node) -> None:
        """``HardSigmoid(x) -> Q(s, 0)`` becomes ``Add(x, DQ(beta/alpha)) -> Q(s/alpha, 0)``: the uint8
        saturation of the Q is the clip, the DQ after it (scale ``s``) multiplies by alpha
        (``onnx_rewrite.hard_activations``)."""
        out = node.outputs[0]
        uses = list(out.uses())
        q = uses[0][0] if len(uses) == 1 else None
        scale = constant_array(q.inputs[1]) if q is not None and q.op_type == QUANTIZE else None
        if scale is None or out.is_graph_output():
            self.result.notes.append(f"HardSigmoid '{node.name}': left in float (its output is not read by "
                                     "its quantizer alone)")
            return
        alpha, beta = gate_parameters(node)
        shift, q_scale = gate_shift(alpha, beta), np.float32(scale.reshape(-1)[0]) / alpha
        base = self.names.prefix(f"{node.name or 'HardSigmoid'}/integer_quant", [DEQUANTIZE, "Add"],
                                 ["shift_quantized", "shift_scale", "shift_zero_point", "dequantized", "sum",
                                  "scale"])
        dq = dequantize_node(self.initializer(f"{base}/shift_quantized", np.array(1, np.uint8)),
                             self.initializer(f"{base}/shift_scale", np.array(shift)),
                             self.initializer(f"{base}/shift_zero_point", np.array(0, np.uint8)), base, None, ())
        add = ir.node("Add", [node.inputs[0], dq.outputs[0]], name=f"{base}/Add")
        add.outputs[0].name = f"{base}/sum"
        self.graph.insert_before(node, [dq, add])
        q.replace_input_with(0, add.outputs[0])
        q.replace_input_with(1, self.initializer(f"{base}/scale", np.array(q_scale, np.float32)))
        self.graph.remove(node, safe=True)
        self.result.integer_gates.append({"node": node.name, "alpha": float(alpha), "beta": float(beta),
                                          "shift": float(shift), "quantizer": q.name, "scale": float(q_scale)})

    def encode_scalar_operand(self, node: ir.Node, index: int) -> None:
        """The scalar constant of an Add/Mul whose other operand is quantized, read through its own
        DequantizeLinear: one code, ``+-1`` from the zero point, with the constant's magnitude as scale,
        so it dequantizes to the constant exactly (the float and the training graph's value) and
        onnxruntime runs QLinearAdd/QLinearMul (placement.integer)."""
        constant = node.inputs[index]
        c = constant_array(constant).astype(np.float32)
        store = activation_storage(self.config)
        value = np.float32(c.reshape(-1)[0])
        zero = 0 if value >= 0 or store.grid[0] < 0 else 1  # a negative constant on an unsigned grid: zp 1, code 0
        code = zero + (0 if value == 0 else 1 if value > 0 else -1)
        scale = np.float32(abs(value)) if value != 0 else np.float32(1.0)
        base = self.names.prefix(f"{node.name or node.op_type}/constant_quant", [DEQUANTIZE],
                                 ["quantized", "scale", "zero_point", "dequantized"])
        dq = dequantize_node(self.initializer(f"{base}/quantized", np.full(c.shape, code, store.numpy_dtype()), store.dtype),
                             self.initializer(f"{base}/scale", np.array(scale, np.float32)),
                             self.initializer(f"{base}/zero_point", np.array(zero, store.numpy_dtype()), store.dtype),
                             base, None, c.shape)
        self.graph.insert_before(node, dq)
        node.replace_input_with(index, dq.outputs[0])
        source = constant_source(constant)
        if source is not None:
            remove_if_unused(self.graph, source.nodes, [source.root])
        self.result.scalar_operands.append({"node": node.name, "op": node.op_type, "constant": float(value),
                                            "quantizer": base})

    def pad_input_channels(self, layer: ir.Node) -> None:
        """A Conv with 3 input channels (an RGB stem) runs in onnxruntime's slow integer kernel
        (:data:`SYM_CONV_INPUT_ALIGN`): its input codes get zero-point channels (a uint8 ``Pad`` between
        the input's QuantizeLinear and a DequantizeLinear of its own) and its weight codes zero channels
        to match. Exact: the added channels dequantize to 0 and meet zero weights."""
        found = _conv_to_pad(layer, self.opset)
        if found is None:
            return
        x_dq, w_dq, codes = found
        extra = -codes.shape[1] % SYM_CONV_INPUT_ALIGN
        padded = pad_axis(codes, 1, extra)
        w_dq.inputs[0].const_value = _tensor(padded, w_dq.inputs[0].name)
        w_dq.outputs[0].shape = ir.Shape(padded.shape)
        pads = np.zeros(2 * codes.ndim, np.int64)
        pads[codes.ndim + 1] = extra  # the end of axis 1
        base = self.names.prefix(f"{layer.name or 'Conv'}/input_channels", ["Pad", DEQUANTIZE],
                                 ["pads", "padded", "dequantized"])
        pad = ir.node("Pad", [x_dq.inputs[0], self.initializer(f"{base}/pads", pads), x_dq.inputs[2]],
                      {"mode": "constant"}, name=f"{base}/Pad")
        pad.outputs[0].name = f"{base}/padded"
        pad.outputs[0].dtype = x_dq.inputs[0].dtype
        read_codes_through(self.graph, layer, 0, pad.outputs[0], x_dq, base)
        self.result.padded_inputs.append({"layer": layer.name, "input_channels": int(codes.shape[1]),
                                          "padded_to": int(padded.shape[1]), "pad": pad.name})

    def widen_output_channels(self, layer: ir.Node) -> None:
        """A group-1 integer Conv with a spatial kernel (3 x 3 and up) and fewer than 16 output channels, or a
        count that is not a multiple of 8 (an image-to-image net's last conv to 3 channels, a segmentation head
        to 1-3 classes) runs in onnxruntime's im2col + GEMM, not its fast kernel (:data:`SYM_CONV_MIN_OUTPUTS`):
        its weight and int32 bias codes get zero output channels up to 16 (or the next multiple of 8) and its
        output codes, after their QuantizeLinear, a ``Slice`` back to its own channels. Exact: the kept channels
        are computed and requantized as before. SRCNN's 5 x 5 conv 32 -> 3 at 768 x 768: 568 -> ~200 ms;
        micro-models (32 input channels, 384 x 384, 5 x 5): 3 outputs 46 ms, 16 outputs 16 ms. Not for 1 x 1
        convs (a GEMM either way: 1.76 against 1.67 ms at 256 x 256, no gain for a Slice)."""
        if layer.domain != "" or layer.op_type != "Conv" or group_of(layer) != 1 or self.opset < 10:
            return
        x_dq, w = _input_dq(layer), layer_weight(layer)
        w_dq = w.producer() if w is not None else None
        if x_dq is None or w_dq is None or w_dq.op_type != DEQUANTIZE or not eight_bit_kernel_types(x_dq, w):
            return
        codes = symmetric_int8_codes(w_dq)
        x_zero = constant_array(x_dq.inputs[2]) if len(x_dq.inputs) > 2 else None
        if codes is None or codes.ndim != 4 or codes.shape[2] * codes.shape[3] < 9 \
                or codes.shape[1] % SYM_CONV_INPUT_ALIGN or x_zero is None or x_zero.dtype != np.uint8:
            return  # (int8 activations: onnxruntime's x86 fusion left the widened conv in float)
        out = codes.shape[0]
        target = max(SYM_CONV_MIN_OUTPUTS, -(-out // SYM_CONV_OUTPUT_ALIGN) * SYM_CONV_OUTPUT_ALIGN)
        y = layer.outputs[0]
        uses = list(y.uses())
        if target == out or y.is_graph_output() or len(uses) != 1 or uses[0][1] != 0:
            return
        q = uses[0][0]
        if q.domain != "" or q.op_type != QUANTIZE or any(
                constant_array(v) is None or constant_array(v).size != 1 for v in q.inputs[1:3] if v is not None):
            return
        codes_out = q.outputs[0]
        if codes_out.is_graph_output() or not widen_outputs(layer, target - out):
            return
        shape = codes_out.shape
        y.shape = codes_out.shape = None
        base = self.names.prefix(f"{layer.name or 'Conv'}/output_channels", ["Slice"],
                                 ["starts", "ends", "axes", "sliced"])
        sliced = ir.node("Slice", [codes_out, self.initializer(f"{base}/starts", np.array([0], np.int64)),
                                   self.initializer(f"{base}/ends", np.array([out], np.int64)),
                                   self.initializer(f"{base}/axes", np.array([1], np.int64))], name=f"{base}/Slice")
        sliced.outputs[0].name = f"{base}/sliced"
        sliced.outputs[0].dtype = codes_out.dtype
        sliced.outputs[0].shape = shape
        for node, index in list(codes_out.uses()):
            if node is not sliced:
                node.replace_input_with(index, sliced.outputs[0])
        self.graph.insert_after(q, sliced)
        self.result.widened_outputs.append({"layer": layer.name, "output_channels": int(out),
                                            "widened_to": int(target), "slice": sliced.name})

    def space_to_depth_input(self, layer: ir.Node) -> None:
        """A stride-2 Conv with 1 or 2 input channels (a grayscale stem) reads its input codes through a
        ``SpaceToDepth`` (blocksize 2) and a DequantizeLinear of its own, as the equivalent stride-1 Conv
        (:func:`~qtool.onnx_rewrite.kernel_forms.space_to_depth_conv`): 4x the channels for onnxruntime's
        fast integer kernel. Exact: the same integer products are summed."""
        found = _conv_to_space_to_depth(layer, self.opset)
        shape = static_shape(self.graph, found[0].outputs[0]) if found is not None else None
        if shape is None or len(shape) != 4:
            return
        x_dq, w_dq, codes = found
        attrs = layer.attributes
        valid = attrs.get_string("auto_pad", "NOTSET") == "VALID"
        pads = [0] * 4 if valid else list(attrs.get_ints("pads", [0] * 4))
        form = space_to_depth_conv(codes, pads, shape[2:])
        if form is None:
            return
        new_codes, new_pads = form
        w_dq.inputs[0].const_value = _tensor(new_codes, w_dq.inputs[0].name)
        w_dq.outputs[0].shape = ir.Shape(new_codes.shape)
        for name, value in (("kernel_shape", list(new_codes.shape[2:])), ("strides", [1, 1]), ("pads", new_pads)):
            attrs[name] = ir.AttrInt64s(name, value)
        attrs.pop("auto_pad", None)
        base = self.names.prefix(f"{layer.name or 'Conv'}/space_to_depth", ["SpaceToDepth", DEQUANTIZE],
                                 ["blocks", "dequantized"])
        blocks = ir.node("SpaceToDepth", [x_dq.inputs[0]], {"blocksize": 2}, name=f"{base}/SpaceToDepth")
        blocks.outputs[0].name = f"{base}/blocks"
        blocks.outputs[0].dtype = x_dq.inputs[0].dtype
        read_codes_through(self.graph, layer, 0, blocks.outputs[0], x_dq, base)
        self.result.space_to_depth.append({"layer": layer.name, "input_channels": int(codes.shape[1]),
                                           "kernel": list(new_codes.shape[2:]), "pads": new_pads,
                                           "space_to_depth": blocks.name})

    # --- activations -------------------------------------------------------------------------
    def encode_activation(self, point: ActivationPoint, resolved: tuple[tuple[float, float], str]) -> None:
        cfg = self.config
        (lo, hi), source = resolved
        params = activation_params(lo, hi, bits=cfg.activation_bits, symmetric=cfg.symmetric,
                                   signed=cfg.int8_activations)
        store = params.storage
        base = self._qdq_prefix(point.name, store)
        shared = self.parameters.get(point.root().value.name) if point.source is not None else None
        if shared is not None:  # a carried quantizer reads its source's scale and zero point
            scale, zp = shared
        else:
            scale = self.initializer(f"{base}/scale", params.scale)
            zp = self.initializer(f"{base}/zero_point", params.zero_point, store.dtype)
            self.parameters[point.value.name] = (scale, zp)
        tensor_name = point.value.name
        self.insert_qdq(point.value, base, scale, zp, store)
        entry = {
            "tensor": tensor_name,
            "kind": point.kind,
            "rule": point.rule,
            "quantizer": base,
            "range_source": source,
            "range": [float(lo), float(hi)],
            "nudged_range": [float(params.nudged[0]), float(params.nudged[1])],
            "scale": float(params.scale),
            "zero_point": int(params.zero_point.astype(np.int64)),
            "dtype": store.dtype.name.lower(),
        }
        if params.degenerate:
            entry["note"] = "range [0, 0]: the tensor quantizes to 0"
        if point.source is not None:
            entry["same_as"] = point.root().value.name
            self.result.propagated.append({"tensor": tensor_name, "quantizer": base, "same_as": entry["same_as"],
                                           "through": point.producer.op_type if point.producer else None})
        self.result.activations.append(entry)

    def report_float_layers(self) -> None:
        """Layers whose weight is quantized but whose input is not: onnxruntime runs them in float."""
        for match in self.plan.layers:
            layer = match.layer
            x = layer.inputs[0] if layer.inputs else None
            if id(layer) not in self.weight_scales or x is None:
                continue
            producer = x.producer()
            if producer is None or producer.domain != "" or producer.op_type != DEQUANTIZE:
                self.result.left_in_float.append(LeftInFloat(
                    layer.name, layer.op_type, f"runs in float: its input '{x.name}' is not quantized"))
            elif layer.op_type == "ConvTranspose":
                # onnxruntime (1.32, CPU provider) fuses no DequantizeLinear -> ConvTranspose -> QuantizeLinear
                # group, per-tensor or per-channel, with or without bias: measured, benchmarks/zoo/FINDINGS.md
                self.result.left_in_float.append(LeftInFloat(
                    layer.name, layer.op_type, "runs in float: onnxruntime's CPU provider has no integer "
                    "ConvTranspose kernel (the int8 weight is dequantized at run time)"))
        for node in self.graph:  # attention as one op: its two products are layers qtool cannot reach
            if (node.domain, node.op_type) in FUSED_ATTENTION and self.config.out_of_scope(node) is None:
                self.result.left_in_float.append(LeftInFloat(node.name, node.op_type, FUSED_ATTENTION_REASON))

    def _weight_exists(self, layer: ir.Node) -> bool:
        w = layer.inputs[1] if len(layer.inputs) > 1 else None
        p = w.producer() if w is not None else None
        return p is not None and p.domain == "" and p.op_type == DEQUANTIZE

    def quantize_biases(self) -> None:
        rule = QuantizeBias(self)
        for match in self.plan.layers:
            layer = match.layer
            slot = bias_slot(layer, match.get("bias_add"))
            if id(layer) not in self.weight_scales or slot is None:
                continue  # no bias, or a layer whose weight qtool did not quantize
            reason = rule.check(layer, slot)
            if reason is not None:
                self.result.notes.append(f"layer '{layer.name}': bias left in float: {reason}")
                continue
            entry = rule.rewrite(layer, slot)
            if entry is not None:
                self.result.biases.append(entry)

    def run(self, ranges: dict[str, tuple[float, float]] | None) -> EvalEncoding:
        for point in self.plan.new_weights():
            self.encode_weight(point)
        resolved = self.plan.resolve(ranges)
        for point in self.plan.new_activations():
            self.encode_activation(point, resolved[point.value.name])
        for node in self.plan.integer_gates:  # after the activations: rewires the gate's QuantizeLinear
            self.encode_gate(node)
        for node, index in self.plan.scalar_operands:
            self.encode_scalar_operand(node, index)
        self.report_float_layers()
        self.quantize_biases()
        for match in self.plan.layers:
            self.pad_input_channels(match.layer)
        if self.config.activation_bits == 8:
            self.result.padded_depthwise = pad_depthwise_channels(self.graph)
            for match in self.plan.layers:  # after the depthwise widening, which reads the convs as they were
                self.widen_output_channels(match.layer)
            for match in self.plan.layers:
                self.space_to_depth_input(match.layer)
            # after the widening: a Tile would stop it at the squeeze-excite Mul
            self.result.tiled_gates = tile_gates(self.graph, self.names, self.initializer)
            self.result.depthwise_pools = pools_as_depthwise(self.graph, self.names, self.initializer)
            self.result.relus_on_grid = relus_on_their_grid(self.graph, self.names)
        self.result.prelu_sums = prelus_as_sums(self.graph, self.names, self.initializer, self.opset)
        self.result.residual_sums = residual_adds_as_sums(self.graph, self.names)
        if not self.config.standard_ops:  # com.microsoft.Gelu / FastGelu
            self.result.fused_gelus = gelus_fused(self.graph, self.names)
        # last of the layer rewrites: the steps above read the plan's MatMuls
        self.result.linear_gemms = linears_as_gemms(self.graph, self.names, self.initializer, self.opset)
        for point in self.plan.recurrent:  # last: the activation points hold the LSTM's output values
            self.encode_recurrent(point)
        self.keep_float_layers_float()
        return self.result

    def keep_float_layers_float(self) -> None:
        """A Conv, ConvTranspose or Gemm left in float (``--exclude``, out of scope, peak picking...) whose input
        comes from a per-tensor DequantizeLinear reads it through a per-channel one of its own (the same scale and
        zero point repeated over the input channels: the same values). onnxruntime's WeightBiasQuantization
        (``weight_bias_quantization.cc``) otherwise quantizes such a layer's float weight itself, per tensor, when
        its input is a per-tensor DequantizeLinear and its output goes to a QuantizeLinear, and runs it as
        QLinearConv / QGemm: the layer the summary lists in float (and that ``--exclude`` asked to keep float)
        ran on int8 weights of one scale. A per-channel input DequantizeLinear is what that rule does not take.
        Not with ``standard_ops`` (a workaround for onnxruntime; other runtimes, TensorRT's among them, may take
        per-channel DequantizeLinear for weights only)."""
        if self.opset < 13 or self.config.standard_ops:
            return
        for node in list(self.graph):
            if node.domain not in ("", "ai.onnx") or node.op_type not in ("Conv", "ConvTranspose", "Gemm") \
                    or len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
                continue
            w = constant_array(node.inputs[1])
            dq = node.inputs[0].producer()
            if w is None or w.dtype != np.float32 or dq is None or dq.domain != "" or dq.op_type != DEQUANTIZE \
                    or len(dq.inputs) < 2:
                continue
            scale = constant_array(dq.inputs[1])
            zero = constant_array(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
            if scale is None or scale.size != 1 or (zero is not None and zero.size != 1):
                continue
            if node.op_type == "Gemm":
                axis = 0 if node.attributes.get_int("transA", 0) else 1
                channels = w.shape[1] if node.attributes.get_int("transB", 0) else w.shape[0]
            else:
                axis = 1
                channels = w.shape[0] if node.op_type == "ConvTranspose" else w.shape[1] * group_of(node)
            base = self.names.prefix(f"{node.name or node.op_type}/float_input", [DEQUANTIZE],
                                     ["scale", "zero_point", "dequantized"])
            own = dequantize_node(
                dq.inputs[0], self.initializer(f"{base}/scale", np.full(channels, scale.reshape(()), scale.dtype)),
                None if zero is None else self.initializer(f"{base}/zero_point",
                                                           np.full(channels, zero.reshape(()), zero.dtype)),
                base, axis, None)
            self.graph.insert_before(node, own)
            node.replace_input_with(0, own.outputs[0])
            self.result.float_inputs_per_channel.append(node.name)


# attention written as one op (ONNX's Attention, opset 23: what torch's exporter writes for
# scaled_dot_product_attention at opset_version=23; onnxruntime's contrib ops in a model its transformer optimizer
# fused): Q.K^T and P.V are inside it, and onnxruntime 1.32 runs it in float
FUSED_ATTENTION = {("", "Attention"), ("com.microsoft", "Attention"), ("com.microsoft", "MultiHeadAttention")}
FUSED_ATTENTION_REASON = ("runs in float: onnxruntime has no integer kernel for attention as one op, so its "
                          "Q.K^T and P.V products stay float (exported below opset 23, they are MatMuls qtool "
                          "quantizes)")


def _input_dq(layer: ir.Node) -> ir.Node | None:
    """The DequantizeLinear a layer's activation input comes from (None if not quantized)."""
    x = layer_input(layer)
    xp = x.producer() if x is not None else None
    return xp if xp is not None and xp.domain == "" and xp.op_type == DEQUANTIZE else None


# onnxruntime's fast QLinearConv kernels (MLAS "symmetric" indirect convolution, ``MlasConvSymPackWSize``:
# 1.32, x86-64 and ARM64) take a group-1 Conv only with int8 weights of zero point 0, input channels a
# multiple of 4 and at least 16 output channels, a multiple of 8; otherwise im2col + a GEMM (K = 27 for an
# RGB stem: 2.3x slower, benchmarks/zoo/FINDINGS.md section 10). Padded only where that adds at most a third
# of the input (3 -> 4 channels): the OCR recognizer's 1-channel stem padded to 4 made the model slower.
SYM_CONV_INPUT_ALIGN = 4
SYM_CONV_MIN_OUTPUTS = 16
SYM_CONV_OUTPUT_ALIGN = 8


def _fast_kernel_conv(layer: ir.Node, opset: int) -> tuple[ir.Node, ir.Node, np.ndarray] | None:
    """``(input DQ, weight DQ, weight codes)`` of a group-1 integer Conv that onnxruntime's fast kernel would
    take but for its input channels (int8 weights of zero point 0, output channels), else None."""
    if layer.domain != "" or layer.op_type != "Conv" or group_of(layer) != 1 or opset < 11:
        return None
    x_dq, w = _input_dq(layer), layer_weight(layer)
    w_dq = w.producer() if w is not None else None
    if x_dq is None or w_dq is None or w_dq.op_type != DEQUANTIZE or not eight_bit_kernel_types(x_dq, w):
        return None
    codes = symmetric_int8_codes(w_dq)
    x_zero = constant_array(x_dq.inputs[2]) if len(x_dq.inputs) > 2 else None
    if codes is None or codes.ndim < 3 or x_zero is None:
        return None
    if codes.shape[0] < SYM_CONV_MIN_OUTPUTS or codes.shape[0] % SYM_CONV_OUTPUT_ALIGN or len(w.uses()) != 1 \
            or len(w_dq.inputs[0].uses()) != 1:
        return None
    return x_dq, w_dq, codes


def _conv_to_pad(layer: ir.Node, opset: int) -> tuple[ir.Node, ir.Node, np.ndarray] | None:
    """:func:`_fast_kernel_conv` of a Conv whose input channels onnxruntime's fast integer kernel would take
    once padded to a multiple of 4, else None."""
    found = _fast_kernel_conv(layer, opset)
    extra = -found[2].shape[1] % SYM_CONV_INPUT_ALIGN if found is not None else 0
    if not extra or 3 * extra > found[2].shape[1] or _channels_last_input(found[0].inputs[0]):
        return None
    return found


# ops between a channels-last input's Transpose and the stem that onnxruntime's transpose optimizer moves the
# Transpose through (Q/DQ, elementwise arithmetic)
_LAYOUT_TRANSPARENT = (QUANTIZE, DEQUANTIZE, "Add", "Sub", "Mul", "Div", "Relu", "Clip")


def _channels_last_input(codes: ir.Value) -> bool:
    """Whether a Conv's input codes come from a ``Transpose`` (an NHWC input carried into NCHW: tf2onnx, Keras)
    through Q/DQ and elementwise ops only. onnxruntime's transpose optimizer then moves that Transpose down and
    cancels it against the NHWC integer Conv's, so a channel ``Pad`` runs on the innermost axis, one element per
    pixel: OpenVINO's OSNet-AIN through tf2onnx (256 x 128, 7 x 7 stem) spent 0.70 ms in it against 1.3 ms for
    the conv, which was no faster padded; a 3 x 3 stride-2 RGB stem at 224 x 224 behind such a Transpose took
    0.97 ms padded against 0.62 ms as it was (0.45 ms padded from an NCHW input). FINDINGS.md section 24."""
    value = codes
    for _ in range(16):
        producer = value.producer() if value is not None else None
        if producer is None or producer.domain != "":
            return False
        if producer.op_type == "Transpose":
            return True
        if producer.op_type not in _LAYOUT_TRANSPARENT:
            return False
        value = next((v for v in producer.inputs if v is not None and v.const_value is None
                      and (v.producer() is None or v.producer().op_type != "Constant")), None)
    return False


def _conv_to_space_to_depth(layer: ir.Node, opset: int) -> tuple[ir.Node, ir.Node, np.ndarray] | None:
    """:func:`_fast_kernel_conv` of a 2-d stride-2 Conv with 1 or 2 input channels (not padded: 1 -> 4
    channels made the OCR recognizer slower), else None."""
    found = _fast_kernel_conv(layer, opset)
    attrs = layer.attributes
    if found is None or found[2].ndim != 4 or found[2].shape[1] not in SPACE_TO_DEPTH_CHANNELS \
            or list(attrs.get_ints("strides", [1, 1])) != [2, 2] \
            or any(d != 1 for d in attrs.get_ints("dilations", [1])) \
            or attrs.get_string("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    return found


def bias_slot(layer: ir.Node, bias_add: ir.Node | None = None) -> tuple[ir.Node, int] | None:
    """Where a layer's bias is read: ``(node, input index)``. Conv/ConvTranspose/Gemm: their own bias
    input; MatMul: the constant operand of its bias ``Add`` (the plan's ``bias_add`` step), which
    onnxruntime's basic optimizations fuse into a Gemm whose float bias they quantize to int32 at
    ``input_scale * weight_scale`` themselves (so it is rounded in the default session, not without
    optimizations, unless the eval graph stores it as int32), or that the eval graph writes as a Gemm itself
    (``linear_gemms``: an input with symbolic dims). None: no bias, or a MatMul that stays one (its float bias
    Add is exact there, and an int32 one costs a node per layer)."""
    if layer.op_type == "MatMul":
        if bias_add is None or len(bias_add.inputs) != 2 or not (becomes_gemm(layer) or reshapes_to_gemm(layer)):
            return None
        for i, v in enumerate(bias_add.inputs):
            if v is not None and v is not layer.outputs[0] and constant_array(v) is not None:
                return bias_add, i
        return None
    bias = layer_bias(layer)
    return None if bias is None else (layer, 2)


class QuantizeBias:
    """Rule: the bias of a Conv/ConvTranspose/Gemm whose input and weight are quantized becomes
    int32 with scale ``input_scale * weight_scale`` (per output channel) and zero point 0, TFLite's
    encoding, which onnxruntime needs to fuse QLinearConv/QGemm. ``check`` says why a bias stays
    float (the report shows it); ``rewrite`` inserts the int32 initializer and its DequantizeLinear."""

    def __init__(self, encoder: EvalEncoder):
        self.encoder = encoder

    def check(self, layer: ir.Node, slot: tuple[ir.Node, int]) -> str | None:
        b = constant_array(slot[0].inputs[slot[1]])
        if b is None or b.dtype != np.float32:
            return "it is not a float32 constant"
        if layer.op_type == "MatMul" and (b.ndim < 1 or any(d != 1 for d in b.shape[:-1])):
            return "the bias Add's constant is not one value per output (shape [..., 1, N])"
        xp = _input_dq(layer)
        if xp is None:
            return "the layer's input is not quantized"
        x_scale = constant_array(xp.inputs[1])
        if x_scale is None or x_scale.size != 1:
            return "the input quantizer has no single constant scale"
        if layer.op_type == "Gemm" and (float_attr(layer, "beta", 1.0) != 1.0 or b.ndim != 1):
            return "Gemm with beta != 1 or a bias that is not one value per output"
        if self.scale(layer, b.size) is None:
            return "its size does not match the weight's channels"
        if self.encoder.opset < 13 and not np.all(self.scale(layer, b.size) == self.scale(layer, b.size)[0]):
            return "per-channel bias scales need opset 13"
        b_scale = self.scale(layer, b.size)
        if np.any(b_scale == 0) or not np.all(np.isfinite(b_scale)):
            return "the bias scale input_scale * weight_scale is 0 or not finite"
        return None

    def scale(self, layer: ir.Node, channels: int) -> np.ndarray | None:
        """``input_scale * weight_scale`` per output channel (float32), or None if the sizes do not fit."""
        w_scale, _ = self.encoder.weight_scales[id(layer)]
        per_out = per_output_channel(layer, np.asarray(w_scale, dtype=np.float32), channels)
        if per_out is None:
            return None
        x_scale = constant_array(_input_dq(layer).inputs[1])
        return (np.float32(x_scale.reshape(-1)[0]) * per_out).astype(np.float32)

    def rewrite(self, layer: ir.Node, slot: tuple[ir.Node, int]) -> dict | None:
        enc = self.encoder
        reader, index = slot
        bias = reader.inputs[index]
        b = constant_array(bias)
        if enc.trained and layer.name in enc.widen_for_bias:
            self._widen_as_trained(layer, b)
        b_scale = self.scale(layer, b.size)
        q, b_scale, factor, saturated = self._integers(layer, b, b_scale)
        if q is None:
            return None
        channels = b.size
        base = enc.names.prefix(f"{context_of(layer.name or layer.op_type)}/bias_quant", ["DequantizeLinear"],
                                ["quantized", "scale", "zero_point", "dequantized"])
        per_tensor = enc.opset < 13
        scale_arr = b_scale[:1].reshape(()) if per_tensor else b_scale
        zp_arr = np.zeros((), np.int32) if per_tensor else np.zeros(channels, np.int32)
        q_init = enc.initializer(f"{base}/quantized", q.reshape(b.shape))
        dq = dequantize_node(q_init, enc.initializer(f"{base}/scale", scale_arr),
                             enc.initializer(f"{base}/zero_point", zp_arr), base,
                             None if per_tensor else max(b.ndim - 1, 0), b.shape)
        enc.graph.insert_before(layer, dq)
        source = constant_source(bias)
        reader.replace_input_with(index, dq.outputs[0])
        if source is not None:
            remove_if_unused(enc.graph, source.nodes, [source.root])
        err = float(np.max(np.abs(q.astype(np.float64) * b_scale - b.reshape(-1)))) if b.size else 0.0
        entry = {"layer": layer.name, "quantizer": base, "max_abs_error": err}
        if factor != 1:
            entry["scale_factor"] = factor  # scale = factor * input_scale * weight_scale
        if saturated:
            entry["saturated"] = saturated
        return entry

    def _widen_as_trained(self, layer: ir.Node, b: np.ndarray) -> None:
        """A training graph that widens this layer's weight range for its bias (``TrainEncoder._widen_for_bias``,
        contract ``widen_weight``): the same range in the same float32 operations (``codec.bias_fit_range``), from
        the trained input scale, and the float weight quantized on it afresh, so the deployed weight, weight
        scale and bias are the ones the graph trained with."""
        enc = self.encoder
        trained = enc.trained_weights.get(id(layer))
        if trained is None or trained.lo.size != b.size:
            return
        x_scale = constant_array(_input_dq(layer).inputs[1]).reshape(-1)[0]
        lo, hi = bias_fit_range(trained.lo, trained.hi, b, x_scale, enc.config.weight_bits)
        grown = (lo != trained.lo) | (hi != trained.hi)
        if not np.any(grown):
            return
        cfg = enc.config
        stored, params = weight_params_in_range(trained.weight, lo, hi, bits=cfg.weight_bits, axis=trained.axis,
                                                int4=cfg.pack_int4, round_mode=cfg.round_mode)
        codes, scale, zero = trained.dq.inputs[:3]
        codes.const_value = _tensor(stored, codes.name, params.storage.dtype)
        scale.const_value = _tensor(params.scale, scale.name)
        zero.const_value = _tensor(params.zero_point, zero.name, params.storage.dtype)
        trained.lo, trained.hi = lo, hi  # a second layer reading this weight widens from here, as the graph does
        trained.scale[...] = params.scale  # every layer reading this weight sees the new scales
        enc.result.notes.append(
            f"layer '{layer.name}': the weight range of {int(np.count_nonzero(grown))} channel(s) widened so that "
            "their bias fits int32 at input_scale * weight_scale, as the training graph widens it")

    def _widen_weight_scales(self, layer: ir.Node, b: np.ndarray, over: np.ndarray) -> int | None:
        """A channel whose bias does not fit int32 at ``input_scale * weight_scale`` has tiny weights beside its
        bias (a batch norm's dead channel folded in: SINet's first Conv, gamma -5e-5 and variance 3e-11; its bias
        0.26 saturated to 1e-4). Its weight scale becomes ``|b| / (input_scale * (2**31 - 1))`` (with a margin
        of one part in 2**20) and its codes are re-encoded on it (they round to 0 or a few steps); the other
        channels are untouched. Only for qtool's own symmetric per-channel weight, one scale per bias value, and
        not for a qtool training graph (its ``qtool::FakeQuantBias`` saturates: train == eval); returns how many
        channels were widened, or None."""
        w_scale, axis = self.encoder.weight_scales[id(layer)]
        dq = layer_weight(layer).producer() if layer_weight(layer) is not None else None
        if axis is None or dq is None or np.size(w_scale) != b.size or len(dq.inputs) < 3:
            return None
        codes, scale, zero = (constant_array(v) for v in dq.inputs[:3])
        if codes is None or scale is None or zero is None or np.any(zero != 0) or scale.shape != w_scale.shape:
            return None
        x_scale = np.float64(constant_array(_input_dq(layer).inputs[1]).reshape(-1)[0])
        if not (np.isfinite(x_scale) and x_scale > 0):  # (a degenerate input range: saturate)
            return None
        need = (np.abs(b.astype(np.float64)) / (x_scale * _INT32.max) * (1 + 2.0**-20)).astype(np.float32)
        grow = over & (need > scale) & np.isfinite(need)
        if not np.any(grow):
            return None
        new_scale = np.where(grow, need, scale).astype(np.float32)
        shape = [1] * codes.ndim
        shape[axis] = -1
        ratio = (scale.astype(np.float64) / new_scale).reshape(shape)
        limit = np.iinfo(codes.dtype).max
        new_codes = np.clip(np.rint(codes * ratio), -limit, limit).astype(codes.dtype)
        dq.inputs[0].const_value = ir.tensor(new_codes, name=dq.inputs[0].name)
        dq.inputs[1].const_value = ir.tensor(new_scale, name=dq.inputs[1].name)
        w_scale[...] = new_scale  # every layer reading this weight sees the new scales
        return int(np.count_nonzero(grow))

    def _integers(self, layer: ir.Node, b: np.ndarray, b_scale: np.ndarray):
        """``(int32 values, scale, scale factor, saturated count)``; values None: bias left float."""
        # float32 division, rounded half to even: exactly what a training graph's qtool::FakeQuantBias
        # computes (Div, Round), so a trained bias deploys bit for bit
        with np.errstate(over="ignore"):
            q = np.rint(b.astype(np.float32).reshape(-1) / b_scale.astype(np.float32)).astype(np.float64)
        if not np.any(np.abs(q) > _INT32.max):
            return q.astype(np.int32), b_scale, 1, 0
        # The bias does not fit int32 at input_scale * weight_scale (16-bit grids make that scale
        # ~1e-9). A float bias is no way out: onnxruntime's WeightBiasQuantization (ORT_ENABLE_BASIC
        # and up, so the default session) quantizes the float bias of a QDQ Conv/ConvTranspose/Gemm
        # to int32 at that scale itself, with an unchecked float->int32 Cast: out-of-range channels
        # become INT32_MIN (-2**31, sign flipped). On the sample at W16A16 that took accuracy from
        # 99.6% (ORT_DISABLE_ALL) to 84% (default).
        if eight_bit_kernel_types(_input_dq(layer), layer_weight(layer)):
            # onnxruntime may fuse the layer into QLinearConv/QGemm, which reads the int32 bias at
            # input_scale * weight_scale whatever the DQ's scale: widen the weight scale of the channels
            # that need it (TFLite's AdjustWeightsForBiasScale), else saturate, as TFLite.
            widened = None if self.encoder.trained else self._widen_weight_scales(layer, b.reshape(-1),
                                                                                  np.abs(q) > _INT32.max)
            if widened is not None:
                b_scale = self.scale(layer, b.size)
                q = np.rint(b.astype(np.float32).reshape(-1) / b_scale).astype(np.float64)
                self.encoder.result.notes.append(
                    f"layer '{layer.name}': the weight scale of {widened} channel(s) widened so that their bias "
                    "fits int32 at input_scale * weight_scale (a channel of tiny weights and a large bias)")
            saturated = int(np.count_nonzero(np.abs(q) > _INT32.max))
            if not saturated:
                return q.astype(np.int32), b_scale, 1, 0
            self.encoder.result.notes.append(
                f"layer '{layer.name}': {saturated} bias value(s) saturated to the int32 range "
                "(the bias scale input_scale * weight_scale is too small for them)")
            return np.clip(q, -_INT32.max, _INT32.max).astype(np.int32), b_scale, 1, saturated
        # No integer kernel for these types: onnxruntime runs DQ -> float layer, so the bias DQ may
        # have a coarser scale, a power-of-two multiple of the usual one. Per channel where the bias DQ
        # is per channel (opset 13): one factor for all would take the overflowing channel's (a channel
        # of near-zero weights, scale ~1e-21, beside a bias of 1: 2**49) to every channel and round
        # the others' biases to 0 (smp's PAN at W16A16: its squeeze-excite biases lost, SQNR 3 dB).
        b64 = b.astype(np.float64).reshape(-1)
        q = np.rint(b64 / b_scale.astype(np.float64))
        with np.errstate(divide="ignore"):
            need = np.ceil(np.log2(np.abs(q) / _INT32.max))
        if self.encoder.opset >= 13:
            k = np.where(np.abs(q) > _INT32.max, np.maximum(need, 0), 0).astype(np.int64)
        else:  # one bias scale for the tensor
            k = np.full(q.shape, int(np.max(need)), np.int64)
        while True:
            scaled = (b_scale * np.exp2(k).astype(np.float32)).astype(np.float32)
            q = np.rint(b64 / scaled.astype(np.float64))
            over = np.abs(q) > _INT32.max
            if not np.any(over):
                break
            k = k + (over if self.encoder.opset >= 13 else 1)
        if not np.all(np.isfinite(scaled)):
            self.encoder.result.notes.append(f"layer '{layer.name}': bias left in float (out of int32 range)")
            return None, b_scale, 1, 0
        return q.astype(np.int32), scaled, 2 ** int(np.max(k)), 0


def encode_eval_graph(graph: ir.Graph, plan: QuantPlan, names: NameScope, *, opset: int,
                      ranges: dict[str, tuple[float, float]] | None, trained: bool = False,
                      widen_for_bias: frozenset[str] = frozenset()) -> EvalEncoding:
    """Write ``plan`` into ``graph`` as Q/DQ (in place). ``trained``: the graph was a qtool training graph,
    whose weights and biases deploy as they were trained: a weight range is widened for a bias only where the
    training graph widens it (the layers ``widen_for_bias`` names), in its arithmetic."""
    return EvalEncoder(graph, plan, names, opset, trained, widen_for_bias).run(ranges)
