"""``--round-mode``: the training graph rounds as TF (half_up) or as the deployed QuantizeLinear (half_to_even).

A small MatMul model whose input range is [-1, 1] (calibrated) is fed values exactly halfway between two
levels of its input grid, and its weight holds exact ties of its per-channel grids. With ``half_to_even``
the training graph (its ranges held) computes the deployed model's values bit for bit, its weight
FakeQuant included; with ``half_up`` it computes TensorFlow's FakeQuant, which differs on ties. The same
holds for the integer HardSwish/HardSigmoid gates, fed on the ties of their grids.
"""

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from model_builders import RNG, gate_calibration, gate_inputs, gate_model
from onnx import TensorProto, helper, numpy_helper

from qtool.api import rewrite_eval, rewrite_train
from qtool.config import QuantConfig
from qtool.errors import QtoolError
from qtool.kernels import fake_quant_with_min_max_vars, nudged_range, quantize_codes
from qtool.onnx_rewrite.fake_quant_function import DOMAIN, NAME, fake_quant_model
from qtool.onnx_rewrite.train_graph import METADATA_KEY

K, N = 8, 6


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _ties(scale: np.float32, levels: range) -> np.ndarray:
    """Values whose float32 quotient by ``scale`` is exactly k + 0.5 (QuantizeLinear's ties)."""
    k = np.arange(levels.start, levels.stop, dtype=np.float32) + np.float32(0.5)
    t = (k * scale).astype(np.float32)
    return t[t / scale == k]


def _model() -> onnx.ModelProto:
    """x [B, 8] -> MatMul(W [8, 6]) -> y; each weight column has its largest |w| first, then exact ties of
    the symmetric narrow grid that largest value sets."""
    w = (RNG.standard_normal((K, N)) * 0.3).astype(np.float32)
    for c in range(N):
        a = np.float32(np.max(np.abs(w[:, c])) + 0.05)
        scale = nudged_range(-a, a, num_bits=8, narrow_range=True)[2]
        ties = _ties(np.float32(scale), range(-120, 120))
        w[:, c] = np.concatenate([[a], RNG.choice(ties, K - 1)])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="fc/MatMul")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", N])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _calibration() -> dict:
    x = RNG.uniform(-1, 1, (32, K)).astype(np.float32)
    x[0, 0], x[0, 1] = -1.0, 1.0  # the input range is exactly [-1, 1]
    return {"x": x}


def _tie_inputs() -> np.ndarray:
    scale = np.float32(nudged_range(np.float32(-1), np.float32(1), num_bits=8)[2])
    ties = _ties(scale, range(-127, 127))
    assert len(ties) > 100
    return np.resize(ties, (len(ties) // K, K)).astype(np.float32)


def _session(model: onnx.ModelProto, taps: list[str]) -> ort.InferenceSession:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in taps if t not in known)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # Q/DQ as written
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _contract(model: onnx.ModelProto) -> dict:
    return json.loads({p.key: p.value for p in model.metadata_props}[METADATA_KEY])


@pytest.fixture(scope="module", params=["half_up", "half_to_even"])
def graphs(request):
    mode = request.param
    trained = rewrite_train(_model(), quant=QuantConfig(round_mode=mode), calibration_data=_calibration())
    train = _proto(trained.model)
    deployed = rewrite_eval(train)
    return mode, train, _proto(deployed.model), deployed


def _proto(model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def _tensors(train: onnx.ModelProto, deploy: onnx.ModelProto, x: np.ndarray) -> dict:
    """The input quantizer's, the weight quantizer's and the output values of both graphs on ``x``."""
    contract = _contract(train)
    x_train = next(q["output"] for q in contract["activation_quantizers"] if q["tensor"] == "x")
    w_train = contract["weight_quantizers"][0]["output"]
    x_deploy = next(n.output[0] for n in deploy.graph.node if n.op_type == "DequantizeLinear" and "x" in n.name)
    w_deploy = next(n.output[0] for n in deploy.graph.node if n.op_type == "DequantizeLinear" and "/weights_quant/" in n.name)
    feeds = {"x": x, "qtool_step": np.array(10**6, np.int64), "qtool_range_update": np.array(0, np.float32)}
    t = _session(train, [x_train, w_train]).run(["y", x_train, w_train], feeds)
    d = _session(deploy, [x_deploy, w_deploy]).run(["y", x_deploy, w_deploy], {"x": x})
    return {"train": dict(zip(("y", "x", "w"), t)), "deploy": dict(zip(("y", "x", "w"), d))}


def test_half_to_even_training_graph_is_the_deployed_model_bit_for_bit_on_ties(graphs):
    mode, train, deploy, _ = graphs
    v = _tensors(train, deploy, _tie_inputs())
    same = {k: np.array_equal(_bits(v["train"][k]), _bits(v["deploy"][k])) for k in ("x", "w", "y")}
    if mode == "half_to_even":
        assert same == {"x": True, "w": True, "y": True}
    else:  # TF's half up: the input's ties round up in training, to even when deployed
        assert not same["x"] and not same["y"]
        assert same["w"]  # weights are quantized offline in the training graph's mode: always equal


def test_half_up_is_tensorflows_fake_quant_and_half_to_even_is_quantize_linear(graphs):
    mode, train, deploy, _ = graphs
    x = _tie_inputs()
    got = _tensors(train, deploy, x)["train"]["x"]
    tf = fake_quant_with_min_max_vars(x, -1.0, 1.0)
    _, _, scale, zp = nudged_range(np.float32(-1), np.float32(1), num_bits=8)
    levels = np.clip(np.rint(x / scale), -zp, 255 - zp) + np.float32(0.0)  # DequantizeLinear's +0.0
    quantize_linear = (levels * scale).astype(np.float32)
    want = tf if mode == "half_up" else quantize_linear
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert np.count_nonzero(tf != quantize_linear) > len(x.ravel()) // 4  # the ties really differ


def test_the_mode_is_in_the_contract_on_every_fake_quant_and_deploys_with_it(graphs):
    mode, train, _, deployed = graphs
    assert _contract(train)["options"]["round_mode"] == mode
    nodes = [n for n in train.graph.node if n.domain == DOMAIN and n.op_type == NAME]
    flags = {next((a.i for a in n.attribute if a.name == "half_to_even"), 0) for n in nodes}
    assert flags == {int(mode == "half_to_even")}
    assert deployed.prepared.config.round_mode == mode
    note = [m for m in deployed.notes if "QuantizeLinear rounds activations half to even" in m]
    assert bool(note) == (mode == "half_up")  # half_to_even: the deployed model rounds as trained
    assert not deployed.warnings


def test_deploying_in_another_round_mode_than_trained_warns(graphs):
    mode, train, _, _ = graphs
    other = "half_to_even" if mode == "half_up" else None
    if other is None:  # asking for the default keeps the recorded mode (as for the other options)
        assert rewrite_eval(train, quant=QuantConfig(round_mode="half_up")).prepared.config.round_mode == mode
        return
    result = rewrite_eval(train, quant=QuantConfig(round_mode=other))
    assert any("round_mode=half_up" in w and "round_mode=half_to_even" in w for w in result.warnings)


def test_a_bad_round_mode_is_refused():
    with pytest.raises(QtoolError, match="round mode must be one of half_up, half_to_even"):
        QuantConfig(round_mode="HALF_UP")


@pytest.mark.parametrize("narrow", [False, True])
def test_fake_quant_half_to_even_is_quantize_then_dequantize_linear(narrow):
    """The function body with half_to_even=1 against onnxruntime's QuantizeLinear -> DequantizeLinear on the
    same grid (scale, zero point), per tensor and per channel, ties and random values."""
    lo, hi = np.float32([-0.9, -2.3, 0.0]), np.float32([1.7, 0.4, 0.0])  # the last channel is [0, 0]
    _, _, scale, zp = nudged_range(lo, hi, num_bits=8, narrow_range=narrow)
    x = np.stack([np.concatenate([_ties(np.float32(s or 1), range(-200, 200))[:300],
                                  RNG.uniform(-3, 3, 300).astype(np.float32)])[:500] for s in scale])  # [C, 500]
    fq = fake_quant_model([3, 500], [3, 1], num_bits=8, narrow_range=narrow, half_to_even=True)
    y = _session(fq, []).run(None, {"x": x, "min": lo.reshape(3, 1), "max": hi.reshape(3, 1)})[0]
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=0)
    dq = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=0)
    s = np.where(scale == 0, 1, scale).astype(np.float32)  # the eval graph's scale for a [0, 0] range
    graph = helper.make_graph([q, dq], "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 500])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 500])],
                              [numpy_helper.from_array(s, "s"), numpy_helper.from_array(zp.astype(np.uint8), "z")])
    qdq = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    qdq.ir_version = 8
    want = _session(qdq, []).run(None, {"x": x})[0]
    if narrow:  # TF's narrow grid starts at 1: QuantizeLinear's uint8 would give 0, the FakeQuant clamps
        codes = quantize_codes(x.T.copy(), lo, hi, 8, True, axis=1, round_mode="HALF_TO_EVEN").T
        want = ((codes - zp[:, None]) * s[:, None]).astype(np.float32)
    want[2] = 0.0
    np.testing.assert_array_equal(_bits(y), _bits(want))


# --- the integer HardSigmoid gate ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gate_graphs():
    train = _proto(rewrite_train(gate_model(), quant=QuantConfig(round_mode="half_to_even"),
                                 calibration_data=gate_calibration()).model)
    deployed = rewrite_eval(train)
    return train, _proto(deployed.model), deployed


def test_half_to_even_integer_gates_are_the_deployed_ones_bit_for_bit_on_ties(gate_graphs):
    """HardSwish and HardSigmoid deploy as integer Adds (``(y + beta/alpha)`` quantized with scale s/alpha,
    read back with s); the training graph computes them in the same float32 operations, so every
    quantizer's output (the gates, their product) and the logits are the deployed model's bit for bit,
    with the gate inputs on or next to ties of the gate's grid."""
    train, deploy, deployed = gate_graphs
    assert deployed.summary["counts"]["hard_sigmoids_integer"] == 2
    x = gate_inputs()  # y = x: the Conv's weight is exactly 1, and it has no bias
    quotient = (x + np.float32(3)) / (np.float32(np.float32(1) / np.float32(255)) / np.float32(1 / 6))
    assert np.count_nonzero(quotient - np.floor(quotient) == np.float32(0.5)) > 50  # exact ties of the gate
    quantizers = _contract(train)["activation_quantizers"]
    assert sum(q["kind"] == "gate_quant" for q in quantizers) == 2
    outputs = {o.name for o in deploy.graph.output}
    ours = [q["output"] for q in quantizers]
    theirs = [q["tensor"] if q["tensor"] in outputs else f"{q['quantizer']}/dequantized" for q in quantizers]
    feeds = {"x": x, "qtool_step": np.array(10**6, np.int64), "qtool_range_update": np.array(0, np.float32)}
    want = _session(train, ours).run(ours, feeds)
    got = _session(deploy, theirs).run(theirs, {"x": x})
    # HardSigmoid(y) fake-quantized on [0, 1] instead: 86 and 18 of the 256 gate values differed
    differ = {t: int(np.count_nonzero(_bits(w) != _bits(g))) for t, w, g in zip(ours, want, got)}
    assert not any(differ.values()), differ
