"""Outputs sorted along their classes (TopK's values): their top-1 is a fixed place, so simulate reports no top-1,
accuracy or agreement for them (text, JSON, HTML) and judges them by SQNR; a classifier's logits keep theirs."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from model_builders import RNG
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qtool.api import simulate
from qtool.cli import main
from qtool.kernels import metrics as m
from qtool.simulate.config import SimulateConfig


def _save(nodes, outputs, inits, path, features=8):
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
                         [h.make_tensor_value_info(name, TensorProto.FLOAT, ["N", None]) for name in outputs], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _classifier_nodes(k):
    """x [N, 8] -> Gemm -> logits [N, 10] -> TopK(k): 'top' (sorted scores), and the logits themselves."""
    inits = [nh.from_array(RNG.normal(0, 0.5, (8, 10)).astype(np.float32), "W"),
             nh.from_array(RNG.normal(0, 0.1, 10).astype(np.float32), "b"),
             nh.from_array(np.array([k], np.int64), "k")]
    nodes = [h.make_node("Gemm", ["x", "W", "b"], ["logits"], name="fc"),
             h.make_node("TopK", ["logits", "k"], ["top", "index"], name="topk")]
    return nodes, inits


@pytest.fixture(scope="module")
def topk(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("topk")
    nodes, inits = _classifier_nodes(5)
    path = _save(nodes, ["top", "logits"], inits, tmp / "topk.onnx")
    return path, {"x": RNG.normal(0, 1, (48, 8)).astype(np.float32)}


def test_sorted_rows_kernel():
    assert m.sorted_rows(np.array([[3, 2, 2], [1, 0, -1]], np.float32)) == m.SORTED_DESCENDING
    assert m.sorted_rows(np.array([[0, 1, 1], [-1, 0, 5]], np.float32)) == m.SORTED_ASCENDING
    assert m.sorted_rows(np.array([[2, 2, 2]], np.float32)) == m.SORTED_DESCENDING | m.SORTED_ASCENDING
    assert m.sorted_rows(np.array([[3, 2, 1], [1, 2, 3]], np.float32)) == 0
    assert m.sorted_rows(np.array([[3, np.nan, 1]], np.float32)) == 0
    assert m.sorted_rows(np.array([[1, 3, 2]], np.float32)) == 0


def test_topk_values_have_no_agreement_but_the_logits_do(topk):
    path, data = topk
    res = simulate(path, data, SimulateConfig())
    rep = res.report
    assert rep["output"] == "top" and rep["output_kind"] == "values"
    assert rep["no_top1"] == "sorted: top-1 always the first place"
    assert rep["models"][0]["agreement"] is None and rep["models"][0]["accuracy"] is None
    assert any("'top' is sorted along its 5 classes in every one of the 48 rows" in n for n in rep["notes"])
    text = res.format_text()
    assert "(sorted: top-1 always the first place: SQNR, no top-1)" in text and "agreement" not in text

    logits = simulate(path, data, SimulateConfig(output="logits")).report
    assert logits["output_kind"] == "classes" and logits["no_top1"] is None
    assert logits["models"][0]["agreement"] is not None


def test_labels_on_topk_values_give_no_accuracy(topk):
    path, data = topk
    rep = simulate(path, {**data, "y": np.zeros(48, np.int64)}, SimulateConfig(labels="y")).report
    assert rep["float"]["accuracy"] is None and rep["models"][0]["accuracy"] is None  # not "100 %": every label 0


def test_two_sorted_values_of_a_topk_are_known_from_the_graph(tmp_path):
    """Two values are always sorted one way or the other: the data alone cannot tell, the TopK can."""
    nodes, inits = _classifier_nodes(2)
    path = _save(nodes + [h.make_node("Sigmoid", ["top"], ["p"], name="squash")], ["p"], inits, tmp_path / "k2.onnx")
    rep = simulate(path, {"x": RNG.normal(0, 1, (16, 8)).astype(np.float32)}, SimulateConfig()).report
    assert rep["output_kind"] == "values" and rep["models"][0]["agreement"] is None


def test_an_ascending_output_is_known_from_the_data(tmp_path):
    """A cumulative sum of non-negative values: no TopK, but every row ascends: top-1 always the last place."""
    inits = [nh.from_array(RNG.normal(0, 0.5, (8, 6)).astype(np.float32), "W"), nh.from_array(np.array(1), "axis")]
    nodes = [h.make_node("MatMul", ["x", "W"], ["h"], name="fc"), h.make_node("Relu", ["h"], ["r"], name="relu"),
             h.make_node("CumSum", ["r", "axis"], ["c"], name="cumsum")]
    path = _save(nodes, ["c"], inits, tmp_path / "cum.onnx")
    rep = simulate(path, {"x": RNG.normal(0, 1, (32, 8)).astype(np.float32)}, SimulateConfig()).report
    assert rep["no_top1"] == "sorted: top-1 always the last place" and rep["models"][0]["agreement"] is None


def test_a_classifier_sorted_by_chance_on_few_samples_keeps_its_agreement(tmp_path):
    """Three logits dominated by a descending bias: every row is sorted. On two samples that can be chance (1 in
    9), so the agreement stays; on sixty-four it cannot, and the output is taken for sorted scores."""
    inits = [nh.from_array(RNG.normal(0, 0.01, (8, 3)).astype(np.float32), "W"),
             nh.from_array(np.array([2.0, 1.0, 0.0], np.float32), "b")]
    path = _save([h.make_node("Gemm", ["x", "W", "b"], ["y"], name="fc")], ["y"], inits, tmp_path / "c3.onnx")
    x = RNG.normal(0, 1, (64, 8)).astype(np.float32)
    few = simulate(path, {"x": x[:2]}, SimulateConfig()).report
    assert few["output_kind"] == "classes" and few["models"][0]["agreement"] == 1.0
    many = simulate(path, {"x": x}, SimulateConfig()).report
    assert many["output_kind"] == "values" and many["models"][0]["agreement"] is None


def test_the_cli_reports_sorted_values_without_agreement(topk, tmp_path):
    path, data = topk
    np.savez(tmp_path / "d.npz", **data)
    result = CliRunner().invoke(main, ["simulate", str(path), "--data", str(tmp_path / "d.npz"), "--json",
                                       str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "sorted: top-1 always the first place" in result.output and "agreement" not in result.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["no_top1"] == "sorted: top-1 always the first place" and rep["models"][0]["agreement"] is None
    page = (tmp_path / "r.html").read_text()
    assert "no top-1: sorted: top-1 always the first place; judged by SQNR" in page
    assert "agreement with float" not in page
