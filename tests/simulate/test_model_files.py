"""Models with external data, run from another folder: simulate opens them like every command does."""

import os

import onnx
import pytest
from sim_helpers import CALIB, EVAL, MODEL

import qtool
from qtool.api import simulate
from qtool.simulate.config import SimulateConfig


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("external")
    models = tmp / "models"
    models.mkdir()
    proto = onnx.load(str(MODEL))
    for node in proto.graph.node:  # Constant nodes -> initializers, so the weights can live in the data file
        if node.op_type == "Constant":
            tensor = onnx.helper.get_attribute_value(node.attribute[0])
            tensor.name = node.output[0]
            proto.graph.initializer.append(tensor)
    keep = [n for n in proto.graph.node if n.op_type != "Constant"]
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    onnx.save(proto, str(models / "float.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="float.onnx.data", size_threshold=0)
    q = models / "q8.onnx"
    qtool.rewrite_eval(models / "float.onnx", q, calibration_data=CALIB)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return models, elsewhere


def test_external_data_from_another_folder(external, monkeypatch):
    models, elsewhere = external
    assert (models / "float.onnx.data").stat().st_size > 10_000
    assert any(f.startswith("q8.onnx.qt-") for f in os.listdir(models))  # rewrite-eval keeps external data external
    monkeypatch.chdir(elsewhere)  # relative external data paths must not resolve against the working folder
    what_if = simulate(models / "float.onnx", EVAL, SimulateConfig(labels="labels", calibration_data=CALIB, sensitivity=True)).report
    given = simulate(models / "float.onnx", EVAL, SimulateConfig(labels="labels", quantized=[models / "q8.onnx"], sensitivity=True)).report
    plain = simulate(MODEL, EVAL, SimulateConfig(labels="labels", calibration_data=CALIB, sensitivity=True)).report
    for rep in (what_if, given):
        (m,) = rep["models"]
        assert m["output"] == plain["models"][0]["output"]  # the same model, the same numbers
        assert len(m["sensitivity"]) == 5 and len(m["activations"]) == 10
        assert all(a.get("problem") is None for a in m["activations"])
