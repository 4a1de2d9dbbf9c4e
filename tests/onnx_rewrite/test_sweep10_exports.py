"""Shapes found in the tenth sweep's models (``benchmarks/real_models.py``: hpc203's NanoDet-m), rebuilt small the
way their exporters wrote them."""

import numpy as np
import onnx
import onnx_ir as ir
from model_builders import Builder, run, x_data

import qtool
from qtool.model.opset import convert_opset


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
