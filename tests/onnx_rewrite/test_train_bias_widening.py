"""A training graph widens a weight range for a bias that does not fit int32, as ``rewrite-eval`` of the float model
does (TFLite's AdjustWeightsForBiasScale), and ``rewrite-eval`` of the training graph widens it the same way.

SINet's first Conv has a batch norm's dead channel (tiny weights, gamma -5e-5, folded bias 0.26) whose bias code at
``input_scale * weight_scale`` is far beyond int32. PTQ widened that channel's weight scale; the training graph's
``FakeQuantBias`` saturated the bias to ~1e-4 and the deployed model kept the saturation (train == eval): person IoU
79.1% after QAT against 83.9% for PTQ. ``model_builders.dead_channel_model`` is that stem in small.
"""

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import qtool.onnx_rewrite.train_rewrite as train_rewrite
from model_builders import DEAD_BIAS, DEAD_CHANNEL, dead_channel_model
from qtool.api import rewrite_eval, rewrite_train
from qtool.config import QuantConfig, TrainSchedule
from qtool.errors import QtoolError
from qtool.model.codec import bias_fit_factor, bias_fit_range
from qtool.onnx_rewrite.train_graph import METADATA_KEY

from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
INT32_MAX = np.iinfo(np.int32).max


def _contract(model: onnx.ModelProto) -> dict:
    return json.loads({p.key: p.value for p in model.metadata_props}[METADATA_KEY])


def _proto(model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model) if isinstance(model, ir.Model) else model


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"])


def _held(model, feeds: dict, step: int = 10) -> list[np.ndarray]:
    """The training graph evaluated with its ranges held (``qtool_range_update`` 0): what it deploys as."""
    return _session(model).run(["h", "y"], {**feeds, "qtool_step": np.array(step, np.int64),
                                            "qtool_range_update": np.array(0, np.float32)})


def _initializers(model) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in _proto(model).graph.initializer}


def _train(feeds, **quant) -> onnx.ModelProto:
    proto, _ = dead_channel_model()
    return _proto(rewrite_train(proto, calibration_data=feeds, quant=QuantConfig(**quant),
                                schedule=TrainSchedule(freeze_bn_delay=0)).model)


@pytest.fixture(scope="module")
def dead():
    return dead_channel_model()


def test_only_the_layer_whose_bias_overflows_gets_the_widening(dead):
    proto, feeds = dead
    result = rewrite_train(proto, calibration_data=feeds, schedule=TrainSchedule(freeze_bn_delay=0))
    assert [n for n in result.summary["notes"] if n.startswith("weight range widened every step")] == [
        "weight range widened every step so that the bias fits int32 (a channel of tiny weights beside a large "
        "bias, as rewrite-eval widens it): c1"]
    train = _proto(result.model)
    entries = {q["layer"]: q for q in _contract(train)["bias_quantizers"]}
    assert set(entries) == {"c1", "c2"}
    assert entries["c1"].get("widen_weight") is True
    assert "widen_weight" not in entries["c2"]  # its bias codes are far from int32's limit: no node added
    widening = [n for n in train.graph.node if "/weight_widening/" in n.name]
    assert widening and all(n.name.startswith("c1/bias_quant/weight_widening/") for n in widening)
    (fq,) = [n for n in train.graph.node if n.op_type == "FakeQuant" and n.name.startswith("c1/weights_quant/")]
    assert fq.input[1].startswith("c1/bias_quant/weight_widening/") and fq.input[2].startswith(
        "c1/bias_quant/weight_widening/")


def test_the_training_graph_adds_the_dead_channels_bias_and_deploys_it(dead):
    """Before: the training graph's bias of the dead channel saturated to ~1e-4 and the deployed model's Relu gave
    0 for that channel where the float model gives 0.26; now both keep it, as PTQ does."""
    proto, feeds = dead
    h_float = _session(proto).run(["h"], feeds)[0]
    np.testing.assert_allclose(h_float[:, DEAD_CHANNEL], DEAD_BIAS, rtol=1e-6)
    train = _train(feeds)
    result = rewrite_eval(train)
    assert any("widened so that their bias fits int32" in n and "as the training graph" in n
               for n in result.summary["notes"])
    assert not any(b.get("saturated") for b in result.summary["biases"])
    (step,) = [a["scale"] for a in result.summary["activations"] if a["tensor"] == "h"]
    held = _held(train, feeds)[0]
    deployed = _session(result.model).run(["h"], feeds)[0]
    ptq = _session(rewrite_eval(proto, calibration_data=feeds).model).run(["h"], feeds)[0]
    for h in (held, deployed, ptq):
        np.testing.assert_allclose(h[:, DEAD_CHANNEL], DEAD_BIAS, atol=0.5 * step + 1e-6)
    assert np.max(np.abs(deployed - h_float)) <= np.max(np.abs(ptq - h_float)) + 1.01 * step


@pytest.mark.parametrize("round_mode", ["half_to_even", "half_up"])
def test_train_equals_eval_with_a_widened_weight(dead, round_mode):
    """The held training graph computes what the deployed model computes: bit for bit when the graph rounds as
    QuantizeLinear (half to even), within one step of an exact activation tie otherwise (docs/finetune.md)."""
    _, feeds = dead
    train = _train(feeds, round_mode=round_mode)
    deployed = rewrite_eval(train).model
    trained, out = _held(train, feeds), _session(deployed).run(["h", "y"], feeds)
    if round_mode == "half_to_even":
        for t, d in zip(trained, out):
            assert np.array_equal(t.view(np.uint32), d.view(np.uint32))
    else:
        for t, d in zip(trained, out):
            levels = np.unique(np.abs(np.diff(np.unique(t))))
            assert np.count_nonzero(t != d) <= 0.01 * t.size
            np.testing.assert_allclose(t, d, atol=1.01 * levels[levels > 0].min())


def test_the_deployed_weight_and_bias_are_the_training_graphs(dead):
    """The training graph's weight FakeQuant range, its bias scale and quantized bias, against the deployed
    initializers: the dead channel's weight scale is |b| / (input_scale * (2**31 - 1)) and a little more, the
    others' are their own, the int32 codes fit."""
    _, feeds = dead
    train = _train(feeds, round_mode="half_to_even")
    deployed = _proto(rewrite_eval(train).model)
    inits = _initializers(deployed)
    names = ["c1/bias_quant/weight_widening/min", "c1/bias_quant/weight_widening/max", "c1/bias_quant/input_scale",
             "c1/bias_quant/FakeQuantBias", "c1/bias_quant/scale"]
    model = onnx.load_from_string(train.SerializeToString())
    model.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    lo, hi, s_in, bias, b_scale = _session(model).run(names, {**feeds, "qtool_step": np.array(10, np.int64),
                                                              "qtool_range_update": np.array(0, np.float32)})
    w_scale = inits["c1/weights_quant/scale"]
    np.testing.assert_array_equal(w_scale, ((hi - lo) / np.float32(254)).reshape(-1))
    np.testing.assert_array_equal(inits["c1/bias_quant/scale"], b_scale)
    np.testing.assert_array_equal(inits["c1/bias_quant/quantized"].astype(np.float32) * b_scale, bias)
    codes = inits["c1/bias_quant/quantized"].astype(np.int64)
    assert np.all(np.abs(codes) < INT32_MAX)
    assert abs(codes[DEAD_CHANNEL]) > 2**30  # the widening is just enough
    need = DEAD_BIAS / (float(s_in) * INT32_MAX)
    assert need < w_scale[DEAD_CHANNEL] < need * (1 + 2.0**-14)
    # the other channels keep the range of their weights
    w = _initializers(train)["c1.weight"] * (np.array([1.1, -5e-5, 0.9, 1.2], np.float32) / np.sqrt(
        np.array([1.5, 3e-11, 0.8, 2.0], np.float32) + np.float32(1e-3)))[:, None, None, None]
    live = [c for c in range(4) if c != DEAD_CHANNEL]
    np.testing.assert_allclose(w_scale[live], np.abs(w[live]).reshape(3, -1).max(1) / 127, rtol=1e-6)


def test_the_widening_follows_the_trained_values(dead):
    """rewrite-eval recomputes the widening from the graph's trained bias and input range (a tuned file), not from
    the values it was written with: train == eval after both move."""
    _, feeds = dead
    train = _train(feeds, round_mode="half_to_even")
    for t in train.graph.initializer:
        a = numpy_helper.to_array(t)
        if t.name == "bn1.bias":
            a = a.copy()
            a[DEAD_CHANNEL] *= 3
        elif t.name == "x/input_quant/max":
            a = a * np.float32(1.7)
        else:
            continue
        t.CopyFrom(numpy_helper.from_array(a.astype(np.float32), t.name))
    deployed = rewrite_eval(train).model
    for t, d in zip(_held(train, feeds), _session(deployed).run(["h", "y"], feeds)):
        assert np.array_equal(t.view(np.uint32), d.view(np.uint32))
    np.testing.assert_allclose(_held(train, feeds)[0][:, DEAD_CHANNEL], 3 * DEAD_BIAS, atol=0.02)


def test_the_widening_waits_for_the_quant_delay(dead):
    """During the quant delay the graph runs the float weight and bias; after it, the widened weight."""
    proto, feeds = dead
    train = _proto(rewrite_train(proto, calibration_data=feeds, quant=QuantConfig(round_mode="half_to_even"),
                                 schedule=TrainSchedule(quant_delay=5, freeze_bn_delay=0)).model)
    h_float = _session(proto).run(["h"], feeds)[0]
    before, after = _held(train, feeds, step=2)[0], _held(train, feeds, step=5)[0]
    np.testing.assert_allclose(before, h_float, rtol=1e-5, atol=1e-6)
    deployed = _session(rewrite_eval(train).model).run(["h"], feeds)[0]
    assert np.array_equal(after.view(np.uint32), deployed.view(np.uint32))


def test_a_graph_written_without_the_widening_still_deploys_saturated(dead, monkeypatch):
    """A training graph whose contract has no ``widen_weight`` (written before it, or whose bias was far from the
    limit when written) trained with a saturated bias: its eval graph saturates too (train == eval)."""
    _, feeds = dead
    monkeypatch.setattr(train_rewrite, "WIDEN_CODE_LIMIT", np.inf)
    train = _train(feeds, round_mode="half_to_even")
    assert not any("widen_weight" in q for q in _contract(train)["bias_quantizers"])
    assert not any("/weight_widening/" in n.name for n in train.graph.node)
    result = rewrite_eval(train)
    assert [b.get("saturated") for b in result.summary["biases"] if b["layer"] == "c1"] == [1]
    assert not any("widened" in n for n in result.summary["notes"])
    for t, d in zip(_held(train, feeds), _session(result.model).run(["h", "y"], feeds)):
        assert np.array_equal(t.view(np.uint32), d.view(np.uint32))
    assert np.all(_held(train, feeds)[0][:, DEAD_CHANNEL] < 0.01)  # the saturated bias: the channel is lost


def test_the_sample_gets_no_widening():
    """The sample's biases are far from int32's limit: its training graph has no widening node, and its contract
    says nothing new (graphs of models without overflowing biases are written as before)."""
    train = _proto(rewrite_train(str(SAMPLES / "digits_cnn.onnx"), calibration_data=str(SAMPLES / "calib.npz")).model)
    assert not any("/weight_widening/" in n.name for n in train.graph.node)
    assert _contract(train)["bias_quantizers"] and not any("widen_weight" in q
                                                           for q in _contract(train)["bias_quantizers"])


def test_a_garbled_widen_weight_is_refused(dead, tmp_path):
    _, feeds = dead
    train = _train(feeds)
    contract = _contract(train)
    contract["bias_quantizers"][0]["widen_weight"] = "yes"
    for p in train.metadata_props:
        if p.key == METADATA_KEY:
            p.value = json.dumps(contract)
    onnx.save(train, str(tmp_path / "forged.onnx"))
    with pytest.raises(QtoolError, match="widen_weight"):
        rewrite_eval(str(tmp_path / "forged.onnx"), str(tmp_path / "out.onnx"))


def test_bias_fit_range_is_the_graphs_arithmetic():
    """``codec.bias_fit_range`` widens only the channels that need it, to a scale just above the limit."""
    lo = np.array([-0.5, -1e-12, -0.2], np.float32)
    hi = -lo
    b = np.array([0.1, 0.26, -3.0], np.float32)
    s_in = np.float32(0.02)
    new_lo, new_hi = bias_fit_range(lo, hi, b, s_in, 8)
    np.testing.assert_array_equal(new_lo[[0, 2]], lo[[0, 2]])
    np.testing.assert_array_equal(new_hi[[0, 2]], hi[[0, 2]])
    half = np.float32(np.float32(np.float32(0.26) / s_in) * bias_fit_factor(8))
    assert new_hi[1] == half and new_lo[1] == -half
    scale = (new_hi[1] - new_lo[1]) / np.float32(254)
    assert INT32_MAX / (1 + 2.0**-15) < 0.26 / (float(s_in) * float(scale)) < INT32_MAX


def _shared_weight_model():
    """x -> Conv(w, a) -> Relu -> Conv(w, b) -> y: one weight read by two layers (PyTorch's reuse of a module), whose
    channel 1 is dead, with a bias of 0.26 there in both."""
    from model_builders import Builder

    rng = np.random.default_rng(4)
    b = Builder(opset=13)
    x = b.input("x", ["N", 3, 6, 6])
    w = (rng.standard_normal((3, 3, 3, 3)) * 0.3).astype(np.float32)
    w[1] *= 1e-8
    w_name = b.const(w, "w")
    h = b.node("Relu", [b.node("Conv", [x, w_name, b.const(np.array([0.1, DEAD_BIAS, -0.1], np.float32), "a")],
                               name="first", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], name="act", outputs=["h"])
    b.node("Conv", [h, w_name, b.const(np.array([0.05, DEAD_BIAS, 0.02], np.float32), "b")], name="second",
           kernel_shape=[3, 3], pads=[1, 1, 1, 1], outputs=["y"])
    return b.proto(["h", "y"]), {"x": rng.standard_normal((8, 3, 6, 6)).astype(np.float32)}


def test_a_weight_shared_by_two_layers_is_not_widened():
    """The second layer's input scale depends on the shared weight (through the first layer): widening that weight
    for the second bias would be a cycle (the graph could not be sorted). Such a weight is not widened, its biases
    saturate, and the eval graph does the same: train == eval."""
    proto, feeds = _shared_weight_model()
    train = _proto(rewrite_train(proto, calibration_data=feeds, quant=QuantConfig(round_mode="half_to_even"),
                                 schedule=TrainSchedule(freeze_bn_delay=0)).model)
    assert [q.get("widen_weight", False) for q in _contract(train)["bias_quantizers"]] == [False, False]
    result = rewrite_eval(train)
    assert [b.get("saturated") for b in result.summary["biases"]] == [1, 1]
    trained = _session(train).run(["h", "y"], {**feeds, "qtool_step": np.array(10, np.int64),
                                               "qtool_range_update": np.array(0, np.float32)})
    for t, d in zip(trained, _session(result.model).run(["h", "y"], feeds)):
        assert np.array_equal(t.view(np.uint32), d.view(np.uint32))


@pytest.mark.parametrize("quant", [dict(symmetric_weights=False), dict(weight_bits=6, activation_bits=8)],
                         ids=["asymmetric_weights", "w6a8"])
def test_train_equals_eval_with_a_widened_weight_on_other_grids(dead, quant):
    """Asymmetric weights (zero points) and a 6-bit weight grid widen the same way in both graphs."""
    _, feeds = dead
    train = _train(feeds, round_mode="half_to_even", **quant)
    assert [q["layer"] for q in _contract(train)["bias_quantizers"] if q.get("widen_weight")] == ["c1"]
    result = rewrite_eval(train)
    assert not any(b.get("saturated") for b in result.summary["biases"])
    trained = _held(train, feeds)
    for t, d in zip(trained, _session(result.model).run(["h", "y"], feeds)):
        assert np.array_equal(t.view(np.uint32), d.view(np.uint32))
    (step,) = [a["scale"] for a in result.summary["activations"] if a["tensor"] == "h"]
    np.testing.assert_allclose(trained[0][:, DEAD_CHANNEL], DEAD_BIAS, atol=0.5 * step + 1e-6)
