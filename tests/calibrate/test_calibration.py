"""Calibration data checks, the streaming runner and observers."""

import importlib
import math
import tracemalloc

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import qtool
from qtool.data import InputSpec, input_specs, load_calibration_data
from qtool.calibrate.observers import MinMaxObserver, Observer, make_observer, observer_names, register_observer
from qtool.calibrate.runner import collect_ranges
from qtool.config import CalibrationConfig
from qtool.errors import QtoolError

SPEC = [InputSpec("x", np.dtype(np.float32), ("N", 3, 4))]


def two_input_model(batch="N"):
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], np.linspace(-1, 1, 8).astype(np.float32))
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["r"]),
        helper.make_node("Mul", ["r", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [batch, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 2])], [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return ir.serde.deserialize_model(model)


# --- data --------------------------------------------------------------------------------
def test_input_specs_skip_initializers_and_keep_dynamic_dims():
    (x, s) = input_specs(two_input_model())
    assert x.name == "x" and x.dtype == np.float32 and x.shape == ("N", 4)
    assert s.name == "s"


def test_single_input_takes_npy_or_any_single_array(tmp_path):
    arr = np.zeros((5, 3, 4), np.float32)
    np.save(tmp_path / "a.npy", arr)
    np.savez(tmp_path / "b.npz", whatever=arr)
    for path in (tmp_path / "a.npy", tmp_path / "b.npz"):
        data = load_calibration_data(str(path), SPEC)
        assert data.num_samples == 5 and list(data.arrays) == ["x"]


def test_extra_arrays_are_ignored_and_reported(tmp_path):
    np.savez(tmp_path / "e.npz", x=np.zeros((5, 3, 4), np.float32), labels=np.zeros(5, np.int64))
    data = load_calibration_data(str(tmp_path / "e.npz"), SPEC)
    assert data.ignored == ["labels"]


@pytest.mark.parametrize(
    "arrays,message",
    [
        ({"y": np.zeros((5, 4), np.float32), "z": np.zeros((5, 2), np.float32)},
         "no array for model input 'x'"),
        ({"x": np.zeros((5, 4), np.float64), "s": np.zeros((5, 2), np.float32)},
         "input 'x': expected dtype float32, got float64"),
        ({"x": np.zeros((5, 5), np.float32), "s": np.zeros((5, 2), np.float32)},
         r"input 'x': expected shape \[N, 4\], got \[5, 5\]"),
        ({"x": np.zeros((5, 4, 1), np.float32), "s": np.zeros((5, 2), np.float32)},
         "input 'x': expected 2 dimensions"),
        ({"x": np.zeros((5, 4), np.float32), "s": np.zeros((6, 2), np.float32)},
         "different numbers of samples"),
        ({"x": np.zeros((0, 4), np.float32), "s": np.zeros((0, 2), np.float32)}, "no samples"),
    ],
)
def test_data_that_does_not_fit_says_which_input_and_what_was_expected(arrays, message):
    with pytest.raises(QtoolError, match=message):
        load_calibration_data(arrays, input_specs(two_input_model()))


def test_one_array_for_two_inputs_is_an_error():
    with pytest.raises(QtoolError, match="single array .* 2 inputs"):
        load_calibration_data(np.zeros((5, 4), np.float32), input_specs(two_input_model()))


def test_fixed_batch_size_needs_a_multiple():
    specs = input_specs(two_input_model(batch=4))
    data = load_calibration_data({"x": np.zeros((8, 4), np.float32), "s": np.zeros((8, 2), np.float32)}, specs)
    assert data.fixed_batch == 4 and data.num_batches(3) == 2
    with pytest.raises(QtoolError, match="fixed batch size of 4.*6 samples"):
        load_calibration_data({"x": np.zeros((6, 4), np.float32), "s": np.zeros((6, 2), np.float32)}, specs)


def test_bad_files(tmp_path):
    with pytest.raises(QtoolError, match="does not exist"):
        load_calibration_data(str(tmp_path / "none.npz"), SPEC)
    bad = tmp_path / "bad.npz"
    bad.write_text("not numpy")
    with pytest.raises(QtoolError, match="not a valid .npz or .npy"):
        load_calibration_data(str(bad), SPEC)


# --- runner --------------------------------------------------------------------------------
def feeds(n, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 4)).astype(np.float32), "s": rng.standard_normal((n, 2)).astype(np.float32)}


@pytest.mark.parametrize("batch_size", [1, 3, 16, 100])
def test_ranges_equal_min_max_over_all_data_whatever_the_batch_size(batch_size):
    model = two_input_model()
    f = feeds(23)
    data = load_calibration_data(f, input_specs(model))
    result = collect_ranges(model, ["x", "mm", "r", "y"], data, CalibrationConfig(batch_size=batch_size))
    w = np.linspace(-1, 1, 8).astype(np.float32).reshape(4, 2)
    mm = f["x"] @ w
    r = np.maximum(mm, 0)
    y = r * f["s"]
    for name, ref in (("x", f["x"]), ("mm", mm), ("r", r), ("y", y)):
        lo, hi = result.ranges[name]
        assert lo == pytest.approx(float(ref.min()), rel=1e-6, abs=1e-7)
        assert hi == pytest.approx(float(ref.max()), rel=1e-6, abs=1e-7)
    assert result.num_batches == math.ceil(23 / batch_size) and result.num_samples == 23
    # the model is unchanged: the extra outputs were only for the session
    assert [o.name for o in model.graph.outputs] == ["y"]


def test_progress_reports_samples():
    model = two_input_model()
    data = load_calibration_data(feeds(10), input_specs(model))
    calls = []
    collect_ranges(model, ["r"], data, CalibrationConfig(batch_size=4),
                   progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 10), (4, 10), (8, 10), (10, 10)]


def test_memory_does_not_grow_with_the_number_of_samples():
    """Observers keep a fixed state: 10x the samples costs no more Python memory."""
    model = two_input_model()

    def peak(n):
        data = load_calibration_data(feeds(n), input_specs(model))
        tracemalloc.start()
        collect_ranges(model, ["mm", "r", "y"], data, CalibrationConfig(batch_size=8))
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    small, large = peak(80), peak(800)
    assert large < small * 1.5 + 50_000


class CountingObserver(Observer):
    name = "count"

    def __init__(self):
        self.batches = 0

    def update(self, batch):
        self.batches += 1

    def range(self):
        return (-float(self.batches), float(self.batches))


def test_observers_are_pluggable():
    register_observer("count", CountingObserver)
    assert "count" in observer_names()
    model = two_input_model()
    data = load_calibration_data(feeds(10), input_specs(model))
    result = collect_ranges(model, ["r"], data, CalibrationConfig(method="count", batch_size=3))
    assert result.ranges["r"] == (-4.0, 4.0)
    with pytest.raises(QtoolError, match="unknown calibration method 'nope'"):
        make_observer("nope")


def test_minmax_observer_ignores_nan_and_reports_nothing_without_finite_values():
    obs = MinMaxObserver()
    obs.update(np.array([np.nan, 2.0, -1.0], np.float32))
    obs.update(np.array([], np.float32))
    assert obs.range() == (-1.0, 2.0)
    empty = MinMaxObserver()
    empty.update(np.array([np.nan], np.float32))
    assert empty.range() is None


def test_top_level_calibrate_finds_the_tensors_rewrite_eval_quantizes():
    model = two_input_model()
    result = qtool.api.calibrate(model, feeds(12))
    # the MatMul's input and its Relu; the Mul has an unquantized input ('s')
    assert set(result.ranges) == {"x", "r"}
    # named tensors are observed as given; qtool.calibrate is the package, not a callable
    assert set(qtool.api.calibrate(model, feeds(12), ["mm"]).ranges) == {"mm"}
    assert not callable(importlib.import_module("qtool.calibrate"))
