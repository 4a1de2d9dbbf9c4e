"""Shapes found in the eleventh sweep's models (``benchmarks/real_models.py``: OpenVINO's OSNet-AIN person
re-identifier as tf2onnx wrote it), rebuilt small the way their exporters wrote them."""

import numpy as np
import onnx
import onnx_ir as ir
from model_builders import Builder, run, x_data
from test_placement_integer import optimized_ops

import qtool


def ain_gate(c: int = 8, hw: int = 8) -> onnx.ModelProto:
    """An OSNet-AIN channel gate (person-reidentification-retail-0287: tf2onnx 1.7.2, opset 12): the feature map's
    GlobalAveragePool as ``ReduceMean(axes 2, 3)``, reshaped to [1, 1, C] and instance-normalised in float
    arithmetic (``ReduceMean``, ``Sub``, its square as ``Mul``, ``ReduceMean``, ``Add`` eps, ``Sqrt``, ``Div``),
    an affine ``Mul``/``Add`` and a ``Sigmoid``, reshaped back to [1, C, 1, 1]; the gate scales the map (``Mul``)
    before the next conv."""
    b = Builder(opset=12)
    x = b.input("inputs:0", [1, c, hw, hw])
    y = b.node("Relu", [b.conv(x, c, c)])
    pooled = b.node("ReduceMean", [y], axes=[2, 3], keepdims=1)
    v = b.node("Reshape", [pooled, b.const(np.array([1, 1, c], np.int64))])
    mean = b.node("ReduceMean", [v], axes=[0, 1, 2], keepdims=1)
    centred = b.node("Sub", [v, mean])
    var = b.node("ReduceMean", [b.node("Mul", [centred, centred])], axes=[0, 1, 2], keepdims=1)
    normed = b.node("Div", [centred, b.node("Sqrt", [b.node("Add", [var, b.const(np.float32(1e-5))])])])
    rng = np.random.default_rng(0)
    affine = b.node("Add", [b.node("Mul", [normed, b.const(rng.uniform(0.5, 1.5, (1, 1, c)).astype(np.float32))]),
                            b.const(rng.uniform(-0.5, 0.5, (c,)).astype(np.float32))])
    gate = b.node("Reshape", [b.node("Sigmoid", [affine]), b.const(np.array([1, c, 1, 1], np.int64))])
    return b.proto([b.conv(b.node("Mul", [y, gate]), c, 4, k=1)])


def test_a_float_gate_over_a_quantized_map_is_quantized_so_the_mul_runs_in_integers(tmp_path):
    """The gate's Sigmoid reads a float tensor (the written-out instance norm), so the placement left it, and with
    it the Mul over the whole map, in float: onnxruntime dequantized the map, multiplied in float and quantized
    again for the next conv. The small gate gets its own quantizer and the Mul runs as QLinearMul."""
    proto = ain_gate()
    x = x_data(16, 8, 8, 8)
    result = qtool.rewrite_eval(proto, calibration_data={"inputs:0": x})
    model = ir.serde.serialize_model(result.model)
    ops = optimized_ops(model, tmp_path)
    assert ops["QLinearMul"] == 1 and ops["Mul"] == 2  # the gate over the map; the norm's square and affine
    assert not [x for x in result.left_in_float() if x["op"] == "Mul"]
    got, want = run(result.model, {"inputs:0": x[:1]})[0], run(proto, {"inputs:0": x[:1]})[0]
    assert np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def test_a_float_operand_as_large_as_the_quantized_one_stays_float(tmp_path):
    """Only a broadcast operand is worth its own quantizer: a float tensor of the map's size (here the map's own
    exp) would cost a QuantizeLinear as large as the DequantizeLinear it saves."""
    b = Builder(opset=12)
    x = b.input("inputs:0", [1, 8, 8, 8])
    y = b.node("Relu", [b.conv(x, 8, 8)])
    proto = b.proto([b.conv(b.node("Mul", [y, b.node("Exp", [x])]), 8, 4, k=1)])
    result = qtool.rewrite_eval(proto, calibration_data={"inputs:0": x_data(16, 8, 8, 8)})
    ops = optimized_ops(ir.serde.serialize_model(result.model), tmp_path)
    assert ops["QLinearMul"] == 0 and ops["Mul"] == 1


def channels_last_stem(channels_last: bool) -> onnx.ModelProto:
    """An RGB stem as tf2onnx writes a TensorFlow model (OSNet-AIN through OpenVINO and TensorFlow: an NHWC input,
    ``Transpose(perm 0, 3, 1, 2)`` into the first Conv), or as PyTorch does (NCHW, no Transpose)."""
    b = Builder(opset=13)
    if channels_last:
        x = b.node("Transpose", [b.input("inputs:0", [1, 32, 32, 3])], perm=[0, 3, 1, 2])
    else:
        x = b.input("inputs:0", [1, 3, 32, 32])
    y = b.node("Relu", [b.conv(x, 3, 32, k=3, strides=[2, 2], pads=[1, 1, 1, 1])])
    return b.proto([b.conv(y, 32, 16, k=1)])


def test_an_rgb_stem_behind_a_channels_last_transpose_is_not_padded_to_four_channels(tmp_path):
    """The 3 -> 4 channel Pad (onnxruntime's fast integer kernel) ran on the innermost axis once onnxruntime's
    transpose optimizer had moved the input's Transpose past it: one element per pixel, 0.70 ms against 1.3 ms
    for the re-identifier's stem; a 3 x 3 stride-2 stem at 224 x 224 took 0.97 ms padded against 0.62 ms. An
    NCHW stem is still padded (0.45 ms against 0.62 ms)."""
    for channels_last, padded in ((True, 0), (False, 1)):
        proto = channels_last_stem(channels_last)
        shape = (8, 32, 32, 3) if channels_last else (8, 3, 32, 32)
        x = x_data(*shape)
        result = qtool.rewrite_eval(proto, calibration_data={"inputs:0": x})
        assert result.to_dict()["counts"]["conv_inputs_padded"] == padded
        model = ir.serde.serialize_model(result.model)
        assert optimized_ops(model, tmp_path)["Pad"] == padded
        got, want = run(result.model, {"inputs:0": x[:1]})[0], run(proto, {"inputs:0": x[:1]})[0]
        assert np.abs(got - want).mean() < 0.05 * np.abs(want).mean()
