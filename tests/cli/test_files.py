"""Outputs never overwrite inputs, for every command; unwritable outputs fail cleanly."""

from __future__ import annotations

import json
import os
import shutil

import onnx
import pytest
from cli_helpers import SAMPLES, invoke

EVAL = SAMPLES / "eval.npz"


def snapshot(folder):
    return {f: (folder / f).read_bytes() for f in sorted(os.listdir(folder)) if (folder / f).is_file()}


def one_line(result, *fragments):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("qtool: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.exit_code == 2


@pytest.fixture
def ext(work):
    """The sample model with its weights in external data 'weights.bin' (ext.onnx)."""
    model = onnx.load(work / "model.onnx")
    onnx.save(model, work / "ext.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0,
              convert_attribute=True)
    return work / "ext.onnx"


@pytest.fixture
def ranges(work):
    result = invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "ranges.json")
    assert result.exit_code == 0, result.output
    return work / "ranges.json"


def test_rewrite_eval_outputs_onto_inputs(work, ext, ranges):
    model, calib = work / "model.onnx", work / "calib.npz"
    os.symlink(model, work / "link.onnx")
    os.link(calib, work / "hard.npz")
    before = snapshot(work)
    cases = [
        (["-o", work / "weights.bin"], ext, "weights.bin"),  # the input's external data
        (["-o", calib, "--data", calib], model, "calib.npz"),
        (["-o", work / "hard.npz", "--data", calib], model, "hard.npz"),  # a hard link of it
        (["-o", ranges, "--ranges", ranges], model, "ranges.json"),
        (["-o", work / "link.onnx"], model, "is the input model"),  # a symlink to the input
        (["-o", ext, "--data", calib], ext, "is the input model; use --in-place"),
    ]
    for args, src, fragment in cases:
        one_line(invoke("rewrite-eval", src, *args), fragment)
    # --in-place: the model itself is the output, but its data and the other inputs still are not
    one_line(invoke("rewrite-eval", ext, "--in-place", "-o", work / "weights.bin"),
             "either an output path (-o) or --in-place")
    assert snapshot(work) == before


def test_the_message_names_both_paths(work):
    result = invoke("rewrite-eval", work / "model.onnx", "-o", work / "calib.npz", "--data", work / "calib.npz")
    one_line(result, f"the output '{work / 'calib.npz'}' is the input '{work / 'calib.npz'}'")


def test_rewrite_train_outputs_onto_inputs(work, ext):
    before = snapshot(work)
    one_line(invoke("rewrite-train", work / "model.onnx", "-o", work / "calib.npz", "--data", work / "calib.npz"),
             "calib.npz")
    one_line(invoke("rewrite-train", ext, "-o", work / "weights.bin"), "weights.bin")
    assert snapshot(work) == before


def test_calibrate_outputs_onto_inputs(work, ext):
    before = snapshot(work)
    one_line(invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "calib.npz"),
             "calib.npz")
    one_line(invoke("calibrate", ext, "--data", work / "calib.npz", "-o", work / "weights.bin"), "weights.bin")
    one_line(invoke("calibrate", ext, "--data", work / "calib.npz", "-o", ext), "is the input model")
    assert snapshot(work) == before


def test_simulate_reports_onto_inputs(work, ext):
    shutil.copy(EVAL, work / "eval.npz")
    quantized = work / "q.onnx"
    assert invoke("rewrite-eval", work / "model.onnx", "-o", quantized, "--data", work / "calib.npz").exit_code == 0
    before = snapshot(work)
    base = ["simulate", ext, "--data", work / "eval.npz", "--labels", "labels"]
    one_line(invoke(*base, "--json", ext), "ext.onnx")
    one_line(invoke(*base, "--html", work / "weights.bin"), "weights.bin")
    one_line(invoke(*base, "--json", work / "eval.npz"), "eval.npz")
    one_line(invoke(*base, "--quantized", quantized, "--html", quantized), "q.onnx")
    one_line(invoke(*base, "--calibration-data", work / "calib.npz", "--json", work / "calib.npz"), "calib.npz")
    one_line(invoke(*base, "--json", work / "r.txt", "--html", work / "r.txt"), "are the same file")
    one_line(invoke(*base, "--json", work / "missing" / "r.json"), "does not exist")
    assert snapshot(work) == before


def test_json_summary_files_onto_inputs_or_the_output(work, ext, ranges):
    before = snapshot(work)
    model, calib = work / "model.onnx", work / "calib.npz"
    one_line(invoke("rewrite-eval", model, "-o", work / "q.onnx", "--json", model), "model.onnx")
    one_line(invoke("rewrite-eval", ext, "-o", work / "q.onnx", "--json", work / "weights.bin"), "weights.bin")
    one_line(invoke("rewrite-eval", model, "-o", work / "q.onnx", "--ranges", ranges, "--json", ranges), "ranges.json")
    one_line(invoke("rewrite-eval", model, "-o", work / "q.onnx", "--json", work / "q.onnx"), "are the same file")
    one_line(invoke("rewrite-eval", model, "--in-place", "--json", model), "model.onnx")
    one_line(invoke("rewrite-train", model, "-o", work / "t.onnx", "--data", calib, "--json", calib), "calib.npz")
    one_line(invoke("calibrate", model, "--data", calib, "-o", work / "r.json", "--json", work / "r.json"),
             "are the same file")
    one_line(invoke("calibrate", model, "--data", calib, "-o", work / "r.json", "--json", calib), "calib.npz")
    assert snapshot(work) == before


def test_finetune_outputs_onto_inputs(work, ext):
    train = work / "train.onnx"
    assert invoke("rewrite-train", ext, "-o", train).exit_code == 0
    shutil.copy(work / "calib.npz", work / "valid.npz")
    before = snapshot(work)
    base = ["finetune", train, "--data", work / "calib.npz", "--steps", "1"]
    one_line(invoke(*base, "-o", work / "calib.npz"), "calib.npz")
    one_line(invoke(*base, "--validation-data", work / "valid.npz", "-o", work / "valid.npz"), "valid.npz")
    data_file = sorted(f for f in os.listdir(work) if f.startswith("train.onnx.qt-"))[0]
    one_line(invoke(*base, "-o", work / data_file), data_file)  # the training graph's external data
    assert snapshot(work) == before


@pytest.mark.parametrize("command", ["rewrite-eval", "rewrite-train", "calibrate"])
def test_missing_folder_and_directory_outputs(work, command):
    extra = ["--data", work / "calib.npz"] if command == "calibrate" else []
    (work / "adir").mkdir()
    before = snapshot(work)
    one_line(invoke(command, work / "model.onnx", *extra, "-o", work / "missing" / "out.onnx"),
             "folder", "does not exist")
    result = invoke(command, work / "model.onnx", *extra, "-o", work / "adir")  # refused by click's option check
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "adir' is a directory" in result.stderr
    assert snapshot(work) == before and os.listdir(work / "adir") == []


def test_unwritable_folder_is_one_line_and_leaves_nothing(work, monkeypatch):
    """A folder that refuses new files (read-only mount, no permission: simulated, since tests
    may run as root, for whom permission bits do not apply)."""
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    before = snapshot(work)
    one_line(invoke("rewrite-eval", work / "model.onnx", "-o", work / "out.onnx"), "Permission denied")
    one_line(invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "r.json"),
             "Permission denied")
    assert snapshot(work) == before


def test_forged_training_metadata_is_refused(work):
    assert invoke("rewrite-train", work / "model.onnx", "-o", work / "train.onnx").exit_code == 0
    model = onnx.load(work / "train.onnx")
    entry = next(p for p in model.metadata_props if p.key == "qtool.training")
    contract = json.loads(entry.value)
    forgeries = {
        "missing key": ({k: v for k, v in contract.items() if k != "state"}, "the contract has no 'state'"),
        "wrong type": ({**contract, "batch_norms": "x"}, "'batch_norms' of the contract is \"x\""),
        "unknown layer": ({**contract, "weight_quantizers": [
            {**contract["weight_quantizers"][0], "layers": ["ghost"]}]}, "names the layer 'ghost'"),
        "unknown state": ({**contract, "state": {"nope": "nope:updated"}}, "names the state initializer 'nope'"),
        "not json": ("{", "is not valid JSON"),
        "a list": ([1], "not a version-1 qtool training contract"),
    }
    for name, (forged, message) in forgeries.items():
        entry.value = forged if isinstance(forged, str) else json.dumps(forged)
        onnx.save(model, work / "forged.onnx")
        for command in ("rewrite-eval", "rewrite-train"):
            one_line(invoke(command, work / "forged.onnx", "-o", work / "out.onnx"), message)
        assert not (work / "out.onnx").exists(), name
