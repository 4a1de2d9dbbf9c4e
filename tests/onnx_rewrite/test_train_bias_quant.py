"""Train == eval: the training graph adds the bias the deployed model adds (issue 13).

``rewrite-eval`` stores a Conv/Gemm bias as int32 on the grid ``input_scale *
weight_scale``; the training graph models that rounding with
``qtool::FakeQuantBias`` on the same grid, and folds its batch norms (after
the freeze) in the float32 operations the eval fold of a training graph uses.
So with the activation ranges held (the training graph's FakeQuant otherwise
uses the range updated with the batch it runs on, TF's ``assign`` outputs)
the training graph computes bit for bit what the deployed model computes.
Before the fix, at W3A3 on the sample, 18% of the top-1 predictions differed.
"""

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from model_builders import Builder
from qtool.api import rewrite_eval, rewrite_train
from qtool.config import QuantConfig, TrainSchedule
from qtool.errors import QtoolError
from qtool.model.io import load_model
from qtool.model.session import session_options, tapped_session, value_map
from qtool.onnx_rewrite.fake_quant_function import BIAS_NAME, DOMAIN
from qtool.onnx_rewrite.train_graph import METADATA_KEY, held_ranges

from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def _contract(model: onnx.ModelProto) -> dict:
    return json.loads({p.key: p.value for p in model.metadata_props}[METADATA_KEY])


def hold_ranges(path: Path, out: Path) -> Path:
    """The training graph with its activation ranges held (EMA decay 0): its FakeQuant nodes use the stored
    ranges, the ones the deployed model was written with."""
    model = onnx.load(str(path))
    held = held_ranges(model)
    decays = [t for t in held.graph.initializer if t.name.endswith("/decay")]
    assert decays and all(not numpy_helper.to_array(t).any() for t in decays)
    assert any(numpy_helper.to_array(t).any() for t in model.graph.initializer if t.name.endswith("/decay"))
    onnx.save(held, str(out))
    return out


@pytest.fixture(scope="module", params=[True, False], ids=["per_channel", "per_tensor"])
def w3a3(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bias")
    train = folder / "qat.onnx"
    deploy = folder / "qat.qdq.onnx"
    rewrite_train(str(SAMPLES / "digits_cnn.onnx"), str(train), calibration_data=str(SAMPLES / "calib.npz"),
                  quant=QuantConfig(weight_bits=3, activation_bits=3, per_channel=request.param),
                  schedule=TrainSchedule(freeze_bn_delay=0))
    rewrite_eval(str(train), str(deploy))
    return train, hold_ranges(train, folder / "held.onnx"), deploy


def _run(path: Path, names: list[str], feeds: dict) -> dict:
    model = load_model(str(path)).model
    values = value_map(model.graph)
    session = tapped_session(model, [values[n] for n in names], options=session_options(optimize=True))
    return {n: o.numpy().copy() for n, o in zip(names, session.run(feeds, names))}


def test_every_int32_bias_is_modelled_in_the_training_graph(w3a3):
    train, _, deploy = w3a3
    model = onnx.load(str(train))
    entries = _contract(model)["bias_quantizers"]
    nodes = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == BIAS_NAME]
    assert len(entries) == len(nodes) == 5  # four folded Conv layers and the Gemm
    deployed = onnx.load(str(deploy))
    int32_biases = {n.name.rsplit("/", 1)[0] for n in deployed.graph.node
                    if n.op_type == "DequantizeLinear" and "/bias_quant/" in n.name}
    assert {q["quantizer"] for q in entries} == int32_biases
    assert {f.name for f in model.functions} == {"FakeQuant", BIAS_NAME}
    assert not any(n.domain == DOMAIN for n in deployed.graph.node)


def test_training_bias_is_the_deployed_int32_bias_bit_for_bit(w3a3):
    _, held, deploy = w3a3
    x = np.load(SAMPLES / "calib.npz")["input"][:16]
    entries = _contract(onnx.load(str(held)))["bias_quantizers"]
    trained = _run(held, [q["output"] for q in entries] + [q["input"] for q in entries],
                   {"input": x, "qtool_step": np.array(1000, np.int64)})
    deployed = _run(deploy, [f"{q['quantizer']}/dequantized" for q in entries], {"input": x})
    moved = 0
    for q in entries:
        t, d = trained[q["output"]].reshape(-1), deployed[f"{q['quantizer']}/dequantized"].reshape(-1)
        assert t.dtype == d.dtype == np.float32
        assert np.array_equal(t.view(np.uint32), d.view(np.uint32)), q["quantizer"]
        moved += int(np.count_nonzero(t != trained[q["input"]].reshape(-1)))
    assert moved > 0  # the float bias is not on the grid: the rounding is really there


def test_training_graph_with_held_ranges_is_the_deployed_model_bit_for_bit(w3a3):
    _, held, deploy = w3a3
    ev = np.load(SAMPLES / "eval.npz")
    x = ev["input"]
    t = _run(held, ["logits"], {"input": x, "qtool_step": np.array(1000, np.int64)})["logits"]
    d = _run(deploy, ["logits"], {"input": x})["logits"]
    assert np.array_equal(t.view(np.uint32), d.view(np.uint32))
    assert np.mean(t.argmax(1) == ev["labels"]) > 0.25  # a classifier (per-tensor W3A3: 34%; chance: 10%)


def test_feeding_range_update_0_is_the_evaluation_mode_onnxruntime_users_get(w3a3):
    """The same, with the graph as written: its ``qtool_range_update`` input (default 1) fed 0 holds the ranges;
    not fed, the ranges move with the evaluated batch (TF's assign outputs) and the logits differ."""
    train, _, deploy = w3a3
    model = onnx.load(str(train))
    assert _contract(model)["range_update_input"] == "qtool_range_update"
    default = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}["qtool_range_update"]
    assert default.shape == () and float(default) == 1.0
    x = np.load(SAMPLES / "eval.npz")["input"]
    step = {"input": x, "qtool_step": np.array(1000, np.int64)}
    held = _run(train, ["logits"], {**step, "qtool_range_update": np.array(0, np.float32)})["logits"]
    moving = _run(train, ["logits"], step)["logits"]
    d = _run(deploy, ["logits"], {"input": x})["logits"]
    assert np.array_equal(held.view(np.uint32), d.view(np.uint32))
    assert not np.array_equal(moving, d)
    deployed = onnx.load(str(deploy))
    assert "qtool_range_update" not in {v.name for v in deployed.graph.input} | {t.name for t in deployed.graph.initializer}


def test_a_contract_naming_a_missing_bias_quantizer_is_refused(w3a3, tmp_path):
    train, _, _ = w3a3
    model = onnx.load(str(train))
    contract = _contract(model)
    contract["bias_quantizers"][0]["output"] = "no/such/tensor"
    for p in model.metadata_props:
        if p.key == METADATA_KEY:
            p.value = json.dumps(contract)
    forged = tmp_path / "forged.onnx"
    onnx.save(model, str(forged))
    with pytest.raises(QtoolError, match="no/such/tensor"):
        rewrite_eval(str(forged), str(tmp_path / "out.onnx"))


def _tiny_model():
    """Every bias the eval graph stores as int32: a folded Conv, a grouped ConvTranspose with its own bias,
    a folded depthwise Conv without one, a Gemm (transB=0), a MatMul with a bias Add ([1, N]), a MatMul
    folded with a batch norm."""
    b = Builder(opset=13)
    x = b.input("x", ["N", 4, 6, 6])
    y = b.node("Relu", [b.bn(b.conv(x, 4, 8, name="c1"), 8, name="bn1")])
    y = b.node("Relu", [b.conv_transpose(y, 8, 8, group=2, name="ct")])
    y = b.node("Relu", [b.bn(b.conv(y, 8, 8, group=8, bias=False, name="dw"), 8, name="bn2")])
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])])
    y = b.node("Relu", [b.gemm(y, 8, 6, trans_b=0, name="g1")])
    w = b.const((np.random.default_rng(3).standard_normal((6, 7)) * 0.3).astype(np.float32))
    y = b.node("MatMul", [y, w], name="mm")
    y = b.node("Relu", [b.node("Add", [y, b.const((np.arange(7, dtype=np.float32) * 0.03 - 0.1)[None, :])])])
    y = b.bn(b.matmul(y, 7, 5, name="mm2"), 5, name="bn3")
    b.output(y)
    return b.proto(), y


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_every_bias_layout_deploys_as_trained_at_every_optimization_level(bits, tmp_path, monkeypatch):
    import model_builders
    import onnxruntime as ort

    # weights of their own: with the shared generator they depended on the tests run before, and some
    # draws put an 8-bit activation exactly on a tie, which the training graph rounds half up (TF) and
    # QuantizeLinear half to even (docs/finetune.md, known gaps)
    monkeypatch.setattr(model_builders, "RNG", np.random.default_rng(7))
    proto, out = _tiny_model()
    onnx.save(proto, str(tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal((64, 4, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    rewrite_train(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), calibration_data=str(tmp_path / "calib.npz"),
                  quant=QuantConfig(weight_bits=bits, activation_bits=bits), schedule=TrainSchedule(freeze_bn_delay=0))
    rewrite_eval(str(tmp_path / "q.onnx"), str(tmp_path / "q.qdq.onnx"))
    layers = {q["layer"] for q in _contract(onnx.load(str(tmp_path / "q.onnx")))["bias_quantizers"]}
    assert layers == {"c1", "ct", "dw", "g1", "mm", "mm2"}
    held = hold_ranges(tmp_path / "q.onnx", tmp_path / "held.onnx")
    t = _run(held, [out], {"x": x, "qtool_step": np.array(100, np.int64)})[out]
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = level
        session = ort.InferenceSession(str(tmp_path / "q.qdq.onnx"), options, providers=["CPUExecutionProvider"])
        d = session.run([out], {"x": x})[0]
        assert np.array_equal(t.view(np.uint32), d.view(np.uint32)), level
