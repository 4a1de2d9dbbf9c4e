"""The Quantizer codec: the one place that reads and writes quantization encodings.

- **ranges -> parameters** (spec sections 4 and 6, on qtool's kernels):
  ``widen``, ``qparams``, ``weight_params``, ``activation_params``; a weight range widened for
  its int32 bias as a training graph widens it (``bias_fit_range``, ``weight_params_in_range``);
- **containers**: :class:`Storage` (type, shift, grid, clip) for a bit width;
- **writing**: ``qdq_nodes`` (``QuantizeLinear -> [Clip] -> DequantizeLinear``),
  ``dequantize_node`` (stored weights and int32 biases);
- **reading**: the Q/DQ op names and the ops a quantizer may sit behind or
  contain (``GraphView`` uses them to see through quantizers), ``dq_params``,
  ``storage_of`` (an existing quantizer's container), ``dq_input_type``.

The rules below hold for every encoding:

- Ranges contain 0 (TF widens them so that 0 is exactly representable), or
  are made symmetric with TF's formula (section 4).
- ``nudged_range`` maps a range to TF's scale and zero point on the unsigned
  grid ``[quant_min, 2**bits - 1]``; qtool stores that grid shifted by
  ``2**(bits-1)`` when the container is signed (int8 weights: ``q - 128``,
  zero point ``zp - 128``), unshifted for unsigned activations.
- Containers: 8 bits -> int8/uint8; 16 -> int16/uint16; other widths -> the
  8- or 16-bit container with a Clip on the integer values (activations;
  stored weights are in range by construction). 4-bit weights are int4
  (opset 21) only when asked (``QuantConfig.pack_int4``): onnxruntime 1.32
  has no integer kernel for int4 weights, dequantizes them at every run and
  runs the layer in float (the zoo's BERT 1.97x and MobileNetV3 2.71x float
  latency, against 0.48x / 0.72x with the same codes in int8). 4-bit activations are not stored as
  (u)int4 because onnxruntime 1.31's QDQ fusion (QDQSelectorActionTransformer,
  ORT_ENABLE_EXTENDED and up) turns a Conv with (u)int4 activations and 8-bit
  weights into a QLinearConv, which has no 4-bit kernel: the session fails with
  "Type 'tensor(uint4)' of input parameter ... of operator (QLinearConv) ... is
  invalid" (its Conv selector rejects 4-bit weights, not 4-bit activations).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from qtool.kernels import minmax, nudged_range, quantize_codes
from qtool.model.constants import constant_array


QUANTIZE = "QuantizeLinear"
DEQUANTIZE = "DequantizeLinear"
# Ops a quantizer may sit behind (TF's _FollowedByFakeQuant looks through these).
QUANTIZER_LOOK_THROUGH = ("Identity", "Reshape")
# Ops between Q and DQ in qtool's own encoding of odd bit widths.
QDQ_INNER = ("Clip", "Cast")


def is_onnx(node: ir.Node, *op_types: str) -> bool:
    return node.domain == "" and node.op_type in op_types


@dataclass(frozen=True)
class Storage:
    dtype: ir.DataType  # container type of the integer values
    shift: int  # stored = unsigned grid value - shift
    bits: int
    narrow: bool

    @property
    def opset(self) -> int:
        """The lowest opset whose QuantizeLinear/DequantizeLinear take this type."""
        if self.dtype in (ir.DataType.INT8, ir.DataType.UINT8):
            return 10
        return 21

    @property
    def grid(self) -> tuple[int, int]:
        """Stored integer bounds of the TF grid."""
        lo = (1 if self.narrow else 0) - self.shift
        hi = (2**self.bits - 1) - self.shift
        return lo, hi

    @property
    def needs_clip(self) -> bool:
        """True when the container holds more values than the grid (odd widths)."""
        return self.grid != CONTAINER_RANGE[self.dtype]

    def numpy_dtype(self) -> np.dtype:
        return self.dtype.numpy()


CONTAINER_RANGE = {
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT16: (-32768, 32767),
    ir.DataType.UINT16: (0, 65535),
    ir.DataType.INT4: (-8, 7),
    ir.DataType.UINT4: (0, 15),
}


def storage(bits: int, *, signed: bool, narrow: bool, int4: bool = False) -> Storage:
    """The container of a ``bits``-bit grid; 4 bits in 8 unless ``int4`` (packed 4-bit weights)."""
    if bits == 4 and int4:
        dtype = ir.DataType.INT4 if signed else ir.DataType.UINT4
    elif bits <= 8:
        dtype = ir.DataType.INT8 if signed else ir.DataType.UINT8
    else:
        dtype = ir.DataType.INT16 if signed else ir.DataType.UINT16
    shift = 2 ** (bits - 1) if signed else 0
    return Storage(dtype, shift, bits, narrow)


def symmetric_ratio(bits: int, narrow: bool) -> np.float32:
    if narrow:
        return np.float32(-1.0)
    return np.float32(-((2**bits) - 2) / 2**bits)


def widen(lo, hi, *, bits: int, narrow: bool, symmetric: bool):
    """TF's range adjustment: contain 0, or symmetric (spec section 4). float32 math."""
    lo = np.asarray(lo, dtype=np.float32)
    hi = np.asarray(hi, dtype=np.float32)
    if symmetric:
        r = symmetric_ratio(bits, narrow)
        new_lo = np.minimum(lo, hi / r)
        new_hi = np.maximum(hi, lo * r)
        return new_lo.astype(np.float32), new_hi.astype(np.float32)
    return np.minimum(lo, np.float32(0)).astype(np.float32), np.maximum(hi, np.float32(0)).astype(np.float32)


@dataclass
class QParams:
    """What a Q/DQ pair stores: scale (float32) and zero point (container type)."""

    scale: np.ndarray
    zero_point: np.ndarray  # stored values (shifted)
    storage: Storage
    range: tuple[np.ndarray, np.ndarray]  # the range given to nudging (after widening)
    nudged: tuple[np.ndarray, np.ndarray]
    degenerate: int = 0  # channels whose range was [0, 0] (scale set to 1: all values 0)


def qparams(lo, hi, *, bits: int, narrow: bool, signed: bool, int4: bool = False) -> QParams:
    """Scale and zero point of TF's nudged range ``[lo, hi]`` (already widened)."""
    store = storage(bits, signed=signed, narrow=narrow, int4=int4)
    nmin, nmax, scale, zp = nudged_range(lo, hi, num_bits=bits, narrow_range=narrow)
    scale = np.asarray(scale, dtype=np.float32)
    zero = scale == 0
    degenerate = int(np.count_nonzero(zero))
    stored_zp = np.asarray(zp, dtype=np.int64) - store.shift
    if degenerate:
        # min == max == 0: TF outputs zeros. Every code equals the zero point, so any scale and
        # zero point give 0: scale 1.0 keeps QuantizeLinear well defined, and a stored zero
        # point of 0 keeps a symmetric weight grid symmetric (onnxruntime's QLinearConv takes a
        # generic path, 50x slower on a depthwise convolution, when one channel's zero point
        # differs from the others').
        scale = np.where(zero, np.float32(1.0), scale).astype(np.float32)
        stored_zp = np.where(zero, 0, stored_zp)
    stored_zp = stored_zp.astype(store.numpy_dtype())
    return QParams(scale, stored_zp, store, (np.asarray(lo), np.asarray(hi)), (nmin, nmax), degenerate)


def weight_params(w: np.ndarray, *, bits: int, symmetric: bool, axis: int | None, int4: bool = False,
                  round_mode: str = "half_up"):
    """Range, codes and parameters of a weight tensor (last-value range, narrow grid), rounded as
    ``round_mode`` (``QuantConfig.round_mode``) asks: the training graph's weight FakeQuant bit for bit.

    Returns ``(stored_values, QParams)`` where ``stored_values`` are the kernel's
    codes shifted into the signed container (4 bits in int8; packed int4 with ``int4``).
    """
    lo, hi = weight_range(w, bits=bits, symmetric=symmetric, axis=axis)
    return weight_params_in_range(w, lo, hi, bits=bits, axis=axis, int4=int4, round_mode=round_mode)


def weight_range(w: np.ndarray, *, bits: int, symmetric: bool, axis: int | None):
    """A weight's last-value range (per channel of ``axis``, or of the tensor), widened to contain 0 or symmetric
    on the narrow grid: what :func:`weight_params` quantizes on."""
    lo, hi = minmax(w) if axis is None else minmax(w, axis=axis)
    return widen(lo, hi, bits=bits, narrow=True, symmetric=symmetric)


# TFLite's AdjustWeightsForBiasScale as a training graph computes it: the weight's half range is at least
# (|b| / input_scale) * bias_fit_factor(bits), so that the bias code |b| / (input_scale * weight_scale) stays below
# 2**31 - 1 by one part in 2**16 (room for the few float32 roundings of the graph's arithmetic)
BIAS_FIT_MARGIN = 1 + 2.0**-16


def bias_fit_factor(bits: int) -> np.float32:
    """``k = float32((2**(bits-1) - 1) * (1 + 2**-16) / (2**31 - 1))``: a symmetric narrow weight range of half range
    ``(|b| / input_scale) * k`` has the scale ``|b| / (input_scale * (2**31 - 1))`` (and a little more)."""
    return np.float32((2 ** (bits - 1) - 1) * BIAS_FIT_MARGIN / (2**31 - 1))


def bias_fit_range(lo: np.ndarray, hi: np.ndarray, b: np.ndarray, input_scale, bits: int):
    """A weight's per-channel range ``[lo, hi]`` widened so that the bias ``b`` (one value per channel) fits
    int32 at ``input_scale * weight_scale``: ``[min(lo, -m), max(hi, m)]`` with ``m = float32(|b| / input_scale)
    * k`` (:func:`bias_fit_factor`), in the float32 operations of the training graph (``Abs``, ``Div``, ``Mul``,
    ``Neg``, ``Min``, ``Max``). Returns ``(lo, hi)`` in the shapes of ``lo`` and ``hi``."""
    lo = np.asarray(lo, np.float32)
    hi = np.asarray(hi, np.float32)
    code = (np.abs(np.asarray(b, np.float32).reshape(-1)) / np.float32(input_scale)).astype(np.float32)
    half = (code * bias_fit_factor(bits)).astype(np.float32).reshape(lo.shape)
    return np.minimum(lo, -half).astype(np.float32), np.maximum(hi, half).astype(np.float32)


def weight_params_in_range(w: np.ndarray, lo, hi, *, bits: int, axis: int | None, int4: bool = False,
                           round_mode: str = "half_up"):
    """:func:`weight_params` on a given (already widened) range ``[lo, hi]`` (one value per channel of
    ``axis``, or scalars): a training graph's weight range widened for its bias (``eval_graph.QuantizeBias``)."""
    codes = quantize_codes(w, lo, hi, num_bits=bits, narrow_range=True, axis=axis, round_mode=round_mode.upper())
    params = qparams(lo, hi, bits=bits, narrow=True, signed=True, int4=int4)
    stored = (codes - params.storage.shift).astype(params.storage.numpy_dtype())
    if params.degenerate:  # all-zero channels: their codes are their stored zero point, 0 (see qparams)
        zero = np.asarray(params.nudged[0] == params.nudged[1])
        if axis is not None:
            zero = np.expand_dims(zero, tuple(d for d in range(w.ndim) if d != axis % w.ndim))
        stored = np.where(zero, 0, stored).astype(params.storage.numpy_dtype())
    return stored, params


@dataclass
class DynamicLstmWeight:
    """An LSTM weight as ``com.microsoft.DynamicQuantizeLSTM`` reads it."""

    stored: np.ndarray  # int8 [num_directions, input_or_hidden_size, 4*hidden_size] (ONNX's W/R transposed)
    scale: np.ndarray  # float32 [num_directions, 4*hidden_size] per channel, [num_directions] per tensor
    zero_point: np.ndarray  # int8, the shape of ``scale``
    params: QParams

    def dequantized(self) -> np.ndarray:
        """The values the kernel multiplies by, in ONNX's LSTM layout ``[num_directions, 4*hidden, K]``."""
        q = self.stored.astype(np.float32)
        zp, s = self.zero_point.astype(np.float32), self.scale
        zp, s = (zp[:, None, :], s[:, None, :]) if s.ndim == 2 else (zp[:, None, None], s[:, None, None])
        return np.ascontiguousarray(np.transpose((q - zp) * s, (0, 2, 1)))


def dynamic_lstm_weight(w: np.ndarray, *, bits: int, symmetric: bool, per_channel: bool,
                        round_mode: str = "half_up") -> DynamicLstmWeight:
    """An ONNX LSTM weight ``W``/``R`` (``[num_directions, 4*hidden_size, K]``) quantized for
    DynamicQuantizeLSTM with qtool's weight grid (narrow range, TF's nudging; ``bits`` <= 8 in an
    int8 container). Per channel: one range per (direction, gate row), the kernel's
    ``[num_directions, 4*hidden_size]`` scales (it needs zero points of 0 then: ``symmetric``);
    per tensor: one range for the whole tensor, its scale repeated per direction."""
    dirs, rows, k = w.shape
    flat = np.ascontiguousarray(w.reshape(dirs * rows, k), dtype=np.float32)
    stored, params = weight_params(flat, bits=bits, symmetric=symmetric, axis=0 if per_channel else None,
                                   int4=False, round_mode=round_mode)
    if per_channel:
        scale = params.scale.reshape(dirs, rows)
        zero_point = params.zero_point.reshape(dirs, rows)
    else:
        scale = np.full(dirs, params.scale.reshape(-1)[0], np.float32)
        zero_point = np.full(dirs, params.zero_point.reshape(-1)[0], params.zero_point.dtype)
    stored = np.ascontiguousarray(np.transpose(stored.reshape(dirs, rows, k), (0, 2, 1)))
    return DynamicLstmWeight(stored, scale.astype(np.float32), zero_point, params)


def activation_params(lo: float, hi: float, *, bits: int, symmetric: bool, signed: bool = False) -> QParams:
    """Parameters of an activation quantizer from an observed (or default) range, stored unsigned (a
    symmetric range: zero point ``2**(bits-1)``) or ``signed`` (the same grid shifted)."""
    lo, hi = widen(np.float32(lo), np.float32(hi), bits=bits, narrow=False, symmetric=symmetric)
    return qparams(lo, hi, bits=bits, narrow=False, signed=signed, int4=False)


# --- reading an existing Q/DQ encoding ----------------------------------------------------------
_FULL_BITS = {ir.DataType.INT4: 4, ir.DataType.UINT4: 4, ir.DataType.INT16: 16, ir.DataType.UINT16: 16}
_SIGNED = (ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT4)


def value_dtype(value: ir.Value | None) -> ir.DataType | None:
    if value is None:
        return None
    return value.dtype or (value.const_value.dtype if value.const_value is not None else None)


def dq_params(dq: ir.Node) -> tuple[ir.Value, ir.Value, ir.DataType] | None:
    """``(scale, zero_point, container type)`` of a per-tensor DequantizeLinear; None when it is
    per-axis or its parameters are missing."""
    if len(dq.inputs) < 3 or dq.inputs[1] is None or dq.inputs[2] is None:
        return None
    if "axis" in dq.attributes and np.size(constant_array(dq.inputs[1])) != 1:
        return None
    dtype = value_dtype(dq.inputs[2])
    if dtype is None:
        return None
    return dq.inputs[1], dq.inputs[2], dtype


def storage_of(dtype: ir.DataType, bits: int, symmetric: bool) -> Storage:
    """The storage of an existing quantizer, from its zero point type."""
    st = storage(bits, signed=dtype in _SIGNED, narrow=False, int4=False)
    if st.dtype != dtype:  # an existing quantizer of another width: keep its type, no clip
        return Storage(dtype, st.shift, _FULL_BITS.get(dtype, 8), False)
    return st


def dq_input_type(dq: ir.Node | None) -> ir.DataType | None:
    """The container type a DequantizeLinear reads (None when ``dq`` is not one)."""
    if dq is None or not is_onnx(dq, DEQUANTIZE) or not dq.inputs or dq.inputs[0] is None:
        return None
    return value_dtype(dq.inputs[0])


def eight_bit_kernel_types(x_dq: ir.Node, weight: ir.Value | None) -> bool:
    """True when onnxruntime has integer kernels (QLinearConv/QGemm) for the layer's input and
    weight types, i.e. both are 8-bit: it may then fuse the QDQ layer and use the int32 bias as is."""
    eight = (ir.DataType.INT8, ir.DataType.UINT8)
    w_dq = weight.producer() if weight is not None else None
    return dq_input_type(x_dq) in eight and dq_input_type(w_dq) in eight


# --- writing Q/DQ nodes -----------------------------------------------------------------------------
_EIGHT = (ir.DataType.UINT8, ir.DataType.INT8)


def qdq_names(store: Storage) -> tuple[list[str], list[str]]:
    """The node and value name suffixes of a quantizer with ``store`` (to reserve a unique prefix)."""
    clip = store.needs_clip
    cast = clip and store.dtype not in _EIGHT
    nodes = [QUANTIZE, DEQUANTIZE] + (["Clip"] if clip else []) + (["Cast", "Cast_back"] if cast else [])
    values = ["quantized", "dequantized", "scale", "zero_point"]
    if clip:
        values += ["clip_min", "clip_max", "clipped"]
    if cast:
        values += ["quantized_int32", "clipped_int32"]
    return nodes, values


def qdq_nodes(value: ir.Value, base: str, scale: ir.Value, zero_point: ir.Value, store: Storage,
              initializer) -> tuple[list[ir.Node], ir.Value]:
    """``QuantizeLinear -> [Clip] -> DequantizeLinear`` reading ``value``, named ``<base>/...``;
    returns the nodes (in order) and the dequantized output. ``initializer(name, array)`` adds the
    clip bounds. Odd widths clip the integers to TF's grid: in the 8-bit container directly, in
    int32 for 16-bit containers (onnxruntime has no 16-bit Clip)."""
    q = ir.node(QUANTIZE, [value, scale, zero_point], name=f"{base}/{QUANTIZE}")
    q.outputs[0].name = f"{base}/quantized"
    q.outputs[0].dtype = store.dtype
    q.outputs[0].shape = value.shape
    nodes = [q]
    last = q.outputs[0]
    if store.needs_clip:
        lo, hi = store.grid
        eight = store.dtype in _EIGHT
        np_dtype = store.numpy_dtype() if eight else np.int32
        bounds = [initializer(f"{base}/clip_min", np.array(lo, dtype=np_dtype)),
                  initializer(f"{base}/clip_max", np.array(hi, dtype=np_dtype))]
        if not eight:
            up = ir.node("Cast", [last], {"to": ir.DataType.INT32}, name=f"{base}/Cast")
            up.outputs[0].name = f"{base}/quantized_int32"
            nodes.append(up)
            last = up.outputs[0]
        clip = ir.node("Clip", [last, *bounds], name=f"{base}/Clip")
        clip.outputs[0].name = f"{base}/clipped" if eight else f"{base}/clipped_int32"
        nodes.append(clip)
        last = clip.outputs[0]
        if not eight:
            down = ir.node("Cast", [last], {"to": store.dtype}, name=f"{base}/Cast_back")
            down.outputs[0].name = f"{base}/clipped"
            nodes.append(down)
            last = down.outputs[0]
        last.dtype = store.dtype
    dq = dequantize_node(last, scale, zero_point, base, None, None)
    dq.outputs[0].shape = value.shape
    return nodes + [dq], dq.outputs[0]


def dequantize_node(codes: ir.Value, scale: ir.Value, zero_point: ir.Value, base: str, axis: int | None,
                    shape) -> ir.Node:
    """``DequantizeLinear`` of ``codes`` named ``<base>/DequantizeLinear`` (per-axis when ``axis``)."""
    attrs = {"axis": int(axis)} if axis is not None else {}
    dq = ir.node(DEQUANTIZE, [codes, scale, zero_point], attrs, name=f"{base}/{DEQUANTIZE}")
    dq.outputs[0].name = f"{base}/dequantized"
    dq.outputs[0].dtype = ir.DataType.FLOAT
    if shape is not None:
        dq.outputs[0].shape = ir.Shape(shape)
    return dq


# --- models that are already quantized ----------------------------------------------------------------
QOPERATOR_OPS = ("QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulInteger", "MatMulIntegerToFloat",
                 "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "QLinearAdd", "QLinearMul", "QLinearConcat",
                 "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool",
                 "QLinearSoftmax", "QAttention", "DynamicQuantizeLSTM", "MatMulNBits")
# the pieces of the names qtool gives its quantizers (``conv1/weights_quant/DequantizeLinear`` ...)
QTOOL_QUANTIZER_MARKS = ("weights_quant/", "act_quant/", "conv_quant/", "add_quant/", "input_quant/",
                         "bias_quant/", "lstm_quant/", "_quant/",
                         # the DequantizeLinear nodes of the kernel forms (eval_graph, kernel_forms)
                         "/input_channels/DequantizeLinear", "/space_to_depth/DequantizeLinear",
                         "/gate_tile/DequantizeLinear", "/depthwise/DequantizeLinear",
                         "/float_input/DequantizeLinear")


_NUMBERED_QUANTIZER = re.compile(r"_quant_\d+/")  # a second quantizer of one context: ``carried_quant_1/``


def _qtool_named(name: str) -> bool:
    return any(mark in name for mark in QTOOL_QUANTIZER_MARKS) or bool(_NUMBERED_QUANTIZER.search(name))


def foreign_quantization(graph: ir.Graph) -> str | None:
    """Why ``graph`` is already quantized by something other than qtool (None when it is float or
    quantized by qtool, whose rewrites are idempotent): QOperator ops, or Q/DQ nodes qtool did not name."""
    # a DynamicQuantizeLSTM qtool wrote (``<lstm name>/lstm_quant/DynamicQuantizeLSTM``) is its own
    qops = [n for n in graph.all_nodes() if n.op_type in QOPERATOR_OPS
            and not (n.op_type == "DynamicQuantizeLSTM" and "lstm_quant" in (n.name or ""))]
    if qops:
        kinds = sorted({n.op_type for n in qops})
        return (f"it is a quantized model in onnxruntime's QOperator format ({len(qops)} node(s): "
                f"{', '.join(kinds[:4])}{' ...' if len(kinds) > 4 else ''})")
    qdq = [n for n in graph.all_nodes() if is_onnx(n, QUANTIZE, DEQUANTIZE)]
    foreign = [n for n in qdq if not _qtool_named(n.name or "")]
    if foreign:
        return (f"it already has {len(qdq)} QuantizeLinear/DequantizeLinear node(s) that qtool did not write "
                f"(e.g. '{foreign[0].name or foreign[0].outputs[0].name}')")
    return None
