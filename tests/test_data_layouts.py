"""Inputs whose samples are not on the first axis (a recurrent state [2, batch, H]) and inputs with no
samples axis at all (a scalar sample rate), the way a voice-activity detector is exported."""

import numpy as np
import onnx
import pytest
from model_builders import RNG
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import qtool
from qtool.api import simulate
from qtool.config import CalibrationConfig
from qtool.data import input_specs, load_calibration_data
from qtool.errors import QtoolError
from qtool.model.io import load_model
from qtool.simulate.config import SimulateConfig



def _vad_model(path, batch="batch"):
    """x [batch, 8] -> MatMul -> + ReduceSum(state [2, batch, 4], axis 0) -> * Cast(sr []) / 16000 -> y [batch, 4];
    stateN = state * 2 [2, batch, 4]."""
    w = nh.from_array(RNG.normal(0, 0.5, (8, 4)).astype(np.float32), "W")
    k = nh.from_array(np.array(1 / 16000, np.float32), "k")
    two = nh.from_array(np.array(2, np.float32), "two")
    axes = nh.from_array(np.array([0], np.int64), "axes")
    nodes = [h.make_node("MatMul", ["x", "W"], ["a"]), h.make_node("ReduceSum", ["state", "axes"], ["s"], keepdims=0),
             h.make_node("Add", ["a", "s"], ["t"]), h.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
             h.make_node("Mul", ["srf", "k"], ["f"]), h.make_node("Mul", ["t", "f"], ["y"]),
             h.make_node("Mul", ["state", "two"], ["stateN"])]
    graph = h.make_graph(nodes, "vad", [h.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8]),
                                        h.make_tensor_value_info("state", TensorProto.FLOAT, [2, batch, 4]),
                                        h.make_tensor_value_info("sr", TensorProto.INT64, [])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4]),
                          h.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, batch, 4])], [w, k, two, axes])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def vad(tmp_path_factory):
    path = tmp_path_factory.mktemp("vad") / "vad.onnx"
    _vad_model(path)
    data = {"x": RNG.normal(0, 1, (20, 8)).astype(np.float32),
            "state": RNG.normal(0, 1, (20, 2, 4)).astype(np.float32),  # samples first
            "sr": np.array(16000, np.int64)}
    return path, data


def test_batch_axes_come_from_the_models_batch_symbol(vad):
    path, _ = vad
    specs = {s.name: s for s in input_specs(load_model(path).model)}
    assert (specs["x"].batch_axis, specs["state"].batch_axis, specs["sr"].batch_axis) == (0, 1, None)
    assert specs["state"].describe_stored() == "[batch, 2, 4] (samples first; fed as [2, batch, 4])"


def test_batches_move_the_samples_to_their_axis_and_feed_constants_whole(vad):
    path, data = vad
    loaded = load_calibration_data(data, input_specs(load_model(path).model))
    batches = list(loaded.batches(8))
    assert [loaded.samples_in(b) for b in batches] == [8, 8, 4]
    first = batches[0]
    np.testing.assert_array_equal(first["state"], np.moveaxis(data["state"][:8], 0, 1))
    assert first["sr"].shape == () and int(first["sr"]) == 16000
    picked = loaded.select(data, np.array([1, 3]))  # what finetune feeds from random rows
    assert picked["state"].shape == (2, 2, 4) and picked["x"].shape == (2, 8) and picked["sr"].shape == ()
    np.testing.assert_array_equal(picked["state"][:, 1], data["state"][3])


def test_rewrite_eval_and_simulate_run_such_a_model(vad, tmp_path):
    import onnxruntime as ort

    path, data = vad
    out = tmp_path / "vad.qdq.onnx"
    qtool.rewrite_eval(path, out, calibration_data=data, calibration=CalibrationConfig(batch_size=8))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feed = {"x": data["x"], "state": np.moveaxis(data["state"], 0, 1), "sr": data["sr"]}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], feed)[0]
    got = session.run(["y"], feed)[0]
    assert np.max(np.abs(got - want)) < 0.05 * np.max(np.abs(want))
    rep = simulate(path, data, SimulateConfig(quantized=[out], output="stateN", batch_axis="stateN=1")).report
    assert rep["samples"] == 20 and rep["models"][0]["output"]["sqnr_db"] == float("inf")  # stateN stays float


def test_data_in_the_wrong_layout_is_one_clear_error(vad, tmp_path):
    path, data = vad
    cases = {
        "sr": (np.full(20, 16000, np.int64), r"takes \[\] with no batch axis \(fed whole with every batch\), got shape \[20\]"),
        "state": (np.moveaxis(data["state"], 0, 1),
                  r"expected shape \[batch, 2, 4\] \(samples first; fed as \[2, batch, 4\]\), got \[2, 20, 4\]"),
    }
    for name, (array, message) in cases.items():
        with pytest.raises(QtoolError, match=message):
            qtool.rewrite_eval(path, tmp_path / "o.onnx", calibration_data={**data, name: array})
    with pytest.raises(QtoolError, match="no input with a batch axis"):
        load_calibration_data({"sr": data["sr"]}, [s for s in input_specs(load_model(path).model) if s.name == "sr"])


@pytest.fixture(scope="module")
def sequence_vad(tmp_path_factory):
    """A model run on a whole sequence (silero-vad's 16k_sequence export): x [sequence, 8] -> MatMul ->
    + h [1, 1, 4] (a static initial state, no batch axis) -> y [sequence, 1, 4]."""
    w = nh.from_array(RNG.normal(0, 0.5, (8, 4)).astype(np.float32), "W")
    nodes = [h.make_node("MatMul", ["x", "W"], ["a"]), h.make_node("Unsqueeze", ["a", "one"], ["a3"]),
             h.make_node("Add", ["a3", "h"], ["y"])]
    graph = h.make_graph(nodes, "seq", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["sequence", 8]),
                                        h.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, 4])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["sequence", 1, 4])],
                         [w, nh.from_array(np.array([1], np.int64), "one")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("seq") / "seq.onnx"
    onnx.save(model, str(path))
    return path, {"x": RNG.normal(0, 1, (20, 8)).astype(np.float32),
                  "h": RNG.normal(0, 1, (1, 1, 4)).astype(np.float32)}


def test_a_static_input_beside_batched_ones_is_fed_whole(sequence_vad, tmp_path):
    path, data = sequence_vad
    specs = {s.name: s for s in input_specs(load_model(path).model)}
    assert (specs["x"].batch_axis, specs["h"].batch_axis) == (0, None)
    batches = list(load_calibration_data(data, list(specs.values())).batches(8))
    assert [b["x"].shape[0] for b in batches] == [8, 8, 4] and all(b["h"].shape == (1, 1, 4) for b in batches)
    qtool.rewrite_eval(path, tmp_path / "q.onnx", calibration_data=data)
    with pytest.raises(QtoolError, match=r"takes \[1, 1, 4\] with no batch axis \(fed whole with every batch\), "
                                         r"got shape \[20, 1, 1, 4\]"):
        qtool.rewrite_eval(path, tmp_path / "o.onnx",
                           calibration_data={**data, "h": np.zeros((20, 1, 1, 4), np.float32)})


def test_a_model_exported_for_batch_1_takes_its_state_samples_first(vad, tmp_path):
    """silero-vad's OpenVINO export: input [1, 576], state [2, 1, 128], every shape static."""
    _, data = vad
    path = tmp_path / "static.onnx"
    _vad_model(path, batch=1)
    specs = {s.name: s for s in input_specs(load_model(path).model)}
    assert (specs["x"].batch_axis, specs["state"].batch_axis, specs["sr"].batch_axis) == (0, 1, None)
    loaded = load_calibration_data(data, list(specs.values()))
    assert loaded.fixed_batch == 1 and next(loaded.batches(8))["state"].shape == (2, 1, 4)
    qtool.rewrite_eval(path, tmp_path / "q.onnx", calibration_data=data)


def test_an_unnamed_dynamic_batch_is_the_one_dynamic_axis_of_a_state(vad, tmp_path):
    """silero-vad's TorchScript export: input [?, ?], state [2, ?, 128] with no dimension names. The state's
    samples are on its dynamic axis; its static 2 is no batch of 2 (it fed [2 samples, 2, 128] as
    [2, batch 2, 128], mixing the samples' layers, two samples per batch)."""
    _, data = vad
    path = tmp_path / "unnamed.onnx"
    _vad_model(path, batch=None)
    specs = {s.name: s for s in input_specs(load_model(path).model)}
    assert (specs["x"].batch_axis, specs["state"].batch_axis, specs["sr"].batch_axis) == (0, 1, None)
    loaded = load_calibration_data(data, list(specs.values()))
    feed = next(loaded.batches(8))
    assert loaded.fixed_batch is None and feed["state"].shape == (2, 8, 4)
    np.testing.assert_array_equal(feed["state"][:, 3], data["state"][3])  # sample 3's two rows, in order
    result = qtool.rewrite_eval(path, tmp_path / "q.onnx", calibration_data=data)
    assert result.summary["calibration"]["batches"] == 2  # 20 samples in batches of 16 (not 10 of 2)
