"""``qtool calibrate`` and ``rewrite-eval --calibration-method / --ranges`` end to end."""

import json

import numpy as np
import onnx
import pytest

from cli_helpers import invoke


def initializers(path):
    model = onnx.load(str(path))
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


def test_calibrate_writes_the_documented_layout(work):
    out = work / "ranges.json"
    result = invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", out,
                    "--method", "percentile", "--percentile", "99.9", "--batch-size", "32")
    assert result.exit_code == 0, result.output
    # TF's 7 and the pooled tensor (own range); the 2 tensors after MaxPool and Flatten carry their
    # input's quantizer (no range of their own)
    assert "calibrated 8 tensor(s)" in result.stdout and "percentile" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["format"] == "qtool.ranges" and doc["version"] == 1
    assert doc["method"] == "percentile" and doc["options"] == {"percentile": 99.9, "num_bins": 2048}
    assert doc["samples"] == 100 and doc["batches"] == 4 and doc["batch_size"] == 32
    assert doc["quantization"]["activation_bits"] == 8
    assert len(doc["tensors"]) == 8 and "input" in doc["tensors"]
    for r in doc["tensors"].values():
        assert r["min"] <= r["max"]


@pytest.mark.parametrize("method", ["minmax", "ema", "percentile", "entropy", "mse"])
def test_ranges_file_gives_the_same_model_as_calibrating_in_rewrite_eval(work, method):
    ranges = work / "ranges.json"
    assert invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", ranges,
                  "--method", method).exit_code == 0
    direct, via_file = work / "direct.onnx", work / "via_file.onnx"
    r1 = invoke("rewrite-eval", work / "model.onnx", "-o", direct, "--data", work / "calib.npz",
                "--calibration-method", method)
    r2 = invoke("rewrite-eval", work / "model.onnx", "-o", via_file, "--ranges", ranges, "--json")
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    assert f"calibrated: 100 samples, 7 batches, {method}" in r1.stdout
    assert json.loads(r2.stdout)["ranges_from"] == str(ranges)
    a, b = initializers(direct), initializers(via_file)
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_methods_give_different_ranges_and_options_reach_the_observers(work):
    docs = {}
    for args in (["--method", "minmax"], ["--method", "percentile", "--percentile", "99"],
                 ["--method", "ema", "--ema-decay", "0.5"], ["--method", "entropy", "--num-bins", "1024"]):
        out = work / f"{args[1]}.json"
        assert invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", out, *args).exit_code == 0
        docs[args[1]] = json.loads(out.read_text())
    relu = "/Relu_1_output_0"
    assert docs["percentile"]["tensors"][relu]["max"] < docs["minmax"]["tensors"][relu]["max"]
    assert docs["ema"]["options"] == {"ema_decay": 0.5}
    assert docs["entropy"]["options"]["num_bins"] == 1024


def test_onnxruntime_calibration_cache_is_read(work):
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData, save_tensors_data

    ours = work / "ranges.json"
    assert invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", ours).exit_code == 0
    tensors = json.loads(ours.read_text())["tensors"]
    # onnxruntime calibrates the float graph: what a folded layer computes is its batch norm's output there
    summary = json.loads(invoke("rewrite-eval", work / "model.onnx", "-o", work / "x.onnx", "--json").stdout)
    bn_output = {f["folded_into"]: f["output"] for f in summary["batch_norms_folded"]}
    float_names = {bn_output.get(k, k): v for k, v in tensors.items()}
    cache = TensorsData(CalibrationMethod.MinMax,
                        {k: (np.float32(v["min"]), np.float32(v["max"])) for k, v in float_names.items()})
    save_tensors_data(cache, work / "ort_cache.json")
    r1 = invoke("rewrite-eval", work / "model.onnx", "-o", work / "a.onnx", "--ranges", ours)
    r2 = invoke("rewrite-eval", work / "model.onnx", "-o", work / "b.onnx", "--ranges", work / "ort_cache.json")
    assert r1.exit_code == 0 and r2.exit_code == 0, r2.output
    a, b = initializers(work / "a.onnx"), initializers(work / "b.onnx")
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    plain = work / "calibration.json"  # write_calibration_table's plain {name: {lowest, highest}}
    plain.write_text(json.dumps({k: {"lowest": v["min"], "highest": v["max"], "CLS": "TensorData"}
                                 for k, v in float_names.items()}))
    assert invoke("rewrite-eval", work / "model.onnx", "-o", work / "c.onnx", "--ranges", plain).exit_code == 0
    # a cache with the range before the batch norm only: the folded layer's range is unknown, refused
    before = work / "before_fold.json"
    before.write_text(json.dumps({k: {"lowest": v["min"], "highest": v["max"]} for k, v in tensors.items()}))
    refused = invoke("rewrite-eval", work / "model.onnx", "-o", work / "d.onnx", "--ranges", before)
    assert refused.exit_code == 2 and "before the batch norm" in refused.stderr and not (work / "d.onnx").exists()


@pytest.mark.parametrize("args, message", [
    (["--method", "entropy", "--num-bins", "512"], "needs --num-bins >= 1024"),
    (["--method", "entropy", "--activation-bits", "10", "--num-bins", "2048"], "needs --num-bins >= 4096"),
])
def test_bad_method_options_fail_before_running(work, args, message):
    out = work / "ranges.json"
    result = invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", out, *args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
    assert not out.exists()


def test_data_that_does_not_fit_is_one_clear_line_and_no_file(work):
    bad = work / "bad.npz"
    np.savez(bad, input=np.zeros((4, 1, 9, 8), np.float32))
    out = work / "ranges.json"
    result = invoke("calibrate", work / "model.onnx", "--data", bad, "-o", out)
    assert result.exit_code == 2
    assert "expected shape [?, 1, 8, 8]" in result.stderr or "dimension 2 is 9" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
    result = invoke("calibrate", work / "model.onnx", "--data", work / "missing.npz", "-o", out)
    assert result.exit_code == 2 and "does not exist" in result.stderr
    result = invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "no" / "r.json")
    assert result.exit_code == 2 and "does not exist" in result.stderr
    result = invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "model.onnx")
    assert result.exit_code == 2 and "is the input model" in result.stderr


def test_bad_ranges_files(work):
    out = work / "q.onnx"
    cases = {
        "missing.json": None,
        "notjson.json": "{",
        "other.json": json.dumps({"format": "qtool.ranges", "version": 1, "tensors": {"x": {"min": 0, "max": 1}}}),
        "reversed.json": json.dumps({"format": "qtool.ranges", "version": 1, "tensors": {"x": {"min": 2, "max": 1}}}),
        "future.json": json.dumps({"format": "qtool.ranges", "version": 9, "tensors": {}}),
        "foreign.json": json.dumps({"a": [1, 2]}),
    }
    messages = {
        "missing.json": "does not exist",
        "notjson.json": "cannot read ranges file",
        "other.json": "has no range for tensor",
        "reversed.json": "min 2.0 is larger than max 1.0",
        "future.json": "version 9 is not supported",
        "foreign.json": "not a qtool ranges file",
    }
    for name, text in cases.items():
        if text is not None:
            (work / name).write_text(text)
        result = invoke("rewrite-eval", work / "model.onnx", "-o", out, "--ranges", work / name)
        assert result.exit_code == 2, (name, result.output)
        assert messages[name] in result.stderr, (name, result.stderr)
        assert not out.exists()
    both = invoke("rewrite-eval", work / "model.onnx", "-o", out, "--ranges", work / "other.json",
                  "--data", work / "calib.npz")
    assert both.exit_code == 2 and "not both" in both.stderr


def test_calibrate_json_summary(work):
    result = invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "r.json",
                    "--method", "mse", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["tensors"] == 8 and summary["method"] == "mse" and summary["warnings"] == []


def test_a_model_exported_for_one_sample_under_a_free_batch_axis_says_use_batch_size_1(tmp_path):
    """khmersm's transformer (PyTorch 2.10, dynamo): its input says [batch, seq] but a Reshape inside has
    the batch of 1 written in, so onnxruntime fails on any batch of 2 or more. The error names the cure."""
    from model_builders import Builder, save

    b = Builder(opset=17)
    x = b.input("x", ["batch", 8])
    h = b.node("Reshape", [b.matmul(x, 8, 8), b.const(np.array([1, 2, 4], np.int64))])
    b.node("Relu", [h], outputs=["y"])
    b.output("y")
    model = save(b.proto(), tmp_path / "model.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32))
    result = invoke("calibrate", model, "--data", tmp_path / "calib.npz", "-o", tmp_path / "r.json")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "runs on one sample but fails on a batch of 4" in result.output and "--batch-size 1" in result.output
    ok = invoke("calibrate", model, "--data", tmp_path / "calib.npz", "-o", tmp_path / "r.json", "--batch-size", "1")
    assert ok.exit_code == 0, ok.output
    # rewrite-eval's check of its output runs the first batch before calibrating: the same advice, not its error
    again = invoke("rewrite-eval", model, "--data", tmp_path / "calib.npz", "-o", tmp_path / "q.onnx")
    assert again.exit_code == 2 and "--batch-size 1" in again.output and not (tmp_path / "q.onnx").exists()


def test_a_failing_run_is_one_line_without_onnxruntimes_log(tmp_path, capfd):
    """A node that fails at run time: qtool's one line only (onnxruntime logged an ERROR line of its own,
    in colour, before it)."""
    from model_builders import Builder, save

    from qtool.cli import main

    b = Builder(opset=17)
    x = b.input("x", [2, 8])
    b.node("Relu", [b.node("Reshape", [b.matmul(x, 8, 8), b.const(np.array([3, 5], np.int64))])], outputs=["y"])
    b.output("y")
    model = save(b.proto(), tmp_path / "model.onnx")
    np.savez(tmp_path / "calib.npz", x=np.ones((4, 8), np.float32))
    with pytest.raises(SystemExit) as exit_info:
        main(["rewrite-eval", model, "--data", str(tmp_path / "calib.npz"), "-o", str(tmp_path / "q.onnx")],
             standalone_mode=True)
    err = capfd.readouterr().err
    assert exit_info.value.code == 2 and "onnxruntime" not in err.split("qtool: error:")[0]
    assert [line for line in err.splitlines() if "error" in line.lower()] == \
        [next(line for line in err.splitlines() if line.startswith("qtool: error:"))]


def test_auto_calibration_is_for_rewrite_eval_only(work):
    for command in (("calibrate", work / "model.onnx", "-o", work / "r.json"),
                    ("rewrite-train", work / "model.onnx", "-o", work / "t.onnx")):
        result = invoke(*command, "--data", work / "calib.npz", "--calibration-method", "auto")
        assert result.exit_code == 2 and "'auto' is not one of" in result.output
    assert not (work / "r.json").exists() and not (work / "t.onnx").exists()


def test_rewrite_eval_says_which_calibration_method_auto_kept(work):
    args = ("rewrite-eval", work / "model.onnx", "-o", work / "q.onnx", "--data", work / "calib.npz",
            "--calibration-method", "auto")
    result = invoke(*args, "--percentile", "99.9")
    assert result.exit_code == 0, result.output
    assert "auto: minmax" in result.stdout and "calibration methods    minmax" in result.stdout
    assert "rewrite-eval: writing the model with each of 3 calibration methods\n" in result.stderr
    refused = invoke(*args, "--ema-decay", "0.9")
    assert refused.exit_code == 2 and "--ema-decay is for --calibration-method ema, not auto" in refused.output
