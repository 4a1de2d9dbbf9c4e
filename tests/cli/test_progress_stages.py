"""Reading and writing a large model are progress stages (seconds on a BERT-base: no silent wait), in every
command that reads a model file; a small model has none, so that a mistake found while loading stays one line.

``LARGE_MODEL_BYTES`` is lowered to 0 here: the sample model then counts as large.
"""

import os
import re

import numpy as np
import onnx
import pytest
from cli_helpers import invoke

from qtool.model import io as model_io

LOAD = re.compile(r"^qtool [a-z-]+: loading the models? \(\d+ MB\)$")
WRITE = re.compile(r"^qtool [a-z-]+: writing the model \(\d+ MB\)$")


@pytest.fixture
def large(monkeypatch):
    monkeypatch.setattr(model_io, "LARGE_MODEL_BYTES", 0)


def _lines(result):
    assert result.exit_code == 0, result.output
    return result.stderr.splitlines()


def test_rewrite_eval_shows_loading_and_writing(work, large):
    lines = _lines(invoke("rewrite-eval", work / "model.onnx", "-o", work / "q.onnx", "--data", work / "calib.npz"))
    assert LOAD.match(lines[0]) and lines[0].startswith("qtool rewrite-eval: "), lines
    assert lines[1:3] == ["qtool rewrite-eval: calibrating (100 samples)",
                          "qtool rewrite-eval: checking the int8 model against float"]
    assert WRITE.match(lines[3]), lines
    assert lines[4].startswith("qtool rewrite-eval: done in ") and "loading the model" in lines[4]
    assert "writing the model" in lines[4] and len(lines) == 5


def test_rewrite_train_shows_loading_and_writing(work, large):
    lines = _lines(invoke("rewrite-train", work / "model.onnx", "-o", work / "t.onnx", "--data", work / "calib.npz"))
    assert LOAD.match(lines[0]) and lines[1] == "qtool rewrite-train: calibrating (100 samples)", lines
    assert WRITE.match(lines[2]) and lines[3].startswith("qtool rewrite-train: done in ") and len(lines) == 4


def test_calibrate_shows_loading(work, large):
    lines = _lines(invoke("calibrate", work / "model.onnx", "--data", work / "calib.npz", "-o", work / "r.json"))
    assert LOAD.match(lines[0]) and lines[1] == "qtool calibrate: calibrating (100 samples)", lines
    assert lines[2].startswith("qtool calibrate: done in ") and "loading the model" in lines[2] and len(lines) == 3


def test_simulate_shows_loading(work, large):
    lines = _lines(invoke("simulate", work / "model.onnx", "--data", work / "calib.npz"))
    assert LOAD.match(lines[0]) and lines[0].startswith("qtool simulate: loading the model ("), lines
    assert lines[1] == "qtool simulate: calibrating (100 samples)"


def test_small_models_have_no_such_stage_and_a_mistake_stays_one_line(work):
    lines = _lines(invoke("rewrite-eval", work / "model.onnx", "-o", work / "q.onnx", "--data", work / "calib.npz"))
    assert not any("loading" in line or "writing" in line for line in lines)
    np.savez(work / "bad.npz", input=np.zeros((4, 1, 9, 8), np.float32))
    result = invoke("rewrite-eval", work / "model.onnx", "-o", work / "q2.onnx", "--data", work / "bad.npz")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_large_model_bytes_counts_external_data(tmp_path, monkeypatch):
    from onnx import TensorProto
    from onnx import helper as h
    from onnx import numpy_helper as nh

    w = nh.from_array(np.ones((64, 64), np.float32), "W")
    graph = h.make_graph([h.make_node("MatMul", ["x", "W"], ["y"])], "g",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    small, data = os.path.getsize(path), os.path.getsize(tmp_path / "m.data")
    monkeypatch.setattr(model_io, "LARGE_MODEL_BYTES", small + 1)  # the model file alone is below, its data not
    assert model_io.large_model_bytes(path) == small + data
    monkeypatch.setattr(model_io, "LARGE_MODEL_BYTES", small + data + 1)
    assert model_io.large_model_bytes(path) is None
    assert model_io.large_model_bytes(tmp_path / "missing.onnx") is None
    monkeypatch.setattr(model_io, "LARGE_MODEL_BYTES", 64 * 64 * 4)
    assert model_io.large_model_bytes(model_io.load_model(path).model) == 64 * 64 * 4  # a model: its tensors
