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
