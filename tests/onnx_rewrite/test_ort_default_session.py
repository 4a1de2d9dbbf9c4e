"""Eval graphs give the same results in onnxruntime's default session (graph optimizations on) as with
optimizations off, at every width: no encoding may trip an onnxruntime optimizer.

Regressions: W16A16 biases that do not fit int32 at ``input_scale * weight_scale`` were left in float,
and onnxruntime's WeightBiasQuantization quantized them to int32 itself with an unchecked cast
(INT32_MIN for out-of-range values): 99.6% -> 84% on the sample. uint4 activations made the QDQ fusion
build a QLinearConv on uint4, an invalid graph (the session failed to load).
"""

from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from model_builders import Builder
from qtool.api import rewrite_eval, rewrite_train
from qtool.config import QuantConfig

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MODEL = SAMPLES / "digits_cnn.onnx"
LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "default": None,  # onnxruntime's default session options (ORT_ENABLE_ALL)
}


def session(model, level=None) -> ort.InferenceSession:
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if level is not None:
        options.graph_optimization_level = level
    data = model.SerializeToString() if not isinstance(model, (str, Path)) else str(model)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def logits(model, level=None) -> np.ndarray:
    data = np.load(SAMPLES / "eval.npz")
    return session(model, level).run(["logits"], {"input": data["input"]})[0]


def accuracy(out: np.ndarray) -> float:
    return float((out.argmax(1) == np.load(SAMPLES / "eval.npz")["labels"]).mean())


@pytest.fixture(scope="module")
def float_accuracy():
    return accuracy(logits(str(MODEL)))


@pytest.mark.parametrize(
    "weight_bits,activation_bits",
    [(16, 16), (4, 4), (8, 8), (12, 12), (5, 5), (16, 8), (8, 16), (8, 4), (16, 4)],
)
def test_sample_accuracy_with_default_session_options(float_accuracy, weight_bits, activation_bits):
    result = rewrite_eval(str(MODEL), calibration_data=str(SAMPLES / "calib.npz"), quant=QuantConfig(weight_bits=weight_bits, activation_bits=activation_bits))
    model = ir.serde.serialize_model(result.model)
    default = logits(model)
    assert accuracy(default) >= float_accuracy - 0.01
    plain = logits(model, LEVELS["disable_all"])
    assert accuracy(plain) == accuracy(default)
    if weight_bits == 8 and activation_bits == 8:
        # onnxruntime fuses the layers into int8 kernels: requantization may move a logit by a step
        (step,) = [a["scale"] for a in result.summary["activations"] if a["tensor"] == "logits"]
        np.testing.assert_allclose(default, plain, atol=1.01 * step)
    else:
        np.testing.assert_array_equal(default, plain)


def test_sample_w16a16_biases_are_int32_with_a_coarser_scale():
    result = rewrite_eval(str(MODEL), calibration_data=str(SAMPLES / "calib.npz"), quant=QuantConfig(weight_bits=16, activation_bits=16))
    biases = {b["layer"]: b for b in result.summary["biases"]}
    assert result.summary["counts"]["biases_int32"] == 5
    scaled = [b for b in biases.values() if "scale_factor" in b]
    assert scaled, "the sample's 16-bit conv biases overflow int32 at input_scale * weight_scale"
    for b in scaled:
        f = b["scale_factor"]
        assert f > 1 and f & (f - 1) == 0
        assert b["max_abs_error"] < 1e-6
    assert not any("left in float" in n for n in result.summary["notes"])


def _tiny_conv(x_scale: float, w_scale: float, bias: np.ndarray):
    """x -> Conv(w, bias) -> Relu, with tiny input and weight ranges so the int32 bias overflows."""
    rng = np.random.default_rng(3)
    b = Builder(opset=13)
    x = b.input("x", ["N", 2, 5, 5])
    w = (rng.standard_normal((3, 2, 3, 3)) * w_scale).astype(np.float32)
    conv = b.node("Conv", [x, b.const(w, "w"), b.const(bias.astype(np.float32), "b")], name="c/Conv",
                  kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = b.node("Relu", [conv], name="c/Relu", outputs=["y"])
    feeds = {"x": (rng.standard_normal((4, 2, 5, 5)) * x_scale).astype(np.float32)}
    return b.proto([y]), feeds


def test_overflowing_bias_scale_is_widened_per_channel():
    """A squeeze-excite Conv with a dead channel (weights ~1e-8 beside a bias of -1.4: smp's PAN on timm's
    MobileNetV3, Conv_140) at W16A16: that channel's bias needs a factor of ~2**49 over input_scale *
    weight_scale; the other channels keep factor 1 (one factor for all rounded their biases to 0)."""
    bias = np.array([0.66, -1.38, 2.96])
    rng = np.random.default_rng(5)
    b = Builder(opset=13)
    x = b.input("x", ["N", 4, 1, 1])
    w = (rng.standard_normal((3, 4, 1, 1)) * 0.05).astype(np.float32)
    w[1] *= 1e-7  # a channel the training switched off
    conv = b.node("Conv", [x, b.const(w, "w"), b.const(bias.astype(np.float32), "b")], name="c/Conv",
                  kernel_shape=[1, 1])
    y = b.node("Relu", [conv], name="c/Relu", outputs=["y"])
    feeds = {"x": np.abs(rng.standard_normal((8, 4, 1, 1)) * 10).astype(np.float32)}
    proto = b.proto([y])
    ref = session(proto).run(None, feeds)[0]
    result = rewrite_eval(proto, calibration_data=feeds, quant=QuantConfig(weight_bits=16, activation_bits=16))
    q = result.model.graph.initializers["c/bias_quant/quantized"].const_value.numpy()
    scale = result.model.graph.initializers["c/bias_quant/scale"].const_value.numpy()
    np.testing.assert_allclose(q * scale.astype(np.float64), bias, rtol=1e-6)
    (entry,) = result.summary["biases"]
    assert entry["scale_factor"] >= 2**20
    plain, default = _check_default_matches_disable_all(result.model, feeds)
    np.testing.assert_array_equal(default, plain)
    np.testing.assert_allclose(default, ref, rtol=1e-3, atol=1e-3)


def _check_default_matches_disable_all(model, feeds):
    proto = ir.serde.serialize_model(model)
    plain = session(proto, LEVELS["disable_all"]).run(None, feeds)[0]
    default = session(proto).run(None, feeds)[0]
    return plain, default


def test_overflowing_bias_without_integer_kernels_keeps_its_value():
    bias = np.array([3.0, -2.5, 0.01])
    proto, feeds = _tiny_conv(1.0, 0.3, bias)
    ref = session(proto).run(None, feeds)[0]
    result = rewrite_eval(proto, calibration_data=feeds,
                          quant=QuantConfig(weight_bits=16, activation_bits=16, symmetric_weights=False))
    (entry,) = result.summary["biases"]
    assert entry["scale_factor"] > 1
    model = result.model
    q = model.graph.initializers["c/bias_quant/quantized"].const_value.numpy()
    scale = model.graph.initializers["c/bias_quant/scale"].const_value.numpy()
    assert q.dtype == np.int32
    np.testing.assert_allclose(q * scale.astype(np.float64), bias, rtol=1e-6, atol=1e-9)
    plain, default = _check_default_matches_disable_all(model, feeds)
    np.testing.assert_array_equal(default, plain)
    np.testing.assert_allclose(default, ref, atol=1e-3)


def test_overflowing_bias_with_int8_kernels_widens_those_channels_weight_scales():
    """TFLite's AdjustWeightsForBiasScale: a channel whose bias does not fit int32 at input_scale * weight_scale
    (SINet's first Conv: a batch norm's dead channel, tiny weights, bias 0.26) gets the weight scale that makes it
    fit; its codes are re-encoded on it, the other channel keeps its scale, and the output keeps the bias."""
    bias = np.array([3.0, -2.5, 0.0])
    proto, feeds = _tiny_conv(1e-4, 1e-4, bias)
    ref = session(proto).run(None, feeds)[0]
    result = rewrite_eval(proto, calibration_data=feeds, quant=QuantConfig(weight_bits=8, activation_bits=8))
    (entry,) = result.summary["biases"]
    assert "saturated" not in entry and "scale_factor" not in entry
    assert any("weight scale of 2 channel(s) widened" in n for n in result.summary["notes"])
    (weight,) = [w for w in result.summary["weights"] if w["layers"] == ["c/Conv"]]
    inits = result.model.graph.initializers
    scale = inits[f"{weight['quantizer']}/scale"].const_value.numpy()
    assert scale[0] > 100 * scale[2] and scale[1] > 100 * scale[2]
    q = inits["c/bias_quant/quantized"].const_value.numpy()
    assert np.all(np.abs(q) < np.iinfo(np.int32).max)
    plain, default = _check_default_matches_disable_all(result.model, feeds)
    (step,) = [a["scale"] for a in result.summary["activations"] if a["tensor"] == "y"]
    np.testing.assert_allclose(default, plain, atol=1.01 * step)
    np.testing.assert_allclose(default, ref, atol=1.01 * step)


def test_overflowing_bias_with_int8_kernels_and_per_tensor_weights_saturates_consistently():
    bias = np.array([3.0, -2.5, 0.0])
    proto, feeds = _tiny_conv(1e-4, 1e-4, bias)
    result = rewrite_eval(proto, calibration_data=feeds,
                          quant=QuantConfig(weight_bits=8, activation_bits=8, per_channel=False))
    (entry,) = result.summary["biases"]
    assert entry.get("saturated") == 2 and "scale_factor" not in entry
    assert any("saturated to the int32 range" in n for n in result.summary["notes"])
    q = result.model.graph.initializers["c/bias_quant/quantized"].const_value.numpy()
    assert q[0] == np.iinfo(np.int32).max and q[1] == -np.iinfo(np.int32).max
    plain, default = _check_default_matches_disable_all(result.model, feeds)
    (step,) = [a["scale"] for a in result.summary["activations"] if a["tensor"] == "y"]
    np.testing.assert_allclose(default, plain, atol=1.01 * step)


def test_rewrite_eval_leaves_the_callers_ir_model_alone():
    model = ir.load(str(MODEL))
    before = ir.serde.serialize_model(model).SerializeToString()
    nodes = [n.op_type for n in model.graph]
    result = rewrite_eval(model, calibration_data=str(SAMPLES / "calib.npz"))
    assert result.model is not model
    assert [n.op_type for n in model.graph] == nodes
    assert ir.serde.serialize_model(model).SerializeToString() == before
    assert any(n.op_type == "QuantizeLinear" for n in result.model.graph)
    # the copy shares the caller's tensors (no deep copy of the weights), and gives the same model
    # as rewriting from the path
    from_path = rewrite_eval(str(MODEL), calibration_data=str(SAMPLES / "calib.npz")).model
    assert ir.serde.serialize_model(result.model) == ir.serde.serialize_model(from_path)


def test_a_training_graphs_overflowing_bias_is_widened_as_it_was_trained():
    """A qtool training graph widens such a channel's weight range itself (contract ``widen_weight``), so its eval
    graph widens the same channels, from the trained values, rather than saturating them
    (tests/onnx_rewrite/test_train_bias_widening.py: train == eval)."""
    proto, feeds = _tiny_conv(1e-4, 1e-4, np.array([3.0, -2.5, 0.0]))
    trained = rewrite_train(proto, calibration_data=feeds).model
    result = rewrite_eval(trained)
    assert [e.get("saturated") for e in result.summary["biases"]] == [None]
    assert any("weight range of 2 channel(s) widened" in n for n in result.summary["notes"])