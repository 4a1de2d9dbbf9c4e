"""The eval graph's Q/DQ encoding (spec section 6): exact weights, TF's scale and zero point."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from model_builders import Builder, run, x_data

import qtool
from qtool.model.constants import constant_array
from qtool.api import rewrite_eval
from qtool.config import QuantConfig


def init(model: ir.Model, name: str) -> np.ndarray:
    return constant_array(model.graph.initializers[name])


def node(model: ir.Model, name: str) -> ir.Node:
    return next(n for n in model.graph if n.name == name)


def layer_model(kind: str, constants=False):
    b = Builder(constants=constants)
    if kind == "conv":
        x = b.input("x", ["N", 3, 6, 6])
        y = b.conv(x, 3, 5, name="L")
        feeds = {"x": x_data(4, 3, 6, 6)}
    elif kind == "depthwise":
        x = b.input("x", ["N", 4, 6, 6])
        y = b.conv(x, 4, 4, group=4, name="L")
        feeds = {"x": x_data(4, 4, 6, 6)}
    elif kind == "convtranspose":
        x = b.input("x", ["N", 4, 4, 4])
        y = b.conv_transpose(x, 4, 6, group=2, name="L")
        feeds = {"x": x_data(4, 4, 4, 4)}
    elif kind.startswith("gemm"):
        x = b.input("x", ["N", 6])
        y = b.gemm(x, 6, 5, trans_b=int(kind[-1]), name="L")
        feeds = {"x": x_data(4, 6)}
    else:
        x = b.input("x", ["N", 6])
        y = b.matmul(x, 6, 5, name="L")
        feeds = {"x": x_data(4, 6)}
    return b.proto([y]), feeds


AXIS = {"conv": 0, "depthwise": 0, "convtranspose": 1, "gemm0": 1, "gemm1": 0, "matmul": 1}


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("kind", list(AXIS))
def test_stored_weights_are_the_kernel_codes(kind, symmetric):
    proto, feeds = layer_model(kind)
    w = next(onnx.numpy_helper.to_array(t) for t in proto.graph.initializer if t.name == proto.graph.node[0].input[1])
    result = rewrite_eval(proto, calibration_data=feeds, quant=QuantConfig(symmetric=symmetric, symmetric_weights=symmetric))
    model = result.model
    dq = node(model, "L/weights_quant/DequantizeLinear")
    assert dq.attributes["axis"].as_int() == AXIS[kind]
    stored = init(model, "L/weights_quant/quantized")
    scale = init(model, "L/weights_quant/scale")
    zp = init(model, "L/weights_quant/zero_point")
    assert stored.dtype == np.int8 and zp.dtype == np.int8 and scale.dtype == np.float32

    axis = AXIS[kind]
    lo, hi = qtool.kernels.minmax(w, axis=axis)
    if symmetric:
        lo, hi = np.minimum(lo, -hi), np.maximum(hi, -lo)
    else:
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    codes = qtool.kernels.quantize_codes(w, lo, hi, num_bits=8, narrow_range=True, axis=axis)
    _, _, want_scale, want_zp = qtool.nudged_range(lo, hi, 8, narrow_range=True)
    np.testing.assert_array_equal(stored, codes - 128)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(zp, want_zp - 128)
    if symmetric:
        assert np.all(zp == 0) and stored.min() >= -127 and stored.max() <= 127

    # DequantizeLinear in onnxruntime gives TF's per-channel fake quant, bit for bit
    model.graph.outputs.append(dq.outputs[0])
    dq_out = run(model, feeds, optimize=False)[-1]
    moved = np.moveaxis(w, axis, -1)
    fq = qtool.fake_quant_with_min_max_vars_per_channel(np.ascontiguousarray(moved), lo, hi, narrow_range=True)
    np.testing.assert_array_equal(dq_out, np.moveaxis(fq, -1, axis))


def test_per_tensor_weights_keep_opset_11():
    proto, feeds = layer_model("conv")
    proto.opset_import[0].version = 11
    result = rewrite_eval(proto, calibration_data=feeds, quant=QuantConfig(per_channel=False, symmetric_weights=False))
    model = result.model
    assert model.opset_imports[""] == 11
    dq = node(model, "L/weights_quant/DequantizeLinear")
    assert "axis" not in dq.attributes
    assert init(model, "L/weights_quant/scale").shape == ()
    w = next(onnx.numpy_helper.to_array(t) for t in proto.graph.initializer if t.name == "w1")
    lo, hi = qtool.kernels.minmax(w)
    codes = qtool.kernels.quantize_codes(w, min(lo, 0), max(hi, 0), narrow_range=True)
    np.testing.assert_array_equal(init(model, "L/weights_quant/quantized"), codes - 128)
    run(model, feeds)


def test_activation_scale_and_zero_point_are_tf_nudged():
    proto, feeds = layer_model("gemm1")
    result = rewrite_eval(proto, calibration_data=feeds)
    model = result.model
    out = run(proto, feeds)[0]
    for name, data in (("x/input_quant", feeds["x"]), ("L/act_quant", out)):
        lo, hi = min(float(data.min()), 0.0), max(float(data.max()), 0.0)
        _, _, scale, zp = qtool.nudged_range(np.float32(lo), np.float32(hi), 8)
        assert init(model, f"{name}/scale") == scale
        stored_zp = init(model, f"{name}/zero_point")
        assert stored_zp.dtype == np.uint8 and stored_zp == zp
        assert stored_zp.shape == () and init(model, f"{name}/scale").shape == ()


def test_symmetric_activations_are_uint8_at_128_or_int8_at_0_when_asked():
    """A symmetric range's grid stored as onnxruntime's own tool stores it (uint8, zero point 128: its x86
    kernels fuse uint8 activations), or as int8 with zero point 0 (TensorRT, TFLite) with
    ``int8_activations``: the same values to the bit."""
    proto, feeds = layer_model("gemm1")
    models = [rewrite_eval(proto, calibration_data=feeds, quant=QuantConfig(symmetric=True, int8_activations=signed)).model
              for signed in (False, True)]
    zps = [init(m, "L/act_quant/zero_point") for m in models]
    assert zps[0].dtype == np.uint8 and zps[0] == 128 and zps[1].dtype == np.int8 and zps[1] == 0
    assert init(models[0], "L/act_quant/scale") == init(models[1], "L/act_quant/scale")
    outs = [run(m, feeds, optimize=False) for m in models]
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_default_ranges_without_calibration():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    r = b.node("Relu", [b.conv(x, 3, 4, name="L")], outputs=["r"])
    result = rewrite_eval(b.proto([r]))
    model = result.model
    assert init(model, "L/act_quant/scale") == np.float32(6 / 255)
    assert init(model, "L/act_quant/zero_point") == 0
    _, _, s, z = qtool.nudged_range(-6.0, 6.0)
    assert init(model, "x/input_quant/scale") == s and init(model, "x/input_quant/zero_point") == z
    assert any("needs calibration" in w for w in result.warnings)
    assert all(a["range_source"] == "default" for a in result.summary["activations"])


def test_graph_output_keeps_its_name():
    b = Builder()
    x = b.input("x", ["N", 6])
    b.gemm(x, 6, 3, name="L")
    b.nodes[-1].output[0] = "logits"
    b.output("logits")
    feeds = {"x": x_data(4, 6)}
    model = rewrite_eval(b.proto(), calibration_data=feeds).model
    (out,) = model.graph.outputs
    assert out.name == "logits" and out.producer().op_type == "DequantizeLinear"
    assert node(model, "L").outputs[0].name == "logits/float"


def test_int32_bias_and_propagated_input_quantizer():
    b = Builder()
    x = b.input("x", ["N", 3, 8, 8])
    r = b.node("Relu", [b.conv(x, 3, 4, name="c1/Conv")], outputs=["r"])
    p = b.node("MaxPool", [r], kernel_shape=[2, 2], strides=[2, 2], outputs=["p"])
    y = b.conv(p, 4, 4, name="c2/Conv")
    feeds = {"x": x_data(4, 3, 8, 8)}
    result = rewrite_eval(b.proto([y]), calibration_data=feeds)
    model = result.model
    conv2 = node(model, "c2/Conv")
    q_in = conv2.inputs[0].producer()
    assert q_in.name.endswith("/carried_quant/DequantizeLinear")  # the MaxPool carries the Relu's quantizer
    # same scale and zero point objects as the Relu's quantizer: MaxPool keeps the grid
    assert q_in.inputs[1].name == "c1/act_quant/scale" and q_in.inputs[2].name == "c1/act_quant/zero_point"
    bias_dq = conv2.inputs[2].producer()
    assert bias_dq.name == "c2/bias_quant/DequantizeLinear"
    bq, bscale = init(model, "c2/bias_quant/quantized"), init(model, "c2/bias_quant/scale")
    assert bq.dtype == np.int32
    np.testing.assert_array_equal(bscale, init(model, "c1/act_quant/scale") * init(model, "c2/weights_quant/scale"))
    assert result.summary["counts"]["propagated_input_quantizers"] == 1
    assert result.summary["counts"]["biases_int32"] == 2


@pytest.mark.parametrize(
    "bits,w_type,a_type,clip,opset,pack",
    [
        (8, "INT8", "UINT8", None, 13, False),
        (7, "INT8", "UINT8", "Clip", 13, False),
        (2, "INT8", "UINT8", "Clip", 13, False),
        # 4-bit weights in int8 (onnxruntime's integer kernels), packed int4 when asked; 4-bit activations in
        # uint8 + Clip (onnxruntime fusion, see codec.py)
        (4, "INT8", "UINT8", "Clip", 13, False),
        (4, "INT4", "UINT8", "Clip", 21, True),
        (12, "INT16", "UINT16", "Cast", 21, False),
        (16, "INT16", "UINT16", None, 21, False),
    ],
)
def test_bit_widths_encodings(bits, w_type, a_type, clip, opset, pack):
    b = Builder(opset=11)
    x = b.input("x", ["N", 6])
    r = b.node("Relu", [b.gemm(x, 6, 5, name="L")], outputs=["r"])
    y = b.gemm(r, 5, 3, name="M")
    feeds = {"x": x_data(8, 6)}
    quant = QuantConfig(weight_bits=bits, activation_bits=bits, pack_int4=pack)
    result = rewrite_eval(b.proto([y]), calibration_data=feeds, quant=quant)
    model = result.model
    assert model.opset_imports[""] == opset
    assert init(model, "L/weights_quant/quantized").dtype == ir.DataType[w_type].numpy()
    assert init(model, "L/act_quant/zero_point").dtype == ir.DataType[a_type].numpy()
    inner = node(model, "L/act_quant/DequantizeLinear").inputs[0].producer()
    if clip is None:
        assert inner.op_type == "QuantizeLinear"
    else:
        assert inner.op_type == ("Clip" if clip == "Clip" else "Cast")
    stored = init(model, "L/weights_quant/quantized").astype(np.int64)
    assert stored.min() >= -(2 ** (bits - 1)) + 1 and stored.max() <= 2 ** (bits - 1) - 1
    # runs in onnxruntime, and the activation values lie on the bits-wide grid
    dq = node(model, "L/act_quant/DequantizeLinear")
    model.graph.outputs.append(dq.outputs[0])
    outs = run(model, feeds, optimize=False)
    scale, zp = init(model, "L/act_quant/scale"), init(model, "L/act_quant/zero_point").astype(np.int64)
    q = np.rint(outs[-1] / scale).astype(np.int64) + zp
    assert q.min() >= 0 and q.max() <= 2**bits - 1
    # the float model within the worst case of its quantizers. An activation quantizer (TF's nudged grid, its ends
    # within half a step of the calibrated range, calibrated on these very feeds) moves a value by at most half a
    # step by rounding plus half a step where the grid misses the range: one step, added to the error it receives
    # (clipping to the grid only brings a value nearer an in-range one). The float32 sums add under 1e-5.
    want, r = run(b.proto([y, "r"]), feeds)
    hidden = gemm_error(model, "L", feeds["x"], init(model, "x/input_quant/scale")) + init(model, "L/act_quant/scale")
    bound = gemm_error(model, "M", r, hidden) + init(model, "M/act_quant/scale")
    assert np.all(np.abs(outs[0] - want) <= bound + 1e-5)


def gemm_error(model: ir.Model, layer: str, x: np.ndarray, x_error) -> np.ndarray:
    """The most a quantized Gemm (transB) x_q W_q^T + b_q can differ from the float x W^T + b, per sample and output,
    when each |x_q - x| <= x_error: x_q W_q - x W = (x_q - x) W_q + x (W_q - W), a weight is within half its
    channel's step (a symmetric grid over the channel's largest |w|) and the int32 bias within half its step."""
    w_q = init(model, f"{layer}/weights_quant/quantized") * init(model, f"{layer}/weights_quant/scale")[:, None]
    half_w = init(model, f"{layer}/weights_quant/scale") / 2
    return (np.broadcast_to(x_error, x.shape) @ np.abs(w_q).T + np.abs(x).sum(1, keepdims=True) * half_w
            + init(model, f"{layer}/bias_quant/scale") / 2)


def test_eval_graph_matches_fake_quant_simulation():
    """The Q/DQ graph computes TF's fake-quant graph (ties aside) on a two-layer MLP."""
    b = Builder()
    x = b.input("x", ["N", 6])
    h = b.node("Relu", [b.gemm(x, 6, 8, name="L1")], outputs=["h"])
    y = b.gemm(h, 8, 4, name="L2")
    proto = b.proto([y])
    feeds = {"x": x_data(64, 6)}
    model = rewrite_eval(proto, calibration_data=feeds).model
    got = run(model, feeds, optimize=False)[0]

    fq = qtool.fake_quant_with_min_max_vars

    def act(name, v):
        s = init(model, f"{name}/scale")
        z = init(model, f"{name}/zero_point").astype(np.float32)
        return fq(v, (0 - z) * s, (255 - z) * s)

    def layer(v, name):
        w_fq = run_dq(model, name)  # [N, K] (transB=1), the dequantized weights
        bias = init(model, f"{name}/bias_quant/quantized") * init(model, f"{name}/bias_quant/scale")
        return (v @ w_fq.T + bias).astype(np.float32)

    x_fq = act("x/input_quant", feeds["x"])
    h_ref = act("L1/act_quant", np.maximum(layer(x_fq, "L1"), 0))
    y_ref = act("L2/act_quant", layer(h_ref, "L2"))
    step = init(model, "L2/act_quant/scale")
    assert np.max(np.abs(got - y_ref)) <= step * 1.01


def run_dq(model, name):
    dq = node(model, f"{name}/weights_quant/DequantizeLinear")
    q = init(model, f"{name}/weights_quant/quantized").astype(np.float32)
    s = init(model, f"{name}/weights_quant/scale")
    z = init(model, f"{name}/weights_quant/zero_point").astype(np.float32)
    axis = dq.attributes["axis"].as_int()
    shape = [1] * q.ndim
    shape[axis] = -1
    return (q - z.reshape(shape)) * s.reshape(shape)
