"""``qtool rewrite-train`` end to end: files in a temp folder, idempotence, the train -> eval flow, bad input."""

import json

import onnx
import pytest

from cli_helpers import invoke


def test_rewrite_train_sample_then_eval(work):
    out = work / "model.qat.onnx"
    result = invoke("rewrite-train", work / "model.onnx", "-o", out, "--data", work / "calib.npz",
                    "--quant-delay", 5, "--freeze-bn-delay", 10)
    assert result.exit_code == 0, result.output
    assert "batch norms folded     4 of 4" in result.stdout
    assert "layers quantized       5" in result.stdout
    assert "activations quantized  10" in result.stdout
    assert "warning" not in result.stderr
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    contract = json.loads({p.key: p.value for p in model.metadata_props}["qtool.training"])
    assert contract["quant_delay"] == 5 and contract["freeze_bn_delay"] == 10
    # the deployable model from the training graph, no calibration
    qdq = work / "model.qdq.onnx"
    result = invoke("rewrite-eval", out, "-o", qdq)
    assert result.exit_code == 0, result.output
    assert "ranges from the training graph's trained state" in result.stdout
    assert "warning" not in result.stderr
    assert not any(n.domain == "qtool" for n in onnx.load(qdq).graph.node)


def test_round_mode_half_to_even_is_recorded_and_deployed_without_the_rounding_note(work):
    out, qdq = work / "model.qat.onnx", work / "model.qdq.onnx"
    result = invoke("rewrite-train", work / "model.onnx", "-o", out, "--data", work / "calib.npz",
                    "--round-mode", "half_to_even")
    assert result.exit_code == 0, result.output
    model = onnx.load(out)
    contract = json.loads({p.key: p.value for p in model.metadata_props}["qtool.training"])
    assert contract["options"]["round_mode"] == "half_to_even"
    assert all(any(a.name == "half_to_even" and a.i == 1 for a in n.attribute)
               for n in model.graph.node if n.op_type == "FakeQuant")
    result = invoke("rewrite-eval", out, "-o", qdq, "-v", "--json", work / "summary.json")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    assert "rounds activations half to even" not in result.stdout  # rounded as trained
    assert json.loads((work / "summary.json").read_text())["options"]["round_mode"] == "half_to_even"
    result = invoke("rewrite-eval", work / "model.onnx", "-o", work / "ptq.onnx", "-v", "--data", work / "calib.npz")
    assert "rounds activations half to even" in result.stdout  # the default: TF's half up, noted


def test_json_summary_and_idempotence(work):
    out = work / "model.qat.onnx"
    result = invoke("rewrite-train", work / "model.onnx", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["counts"]["state_tensors"] == 24  # 8 ranges (carried quantizers share theirs) + 4 BNs
    assert summary["changed"] and not summary["already_training_graph"]
    assert {a["range_source"] for a in summary["activations"]} == {"default", "carried"}
    again = work / "again.onnx"
    result = invoke("rewrite-train", out, "-o", again, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["already_training_graph"] and not summary["changed"]
    assert again.read_bytes() == out.read_bytes()
    result = invoke("rewrite-train", out, "--in-place")
    assert result.exit_code == 0 and "nothing to do" in result.stdout
    assert again.read_bytes() == out.read_bytes()


def test_in_place(work):
    before = (work / "model.onnx").read_bytes()
    result = invoke("rewrite-train", work / "model.onnx", "--in-place", "--per-tensor", "--symmetric")
    assert result.exit_code == 0, result.output
    after = (work / "model.onnx").read_bytes()
    assert after != before
    assert sorted(p.name for p in work.iterdir()) == ["calib.npz", "model.onnx"]


@pytest.mark.parametrize("args,message", [
    (["missing.onnx", "-o", "out.onnx"], "does not exist"),
    (["calib.npz", "-o", "out.onnx"], "not an ONNX model"),
    (["model.onnx", "-o", "nowhere/out.onnx"], "does not exist"),
    (["model.onnx"], "-o/--output"),
    (["model.onnx", "-o", "out.onnx", "--quant-delay", "-1"], "quant-delay"),
    (["model.onnx", "-o", "out.onnx", "--weight-bits", "17"], "weight-bits"),
    (["model.onnx", "-o", "out.onnx", "--data", "model.onnx"], "calibration"),
    (["model.onnx", "-o", "model.onnx"], "--in-place"),
    (["model.onnx", "-o", "out.onnx", "--round-mode", "HALF_UP"], "--round-mode"),
])
def test_bad_input_is_one_line_nonzero_exit_nothing_written(work, args, message, monkeypatch):
    monkeypatch.chdir(work)
    before = sorted(p.name for p in work.iterdir())
    model_bytes = (work / "model.onnx").read_bytes()
    result = invoke("rewrite-train", *args)
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in work.iterdir()) == before
    assert (work / "model.onnx").read_bytes() == model_bytes


def test_foreign_training_state_is_an_error(work):
    model = onnx.load(work / "model.onnx")
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    bn.output.extend(["running_mean", "running_var", "saved_mean", "saved_var"])  # opset 9-13: 1 or 5 outputs
    model.graph.output.append(onnx.helper.make_tensor_value_info("running_mean", onnx.TensorProto.FLOAT, [16]))
    onnx.save(model, work / "foreign.onnx")
    result = invoke("rewrite-train", work / "foreign.onnx", "-o", work / "out.onnx")
    assert result.exit_code != 0
    assert "training-only state from another tool" in result.output
    assert not (work / "out.onnx").exists()
