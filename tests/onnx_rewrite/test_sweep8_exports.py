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
    QLinearAdd; the report listed it among the ops in float because its scales input is not quantized."""
    result = qtool.rewrite_eval(retinaface_fpn(), calibration_data={"input0": x_data(8, 3, 16, 16)},
                                calibration=qtool.CalibrationConfig(batch_size=1))
    assert "Resize" not in result.other_float_ops() and "Concat" in result.other_float_ops()


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
