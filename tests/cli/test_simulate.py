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


def test_progress_is_one_line_per_stage_when_not_a_terminal(work):
    r = CliRunner().invoke(main, ["simulate", str(work / "digits_cnn.onnx"), "--data", str(work / "eval.npz"),
                                  "--weight-bits", "4,8", "--activation-bits", "8,16",
                                  "--calibration-data", str(work / "calib.npz"), "--json", str(work / "p.json")])
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    # one calibration for the four bit width pairs, then one pass over the data
    assert lines[0] == "qtool simulate: calibrating (100 samples)"
    assert [line for line in lines if line.startswith("qtool simulate: calibrating")] == [lines[0]]
    assert "qtool simulate: evaluating (500 samples)" in lines and "qtool simulate: writing JSON" in lines
    assert lines[-1].startswith("qtool simulate: done in ") and "evaluating" in lines[-1]
    assert len(lines) == 5
    assert "\r" not in r.stderr  # no bar


def test_notes_are_behind_verbose(work):
    args = ["simulate", work / "digits_cnn.onnx", "--data", work / "eval.npz", "--quantized", work / "q8.onnx"]
    quiet, loud = invoke(*args), invoke(*args, "--verbose")
    assert quiet.exit_code == 0 and loud.exit_code == 0
    assert "note:" not in quiet.output
    # the float model's fusion note shows on every run of the sample: only with --verbose
    assert "note: the float model's output changed" in loud.output
    assert "more (all in --json)" not in loud.output


def test_terminal_tables_fit_80_columns(work, tmp_path):
    deep = tmp_path / ("a_folder_with_a_rather_long_name_" * 3)
    deep.mkdir()
    for name in ("digits_cnn.onnx", "q8.onnx", "eval.npz"):
        shutil.copy(work / name, deep / name)
    r = invoke("simulate", deep / "digits_cnn.onnx", "--data", deep / "eval.npz", "--labels", "labels",
               "--quantized", deep / "q8.onnx", "--sensitivity")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    model_row = [line for line in lines if "q8.onnx" in line and "%" in line]
    assert len(model_row) == 1 and "\u2026" in model_row[0]  # the path is cut in the middle, its end stays


def test_batch_axis_option(work):
    bad = invoke("simulate", work / "digits_cnn.onnx", "--data", work / "eval.npz", "--quantized", work / "q8.onnx",
                 "--batch-axis", "logits=x")
    assert bad.exit_code == 2 and bad.output.strip().startswith("qtool: error: batch axis 'logits'")
    ok = invoke("simulate", work / "digits_cnn.onnx", "--data", work / "eval.npz", "--quantized", work / "q8.onnx",
                "--batch-axis", "logits=0", "--json", work / "axis.json")
    assert ok.exit_code == 0, ok.output
    assert json.loads((work / "axis.json").read_text())["batch_axis"] == 0


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


def test_stage_progress_draws_a_bar_on_a_terminal(monkeypatch):
    import io
    import sys

    from qtool.cli._progress import StageProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    progress = StageProgress("simulate")  # decides by stderr.isatty()
    for stage in ("calibrating", "evaluating"):
        for done in (0, 50, 100):
            progress.update(stage, done, 100)
    progress.finish()
    out = err.getvalue()
    assert "calibrating" in out and "evaluating" in out and "100/100" in out  # click's bars, with positions
    assert "(100 samples)" not in out  # no stage lines on a terminal
    assert out.rstrip().splitlines()[-1].startswith("qtool simulate: done in ")


def test_stage_progress_starts_again_for_another_pass_of_a_stage(monkeypatch):
    """An If model's calibration makes one pass per branch taken, each from 0: a line (a bar) per pass,
    not a bar run backwards."""
    import io
    import sys

    from qtool.cli._progress import StageProgress

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    progress = StageProgress("rewrite-eval", terminal=False)
    for total in (64, 16):
        for done in range(0, total + 1, 16):
            progress.update("calibrating", done, total)
    progress.finish()
    lines = err.getvalue().splitlines()
    assert lines[:2] == ["qtool rewrite-eval: calibrating (64 samples)", "qtool rewrite-eval: calibrating (16 samples)"]
    assert lines[2].startswith("qtool rewrite-eval: done in ") and "calibrating" in lines[2]
