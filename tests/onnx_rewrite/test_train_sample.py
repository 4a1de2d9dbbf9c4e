"""rewrite-train on the sample model (opset 11, Constant-node weights, unnamed nodes, dynamic batch),
and the train -> eval round trip."""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qtool.api import rewrite_eval
from qtool.onnx_rewrite.fake_quant_function import DOMAIN
from qtool.api import rewrite_train
from qtool.config import TrainSchedule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "samples", "digits_cnn.onnx")
CALIB = os.path.join(ROOT, "samples", "calib.npz")
EVAL = os.path.join(ROOT, "samples", "eval.npz")


def session(path_or_model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    data = path_or_model if isinstance(path_or_model, str) else path_or_model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def accuracy(path_or_model, feeds=None) -> float:
    ev = np.load(EVAL)
    logits = session(path_or_model).run(["logits"], {"input": ev["input"], **(feeds or {})})[0]
    return float(np.mean(np.argmax(logits, axis=1) == ev["labels"]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The sample's training graph, stepped 20 times over the calibration data (both delays crossed)."""
    folder = tmp_path_factory.mktemp("train")
    path = str(folder / "digits.qat.onnx")
    result = rewrite_train(SAMPLE, path, calibration_data=CALIB, schedule=TrainSchedule(quant_delay=5, freeze_bn_delay=10))
    model = onnx.load(path)
    contract = json.loads({p.key: p.value for p in model.metadata_props}["qtool.training"])
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    state = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name in contract["state"]}
    history = {}
    data = np.load(CALIB)["input"]
    for step in range(20):
        batch = data[(step * 20) % 100:][:20]
        res = dict(zip(names, sess.run(None, {"input": batch, "qtool_step": np.array(step, np.int64), **state})))
        history[step] = res
        state = {k: res[v] for k, v in contract["state"].items()}
    for t in model.graph.initializer:
        if t.name in state:
            t.CopyFrom(numpy_helper.from_array(state[t.name], t.name))
    trained_path = str(folder / "digits.qat.trained.onnx")
    onnx.save(model, trained_path)
    return {"result": result, "path": path, "model": model, "contract": contract, "history": history,
            "state": state, "trained_path": trained_path, "folder": folder}


def test_sample_training_graph_is_valid_and_complete(trained):
    model = onnx.load(trained["path"])
    onnx.checker.check_model(model, full_check=True)
    summary = trained["result"].summary
    assert summary["opset"] == {"input": 11, "output": 13}
    assert summary["counts"]["batch_norms_folded"] == 4
    assert summary["counts"]["layers_quantized"] == 5
    assert summary["counts"]["activations_quantized"] == 10
    assert {a["range_source"] for a in summary["activations"]} == {"calibration", "carried"}
    assert not any(n.op_type in ("BatchNormalization", "Constant") and n.output[0].startswith("bn") for n in model.graph.node)
    assert sum(1 for n in model.graph.node if n.domain == DOMAIN) == 20  # 5 weights, 10 activations, 5 biases
    c = trained["contract"]
    assert c["step_input"] == "qtool_step" and c["quant_delay"] == 5 and c["freeze_bn_delay"] == 10
    assert len(c["state"]) == 2 * 4 + 2 * 8  # 4 BNs, 8 activation ranges (carried quantizers share theirs)
    assert {i.name for i in model.graph.input} >= set(c["state"]) | set(c["parameters"]) | {"input", "qtool_step"}
    assert {o.name for o in model.graph.output} == {"logits"} | set(c["state"].values())
    assert "conv1.weight" in c["parameters"] and "bn1.weight" in c["parameters"]


def test_sample_runs_on_both_sides_of_both_delays(trained):
    history, c = trained["history"], trained["contract"]
    for step in (0, 4, 5, 9, 10, 19):
        assert np.all(np.isfinite(history[step]["logits"])) and history[step]["logits"].shape == (20, 10)
    mean = next(k for k in c["state"] if k.endswith("moving_mean"))
    upd = c["state"][mean]
    assert not np.array_equal(history[8][upd], history[9][upd])  # updating before freeze_bn_delay
    assert history[10][upd].tobytes() == history[19][upd].tobytes()  # fixed from the freeze on
    act = next(k for k in c["state"] if k.endswith("act_quant/max"))
    assert not np.array_equal(history[12][c["state"][act]], history[13][c["state"][act]])  # EMA keeps moving


def test_sample_qat_graph_accuracy_is_the_float_accuracy(trained):
    float_acc = accuracy(SAMPLE)
    state = trained["state"]
    qat = accuracy(trained["trained_path"], {"qtool_step": np.array(20, np.int64), **state})
    assert abs(qat - float_acc) <= 0.01


def test_train_then_eval_round_trip_keeps_accuracy_within_one_point(trained):
    out = str(trained["folder"] / "digits.qdq.onnx")
    result = rewrite_eval(trained["trained_path"], out)
    assert result.summary["ranges_from"] == "the training graph's trained state"
    assert not result.warnings
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert not model.functions and not any(n.domain == DOMAIN for n in model.graph.node)
    assert all(p.key != "qtool.training" for p in model.metadata_props)
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["logits"]
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)
    # activation ranges are the trained state
    acts = {a["tensor"]: a for a in result.summary["activations"]}
    c = trained["contract"]
    for q in c["activation_quantizers"]:
        lo, hi = float(trained["state"][q["min"]]), float(trained["state"][q["max"]])
        matching = [a for a in acts.values() if a["range"] == [lo, hi]]
        assert matching, q["tensor"]
    float_acc = accuracy(SAMPLE)
    assert abs(accuracy(out) - float_acc) <= 0.01


def test_eval_of_an_untrained_training_graph_uses_its_initial_ranges(trained):
    result = rewrite_eval(trained["path"])
    ranges = sorted(tuple(a["range"]) for a in result.summary["activations"])
    initial = sorted(tuple(q["initial_range"]) for q in trained["contract"]["activation_quantizers"])
    assert ranges == initial
