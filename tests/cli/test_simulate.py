"""``qtool simulate`` end to end: files in a temp folder, reports, every bad input as one line."""

import json
import shutil

import pytest
from click.testing import CliRunner

from cli_helpers import SAMPLES, invoke

from qtool.cli import main


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    import qtool

    tmp = tmp_path_factory.mktemp("cli-simulate")
    for name in ("digits_cnn.onnx", "calib.npz", "eval.npz"):
        shutil.copy(SAMPLES / name, tmp / name)
    qtool.rewrite_eval(tmp / "digits_cnn.onnx", tmp / "q8.onnx", calibration_data=tmp / "calib.npz")
    return tmp


def test_simulate_quantized_model_writes_json_and_html(work):
    r = invoke("simulate", work / "digits_cnn.onnx", "--data", work / "eval.npz", "--labels", "labels",
               "--quantized", work / "q8.onnx", "--json", work / "r.json", "--html", work / "r.html")
    assert r.exit_code == 0, r.output
    assert "worst first" in r.output and "float" in r.output and "99.60%" in r.output
    data = json.loads((work / "r.json").read_text())
    assert data["float"]["accuracy"] == 0.996
    assert data["models"][0]["activations"][0]["sqnr_db"] <= data["models"][0]["activations"][-1]["sqnr_db"]
    assert (work / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_simulate_what_if_table(work):
    r = invoke("simulate", work / "digits_cnn.onnx", "--data", work / "eval.npz", "--labels", "labels",
               "--weight-bits", "4,8", "--calibration-data", work / "calib.npz", "--sensitivity")
    assert r.exit_code == 0, r.output
    assert "W4A8" in r.output and "W8A8" in r.output and "sensitivity" in r.output
    assert "calibration: " in r.output and "EVALUATION DATA" not in r.output


def test_simulate_without_calibration_data_says_so(work):
    r = invoke("simulate", work / "digits_cnn.onnx", "--data", work / "eval.npz")
    assert r.exit_code == 0, r.output
    assert "ON THE EVALUATION DATA ITSELF" in r.output


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--labels", "nope"], "no labels array 'nope'"),
        (["--output", "probs"], "has no output 'probs'"),
        (["--quantized", "{q}", "--weight-bits", "4"], "do not apply with --quantized"),
        (["--quantized", "{missing}"], "does not exist"),
        (["--weight-bits", "4,x"], "comma-separated integers"),
    ],
)
def test_bad_input_is_one_line_and_nonzero_exit(work, extra, message):
    extra = [e.format(q=work / "q8.onnx", missing=work / "missing.onnx") for e in extra]
    r = invoke("simulate", work / "digits_cnn.onnx", "--data", work / "eval.npz", *extra)
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("qtool: error:") and message in lines[0], r.output


def test_progress_bars_stay_off_when_not_a_terminal(work):
    r = CliRunner().invoke(main, ["simulate", str(work / "digits_cnn.onnx"), "--data",
                                                  str(work / "eval.npz"), "--quantized", str(work / "q8.onnx")])
    assert r.exit_code == 0
    assert r.stderr == ""


def test_progress_bars_name_each_pass(monkeypatch):
    import io
    import sys

    from qtool.cli._common import ProgressBars

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bars = ProgressBars(enabled=True)
    for label in ("calibrating W8A8", "evaluating"):
        for done in (0, 50, 100):
            bars.update(label, done, 100)
    bars.close()
    assert "calibrating W8A8" in err.getvalue() and "evaluating" in err.getvalue()
