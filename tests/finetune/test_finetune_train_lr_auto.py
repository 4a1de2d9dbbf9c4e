"""``learning_rate="auto"``: probes of each candidate rate from the same start, the schedule at the best one, or
no training when every rate makes the model worse. The sample at W3A3 on the shapes of ``test_finetune_train``
(its compiled programs are in the session's compilation cache)."""

import json

import numpy as np
import onnx
import pytest
from finetune_helpers import CALIB, EVAL

from qtool.cli import main
from qtool.errors import QtoolError
from qtool.finetune.config import LEARNING_RATE_CANDIDATES, FinetuneConfig
from qtool.finetune.train import FINETUNE_METADATA_KEY, finetune


def _config(**kw):
    return FinetuneConfig(steps=4, batch_size=32, learning_rate="auto", probe_steps=2, validate_every=2, **kw)


def _record(path):
    return json.loads({p.key: p.value for p in onnx.load(path).metadata_props}[FINETUNE_METADATA_KEY])


def test_auto_probes_every_candidate_and_trains_with_the_best(graphs, tmp_path):
    events = []
    out = tmp_path / "auto.onnx"
    r = finetune(str(graphs["w3a3"]), str(CALIB), str(out),
                 _config(validation_data=str(EVAL), validation_labels="labels"), progress=events.append)
    probes = r.learning_rate_probe
    assert [p["learning_rate"] for p in probes] == list(LEARNING_RATE_CANDIDATES)
    best = max(probes, key=lambda p: p["accuracy"])  # the first of equals: the smaller rate
    assert best["accuracy"] > r.before  # the sample at W3A3 gains from training
    assert r.learning_rate == best["learning_rate"]
    assert (r.steps_run, r.end_step) == (4, 4) and [h["step"] for h in r.history] == [2, 4]
    probe_events = [e for e in events if e.probe is not None]
    assert [e.probe for e in probe_events] == list(LEARNING_RATE_CANDIDATES)
    assert [e.metric for e in probe_events] == [p["accuracy"] for p in probes]
    assert probe_events[0].format_text().startswith("probe learning rate 1e-06 (2 steps)")
    assert events.index(probe_events[-1]) < next(i for i, e in enumerate(events) if e.probe is None)
    assert any(n.startswith(f"learning rate auto: {best['learning_rate']:g} (2-step probes") for n in r.notes)
    assert f"auto: {best['learning_rate']:g} (start" in r.format_text()
    assert r.to_dict()["learning_rate_probe"] == probes and r.config["learning_rate"] == "auto"
    record = _record(out)
    assert record["schedule"]["learning_rate"] == best["learning_rate"] and record["learning_rate_probe"] == probes
    assert record["step"] == 4


def test_auto_trains_nothing_when_every_rate_is_worse(graphs, tmp_path):
    """Validation labels that the starting model gets all right (its own predictions, onnxruntime running the
    graph in evaluation mode): no probe can beat 100%, so nothing is trained and the output holds the input's
    values."""
    import onnxruntime as ort

    inputs = np.load(EVAL)["input"]
    feeds = {"input": inputs, "qtool_step": np.array(10**6, np.int64), "qtool_range_update": np.array(0, np.float32)}
    predicted = ort.InferenceSession(str(graphs["w3a3"]), providers=["CPUExecutionProvider"]).run(
        ["logits"], feeds)[0].argmax(1)

    out = tmp_path / "kept.onnx"
    r = finetune(str(graphs["w3a3"]), str(CALIB), str(out),
                 _config(validation_data={"input": inputs, "own": predicted}, validation_labels="own"))
    assert r.before == 1.0 and r.after == 1.0
    assert r.learning_rate is None and len(r.learning_rate_probe) == len(LEARNING_RATE_CANDIDATES)
    assert (r.steps_run, r.end_step, r.best_step, r.history) == (0, 0, 0, [])
    assert any("every probed rate (2 steps each) made the validation accuracy worse" in n for n in r.notes)
    assert "none (no change)" in r.format_text()
    src = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(graphs["w3a3"]).graph.initializer}
    kept = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    assert all(np.array_equal(src[k], kept[k]) for k in src if k != "qtool_range_update")
    record = _record(out)
    assert record["step"] == 0 and record["schedule"]["learning_rate"] is None


def test_the_rate_is_a_number_or_auto():
    assert FinetuneConfig(learning_rate="AUTO").normalized().learning_rate == "auto"
    assert FinetuneConfig(learning_rate="1e-5").normalized().learning_rate == 1e-5
    with pytest.raises(QtoolError, match=r"learning rate \(or 'auto'\) must be a number"):
        FinetuneConfig(learning_rate="fast").normalized()
    assert [FinetuneConfig(steps=s).probe_length() for s in (8, 40, 1000)] == [5, 10, 25]
    assert FinetuneConfig(steps=100, probe_steps=3).probe_length() == 3
    assert FinetuneConfig(steps=100).probe_length(start_step=80) == 5
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["finetune", "m.onnx", "--data", "d.npz", "-o", "o.onnx",
                                       "--learning-rate", "fast"])
    assert result.exit_code == 2 and "'fast' is not a valid float" in result.output
