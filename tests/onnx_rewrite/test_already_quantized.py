"""A model that is already quantized (by onnxruntime, QDQ or QOperator) is refused with a clear
message; qtool's own output is recognised and left as it is (idempotent)."""

import numpy as np
import pytest
from model_builders import Builder, save, x_data
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

import qtool
from qtool.errors import QtoolError


class _Reader(CalibrationDataReader):
    def __init__(self, x):
        self.it = iter([{"x": x[i:i + 1]} for i in range(len(x))])

    def get_next(self):
        return next(self.it, None)


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    b = Builder()
    x = b.input("x", ["N", 3, 8, 8])
    y = b.node("Relu", [b.bn(b.conv(x, 3, 4, name="c1"), 4, name="bn1")])
    y = b.gemm(b.node("Flatten", [b.conv(y, 4, 2, name="c2")]), 128, 5, name="fc")
    folder = tmp_path_factory.mktemp("already")
    return save(b.proto([y]), folder / "float.onnx"), x_data(8, 3, 8, 8), folder


@pytest.mark.parametrize("fmt, words", [(QuantFormat.QDQ, "QuantizeLinear/DequantizeLinear node(s) that qtool did not write"),
                                         (QuantFormat.QOperator, "QOperator format")])
def test_a_model_quantized_by_onnxruntime_is_refused(float_model, fmt, words):
    path, x, folder = float_model
    quantized = str(folder / f"ort_{fmt.name}.onnx")
    quantize_static(path, quantized, _Reader(x), quant_format=fmt)
    for rewrite in (qtool.rewrite_eval, qtool.rewrite_train):
        with pytest.raises(QtoolError, match="is already quantized") as err:
            rewrite(quantized, str(folder / "out.onnx"))
        assert words in str(err.value) and "float model" in str(err.value)
    assert not (folder / "out.onnx").exists()


@pytest.fixture(scope="module")
def hard_swish_model(tmp_path_factory):
    """HardSwish written out as paddle2onnx writes it, then a learnable affine block: qtool's output
    has its integer gates' and scalar constants' DequantizeLinear nodes too."""
    b = Builder(opset=12, constants=True)
    x = b.input("x", ["N", 3, 8, 8])
    y = b.conv(x, 3, 4, name="c1")
    six = b.const(np.float32(6))
    relu6 = b.node("Clip", [b.node("Add", [y, b.const(np.float32(3))]), b.const(np.float32(0)), six])
    y = b.node("Div", [b.node("Mul", [y, relu6]), six])
    y = b.node("Add", [b.node("Mul", [y, b.const(np.float32(0.7))]), b.const(np.float32(0.1))])
    y = b.conv(y, 4, 2, name="c2")
    folder = tmp_path_factory.mktemp("already_hs")
    return save(b.proto([y]), folder / "float.onnx"), x_data(8, 3, 8, 8), folder


@pytest.fixture(scope="module")
def rgb_stem_model(tmp_path_factory):
    """An RGB stem: qtool's output pads its input codes to 4 channels (a DequantizeLinear of its own)."""
    b = Builder()
    x = b.input("x", ["N", 3, 16, 16])
    y = b.node("Relu", [b.bn(b.conv(x, 3, 16, name="stem"), 16, name="bn1")])
    y = b.conv(y, 16, 8, name="c2")
    folder = tmp_path_factory.mktemp("already_stem")
    return save(b.proto([y]), folder / "float.onnx"), x_data(8, 3, 16, 16), folder


@pytest.fixture(scope="module")
def attention_model(tmp_path_factory):
    """Self-attention: ``Softmax(q k^T) v`` with q, k, v Linears. In qtool's output the scores MatMul reads
    a DequantizeLinear as its second input (the quantized keys), which is no stored weight."""
    b = Builder()
    x = b.input("x", ["N", 6, 8])
    q, k, v = (b.matmul(x, 8, 8, bias=True, name=n) for n in ("q", "k", "v"))
    scores = b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 2, 1])], name="scores")
    y = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v], name="mix")
    y = b.matmul(y, 8, 4, bias=True, name="out")
    folder = tmp_path_factory.mktemp("already_attention")
    return save(b.proto([y]), folder / "float.onnx"), x_data(8, 6, 8), folder


@pytest.fixture(scope="module")
def prelu_model(tmp_path_factory):
    """MTCNN's shape (keras2onnx, opset 12): NHWC input, Conv -> PRelu -> MaxPool -> Conv. qtool's output
    writes the PRelu as ``Relu(x) + Min(x, 0) * slope``, whose Relu must not read as a layer's activation."""
    b = Builder(opset=12)
    x = b.input("x", ["N", 16, 16, 3])
    y = b.node("Transpose", [x], perm=[0, 3, 1, 2])
    y = b.node("PRelu", [b.conv(y, 3, 16, name="c1"), b.const(np.linspace(-0.5, 1.2, 16, dtype=np.float32)
                                                                .reshape(16, 1, 1))])
    y = b.conv(b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2]), 16, 8, name="c2")
    folder = tmp_path_factory.mktemp("already_prelu")
    return save(b.proto([y]), folder / "float.onnx"), x_data(8, 16, 16, 3), folder


@pytest.mark.parametrize("which", ["float_model", "hard_swish_model", "rgb_stem_model", "attention_model",
                                   "prelu_model"])
def test_qtools_own_output_is_recognised_and_left_as_it_is(which, request):
    path, x, folder = request.getfixturevalue(which)
    first = qtool.rewrite_eval(path, str(folder / "q.onnx"), calibration_data={"x": x})
    if which == "hard_swish_model":
        assert first.summary["counts"]["hard_sigmoids_integer"] == 1
        assert first.summary["counts"]["scalar_operands_integer"] == 2
    if which == "rgb_stem_model":  # its DequantizeLinear is named '<stem>/input_channels/DequantizeLinear'
        assert first.summary["counts"]["conv_inputs_padded"] == 1
    if which == "prelu_model":
        assert first.summary["counts"]["prelus_as_sums"] == 1
    again = qtool.rewrite_eval(str(folder / "q.onnx"), str(folder / "q2.onnx"))
    assert first.summary["changed"] and not again.summary["changed"]
    assert "already quantized: nothing to do" in again.summary["notes"][-1]
    assert np.array_equal(np.fromfile(folder / "q.onnx", np.uint8), np.fromfile(folder / "q2.onnx", np.uint8))
    # the forms the file already has are not counted as new work (the PRelu is written as a sum again)
    counts = again.summary["counts"]
    assert counts["prelus_as_sums"] == 0 and "PRelu" not in again.format_text().split("ops in float")[0]


def test_options_on_an_already_quantized_model_are_a_warning_not_silence(float_model):
    path, x, folder = float_model
    qtool.rewrite_eval(path, str(folder / "q8.onnx"), calibration_data={"x": x})
    again = qtool.rewrite_eval(str(folder / "q8.onnx"), quant=qtool.QuantConfig(weight_bits=4))
    assert any("already quantized by qtool" in w and "weight_bits=4" in w for w in again.warnings)
    assert not again.summary["changed"]
