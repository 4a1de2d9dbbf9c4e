"""``qtool rewrite-eval`` end to end: files in a temp folder, every bad input."""

import json
import os
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from cli_helpers import CALIB, MODEL, invoke

from qtool.cli import main


def test_rewrite_eval_sample(work):
    out = work / "model.qdq.onnx"
    result = invoke("rewrite-eval", work / "model.onnx", "-o", out, "--data", work / "calib.npz")
    assert result.exit_code == 0, result.output
    assert "batch norms folded     4 of 4" in result.stdout
    assert "layers quantized       5" in result.stdout
    assert "calibrated: 100 samples" in result.stdout
    assert "warning" not in result.stderr
    onnx.checker.check_model(onnx.load(out))


def test_json_summary(work):
    out = work / "model.qdq.onnx"
    result = invoke("rewrite-eval", work / "model.onnx", "-o", out, "--data", work / "calib.npz", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["counts"]["batch_norms_folded"] == 4
    # TF's 7, the pooled tensor (own range), the MaxPool and Flatten outputs carrying their input's quantizer
    assert summary["counts"]["activations_quantized"] == len(summary["activations"]) == 10
    assert summary["left_in_float"] == []  # the residual Add runs fused with its Relu (QLinearAdd)
    assert summary["calibration"]["samples"] == 100
    assert summary["output"] == str(out)


def test_without_calibration_data_the_result_says_it_needs_calibration(work):
    result = invoke("rewrite-eval", work / "model.onnx", "-o", work / "out.onnx")
    assert result.exit_code == 0, result.output
    assert "qtool: warning: no calibration data" in result.stderr
    assert "needs calibration" in result.stderr
    assert "NOT CALIBRATED" in result.stdout


def test_options_reach_the_rewrite(work):
    out = work / "out.onnx"
    result = invoke(
        "rewrite-eval", work / "model.onnx", "-o", out, "--data", work / "calib.npz",
        "--per-tensor", "--symmetric", "--weight-bits", "7", "--activation-bits", "6",
        "--exclude", "Gemm_0", "--batch-size", "7", "--json",
    )
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["opset"]["output"] == 12  # per-tensor needs no per-channel opset 13; Clip on int8 needs 12
    assert s["counts"]["layers_quantized"] == 4
    assert s["calibration"]["batches"] == 15
    assert all(w["axis"] is None and w["bits"] == 7 for w in s["weights"])
    assert any("excluded" in x["reason"] for x in s["left_in_float"] if x["node"] == "Gemm_0")


def test_in_place(work):
    src = work / "model.onnx"
    before = src.read_bytes()
    result = invoke("rewrite-eval", src, "--in-place", "--data", work / "calib.npz")
    assert result.exit_code == 0, result.output
    assert src.read_bytes() != before
    assert sorted(os.listdir(work)) == ["calib.npz", "model.onnx"]


def bad(work, *args):
    before = sorted(os.listdir(work))
    snapshot = {name: (work / name).read_bytes() for name in before if (work / name).is_file()}
    result = invoke("rewrite-eval", *args)
    assert result.exit_code != 0
    assert sorted(os.listdir(work)) == before  # nothing written, nothing left behind
    for name, data in snapshot.items():
        assert (work / name).read_bytes() == data  # input untouched
    assert "Traceback" not in result.output
    return result


def one_line_error(result, *fragments):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("qtool: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.exit_code == 2


def test_missing_model(work):
    result = bad(work, work / "nope.onnx", "-o", work / "out.onnx")
    one_line_error(result, "does not exist")


def test_model_is_a_folder(work):
    (work / "dir.onnx").mkdir()
    result = bad(work, work / "dir.onnx", "-o", work / "out.onnx")
    assert result.exit_code == 2 and "is a directory" in result.stderr  # click's own check of MODEL


def test_unreadable_model(work, monkeypatch):
    path = work / "locked.onnx"
    shutil.copy(MODEL, path)
    path.chmod(0)
    # root reads any file whatever its mode: make the read itself fail as it
    # does for other users, so the test means the same for everyone
    import builtins

    real_open = builtins.open

    def guarded_open(file, *args, **kwargs):
        if os.fspath(file) == os.fspath(path):
            raise PermissionError(13, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    result = bad(work, path, "-o", work / "out.onnx")
    one_line_error(result)
    assert "permission denied" in result.stderr.lower()


def test_not_an_onnx_file(work):
    (work / "notes.txt").write_text("hello, this is text\n" * 10)
    result = bad(work, work / "notes.txt", "-o", work / "out.onnx")
    one_line_error(result, "not an ONNX model")


def test_truncated_model(work):
    data = MODEL.read_bytes()
    (work / "cut.onnx").write_bytes(data[: len(data) // 2])
    result = bad(work, work / "cut.onnx", "-o", work / "out.onnx")
    one_line_error(result, "cut.onnx")


def test_calibration_names_do_not_fit(work):
    np.savez(work / "wrong.npz", images=np.zeros((4, 1, 8, 8), np.float32), other=np.zeros(4, np.float32))
    result = bad(work, work / "model.onnx", "-o", work / "out.onnx", "--data", work / "wrong.npz")
    one_line_error(result, "no array for model input 'input'", "images")


def test_calibration_shape_does_not_fit(work):
    np.savez(work / "wrong.npz", input=np.zeros((4, 1, 28, 28), np.float32))
    result = bad(work, work / "model.onnx", "-o", work / "out.onnx", "--data", work / "wrong.npz")
    one_line_error(result, "input 'input'", "expected shape [N, 1, 8, 8]", "[4, 1, 28, 28]")


def test_calibration_dtype_does_not_fit(work):
    np.save(work / "wrong.npy", np.zeros((4, 1, 8, 8), np.float64))
    result = bad(work, work / "model.onnx", "-o", work / "out.onnx", "--data", work / "wrong.npy")
    one_line_error(result, "input 'input'", "expected dtype float32, got float64")


def test_calibration_file_missing(work):
    result = bad(work, work / "model.onnx", "-o", work / "out.onnx", "--data", work / "none.npz")
    one_line_error(result, "calibration data file", "does not exist")


@pytest.mark.parametrize("option", ["--weight-bits", "--activation-bits"])
@pytest.mark.parametrize("value", ["1", "17"])
def test_bit_widths_outside_2_to_16(work, option, value):
    result = bad(work, work / "model.onnx", "-o", work / "out.onnx", option, value)
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.stderr and "2<=x<=16" in result.stderr


def test_output_folder_does_not_exist(work):
    result = bad(work, work / "model.onnx", "-o", work / "missing" / "out.onnx")
    one_line_error(result, "output folder", "does not exist")


def test_output_is_the_input(work):
    result = bad(work, work / "model.onnx", "-o", work / "model.onnx")
    one_line_error(result, "is the input model; use --in-place")


def test_no_output_given(work):
    result = bad(work, work / "model.onnx")
    assert result.exit_code == 2 and "-o/--output" in result.stderr


def test_unknown_exclude(work):
    result = bad(work, work / "model.onnx", "-o", work / "out.onnx", "--exclude", "conv9")
    one_line_error(result, "--exclude: no node named 'conv9'")


def test_debug_shows_the_traceback(work):
    result = CliRunner().invoke(main, ["--debug", "rewrite-eval", str(work / "nope.onnx"), "-o", str(work / "o.onnx")])
    assert result.exit_code != 0
    assert result.exception is not None and "does not exist" in str(result.exception)


def test_progress_names_the_check_of_the_written_model(tmp_path):
    """After the calibration bar, the int8 run over the first samples (seconds on a large model) is a stage
    of its own, not a wait in silence."""
    result = invoke("rewrite-eval", str(MODEL), "-o", str(tmp_path / "q.onnx"), "--data", str(CALIB))
    lines = result.stderr.splitlines()
    assert result.exit_code == 0
    assert lines[:2] == ["qtool rewrite-eval: calibrating (100 samples)",
                         "qtool rewrite-eval: checking the int8 model against float"]
    assert lines[2].startswith("qtool rewrite-eval: done in ") and "checking the int8 model against float" in lines[2]
