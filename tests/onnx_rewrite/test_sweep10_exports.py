"""Shapes found in the tenth sweep's models (``benchmarks/real_models.py``: hpc203's NanoDet-m and M-LSD tiny),
rebuilt small the way their exporters wrote them."""

import numpy as np
import onnx
import onnx_ir as ir
from model_builders import Builder, run, x_data
from test_placement_integer import optimized_ops

import qtool
from qtool.model.opset import convert_opset
from qtool.onnx_rewrite.conv_pads import pads_into_convs


def nanodet_upsample(initializers_as_inputs: bool = True) -> onnx.ModelProto:
    """NanoDet-m's PAN (PyTorch 1.7, opset 11): ``Resize(x, roi, scales, sizes)`` with one empty initializer for
    both ``roi`` and ``scales`` and a constant ``sizes``, and, as exporters before IR 4 wrote them, every
    initializer also listed as a graph input."""
    b = Builder(opset=11, ir_version=6)
    x = b.input("input.1", [1, 3, 8, 8])
    y = b.node("LeakyRelu", [b.conv(x, 3, 8)], alpha=0.1)
    empty = b.const(np.zeros(0, np.float32))
    up = b.node("Resize", [y, empty, empty, b.const(np.array([1, 8, 16, 16], np.int64))],
                coordinate_transformation_mode="pytorch_half_pixel", mode="linear", nearest_mode="floor")
    proto = b.proto([b.conv(up, 8, 4, k=1)])
    if initializers_as_inputs:
        proto.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                 for t in proto.graph.initializer)
    return proto


def test_an_empty_scales_initializer_listed_as_an_input_is_dropped_at_opset_13():
    """At opset 13 onnxruntime takes an empty ``scales`` for "not given" only when it can read it: listed as a graph
    input it could be fed, and the session failed ("Either `sizes` or `scales` must be provided, but not both");
    the float model at opset 11 runs. The upgrade gives both empty operands as missing inputs."""
    proto = nanodet_upsample()
    converted = convert_opset(ir.serde.deserialize_model(proto), 13, "quantization needs")
    resize = next(n for n in converted.graph if n.op_type == "Resize")
    assert resize.inputs[1] is None and resize.inputs[2] is None and resize.inputs[3] is not None
    x = x_data(1, 3, 8, 8)
    np.testing.assert_allclose(run(converted, {"input.1": x})[0], run(proto, {"input.1": x})[0], rtol=1e-6)


def test_nanodet_upsampling_quantizes_and_runs():
    proto = nanodet_upsample()
    x = x_data(8, 3, 8, 8)
    result = qtool.rewrite_eval(proto, calibration_data={"input.1": x})
    got, want = run(result.model, {"input.1": x[:1]})[0], run(proto, {"input.1": x[:1]})[0]
    assert np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def mlsd_padded_conv(opset: int = 11) -> onnx.ModelProto:
    """M-LSD's MobileNetV2 (tf2onnx 1.8.5, opset 11, NHWC carried into NCHW): TensorFlow's uneven ``same`` padding
    of a stride-2 depthwise conv as an explicit ``Pad`` whose pads tf2onnx computes as ``Concat(Split(constant))``,
    then the conv with no pads of its own."""
    b = Builder(opset=opset)
    x = b.input("input", ["batch", 3, 9, 9])
    y = b.node("Clip", [b.conv(x, 3, 8, k=1, pads=[0] * 4), b.const(np.float32(0)), b.const(np.float32(6))])
    halves = b.node("Split", [b.const(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64))],
                    outputs=[f"pads_part{i}" for i in range(8)], axis=0)
    pads = b.node("Concat", [halves.replace("0", str(i)) for i in range(8)], axis=0)
    y = b.node("Pad", [y, pads], mode="constant")
    y = b.conv(y, 8, 8, group=8, pads=[0] * 4, strides=[2, 2])
    return b.proto([b.conv(b.node("Relu", [y]), 8, 4, k=1, pads=[0] * 4)])


def test_a_zero_pad_before_a_conv_folds_into_its_pads(tmp_path):
    """The Pad carried its input's quantizer, so onnxruntime could not fuse it into the QLinearConv (PadFusion
    runs on float Pad -> Conv only) and ran it alone over the uint8 map: M-LSD tiny's int8 model at 0.43x float
    against 0.38x for onnxruntime's quantize_static, whose pre-processing fuses it first; 0.37x folded."""
    proto = mlsd_padded_conv()
    x = x_data(16, 3, 9, 9)
    result = qtool.rewrite_eval(proto, calibration_data={"input": x})
    model = ir.serde.serialize_model(result.model)
    assert "Pad" not in {n.op_type for n in model.graph.node} | set(optimized_ops(model, tmp_path))
    pads = [next(list(a.ints) for a in n.attribute if a.name == "pads") for n in model.graph.node
            if n.op_type == "Conv"]
    assert pads == [[0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 0]]
    got, want = run(result.model, {"input": x[:4]})[0], run(proto, {"input": x[:4]})[0]
    assert np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def test_a_pad_of_another_value_or_of_the_channels_stays():
    for value, pads in ((1.0, [0, 0, 0, 0, 0, 0, 1, 1]), (0.0, [0, 1, 0, 0, 0, 0, 1, 1])):
        b = Builder(opset=13)
        x = b.input("input", [1, 3, 6, 6])
        y = b.node("Pad", [x, b.const(np.array(pads, np.int64)), b.const(np.float32(value))], mode="constant")
        proto = b.proto([b.conv(y, 3 + pads[1], 4, pads=[0] * 4)])
        model = ir.serde.deserialize_model(proto)
        assert pads_into_convs(model.graph, 13) == []
        assert [n.op_type for n in model.graph] == ["Pad", "Conv"]
