"""Calibration files read lazily, the runner's memory settings, and warnings about degenerate data."""

import gc
import io
import json
import zipfile

import numpy as np
import onnxruntime as ort
import pytest

from qtool import data as data_module
from qtool.api import calibrate_to_file
from qtool.calibrate.runner import collect_ranges
from qtool.data import InputSpec, input_specs, load_calibration_data
from qtool.config import CalibrationConfig
from qtool.model.session import tapped_session, value_map
from qtool.errors import QtoolError

from test_calibration import feeds, two_input_model

SPEC = [InputSpec("x", np.dtype(np.float32), ("N", 3, 4))]


def _npy_bytes(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def _batches(data, size):
    return [b["x"].copy() for b in data.batches(size)]


# --- lazy reading ---------------------------------------------------------------------------
def test_arrays_the_model_does_not_use_are_never_opened(tmp_path, monkeypatch):
    x = np.arange(7 * 12, dtype=np.float32).reshape(7, 3, 4)
    path = tmp_path / "d.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", _npy_bytes(x))
        z.writestr("labels.npy", b"\x93NUMPY garbage that no reader accepts")  # would fail if read
        z.writestr("objects.npy", _npy_bytes(np.array([{"a": 1}], dtype=object)))  # pickled: refused if read
    opened = []
    real_open = zipfile.ZipFile.open

    def spy(self, name, *args, **kwargs):
        opened.append(name if isinstance(name, str) else name.filename)
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    data = load_calibration_data(str(path), SPEC)
    assert data.ignored == ["labels", "objects"] and data.num_samples == 7
    got = _batches(data, 3)
    assert [len(b) for b in got] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate(got), x)
    assert set(opened) == {"x.npy"}


@pytest.mark.parametrize("kind", ["npz", "npz_compressed", "npy", "fortran"])
def test_batches_read_from_the_file_equal_the_array(tmp_path, kind):
    x = np.random.default_rng(0).standard_normal((11, 3, 4)).astype(np.float32)
    path = tmp_path / ("d.npy" if kind == "npy" else "d.npz")
    if kind == "npz":
        np.savez(path, x=x, other=np.zeros(3))
    elif kind == "npz_compressed":
        np.savez_compressed(path, x=x)
    elif kind == "npy":
        np.save(path, x)
    else:
        np.savez(path, x=np.asfortranarray(x))
    data = load_calibration_data(str(path), SPEC)
    for size in (1, 4, 11, 16):
        got = _batches(data, size)
        assert all(b.flags.c_contiguous for b in got)
        np.testing.assert_array_equal(np.concatenate(got), x)


def test_only_one_batch_is_read_ahead(tmp_path, monkeypatch):
    """The rows come from the file batch by batch: before the first batch is used, one batch has been read."""
    x = np.ones((100, 3, 4), np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    data = load_calibration_data(str(tmp_path / "d.npz"), SPEC)
    read = []
    real_open = data_module.StoredArray._open

    class Counting:
        def __init__(self, cm):
            self.cm = cm

        def __enter__(self):
            stream = self.cm.__enter__()

            class Wrapped:
                def __getattr__(self, name):
                    return getattr(stream, name)

                def read(self, n=-1):
                    out = stream.read(n)
                    read.append(len(out))
                    return out

                def readinto(self, buffer):
                    got = stream.readinto(buffer)
                    read.append(got)
                    return got

            return Wrapped()

        def __exit__(self, *exc):
            return self.cm.__exit__(*exc)

    monkeypatch.setattr(data_module.StoredArray, "_open", lambda self: Counting(real_open(self)))
    batches = data.batches(10)
    next(batches)
    assert sum(read) < 10 * x[0].nbytes + 512  # one batch of rows plus the header
    batches.close()


def test_broken_needed_arrays_are_clear_errors(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10, 3, 4)})
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("x.npy", header.getvalue() + b"\0" * 100)  # 10 samples announced, less than one stored
    data = load_calibration_data(str(tmp_path / "short.npz"), SPEC)
    with pytest.raises(QtoolError, match="array 'x' of .*ends early"):
        _batches(data, 4)
    with zipfile.ZipFile(tmp_path / "obj.npz", "w") as z:
        z.writestr("x.npy", _npy_bytes(np.array([None] * 3, dtype=object)))
    with pytest.raises(QtoolError, match="Python objects"):
        load_calibration_data(str(tmp_path / "obj.npz"), SPEC)
    with zipfile.ZipFile(tmp_path / "junk.npz", "w") as z:
        z.writestr("x.npy", b"not an array")
    with pytest.raises(QtoolError, match="array 'x' of .*not a valid .npy array"):
        load_calibration_data(str(tmp_path / "junk.npz"), SPEC)
    np.savez(tmp_path / "ok.npz", x=np.zeros((2, 3, 4), np.float32))
    raw = bytearray((tmp_path / "ok.npz").read_bytes())
    raw[:4] = b"PK\x03\x05"  # the member's local header is damaged; the directory at the end is intact
    (tmp_path / "damaged.npz").write_bytes(bytes(raw))
    with pytest.raises(QtoolError, match="array 'x' of .*damaged.npz'"):
        load_calibration_data(str(tmp_path / "damaged.npz"), SPEC)


# --- the runner's memory -------------------------------------------------------------------
def test_session_keeps_the_memory_settings_that_keep_peak_memory_flat():
    model = two_input_model()
    values = value_map(model.graph)
    session = tapped_session(model, [values["mm"], values["r"]]).session
    options = session.get_session_options()
    assert options.enable_mem_pattern is False  # a pattern block on top of the outputs from batch 2 on
    assert options.enable_cpu_mem_arena is True  # glibc keeps freed batches otherwise


def test_no_onnxruntime_value_outlives_its_batch():
    """Between batches no OrtValue is alive: one kept would keep all of a batch's outputs in memory."""
    model = two_input_model()
    data = load_calibration_data(feeds(10), input_specs(model))
    live = []

    def progress(done, total):
        gc.collect()
        live.append(sum(isinstance(o, ort.OrtValue) for o in gc.get_objects()))

    collect_ranges(model, ["mm", "r", "y"], data, CalibrationConfig(batch_size=4), progress=progress)
    assert live == [0, 0, 0, 0]


# --- degenerate data -----------------------------------------------------------------------
@pytest.fixture()
def model_path(tmp_path):
    import onnx_ir as ir

    path = tmp_path / "m.onnx"
    ir.save(two_input_model(), str(path))
    return str(path)


@pytest.mark.parametrize("method", ["minmax", "ema", "percentile"])
def test_a_single_inf_is_named_and_left_out_of_the_range(tmp_path, model_path, method):
    clean = feeds(64)
    bad = {k: v.copy() for k, v in clean.items()}
    bad["x"][37, 2] = np.inf  # batch 3 of 16
    out = tmp_path / "r.json"
    summary = calibrate_to_file(model_path, bad, out, calibration=CalibrationConfig(method, 16)).to_dict()
    assert ("tensor 'x': 1 of 256 values is +inf (first in batch 3); the range ignores non-finite values"
            in summary["warnings"])
    assert not any("no finite value" in w for w in summary["warnings"])
    ranges = json.loads(out.read_text())["tensors"]
    reference = calibrate_to_file(model_path, {k: np.delete(v, 37, axis=0) for k, v in clean.items()},
                                  tmp_path / "ref.json", calibration=CalibrationConfig(method, 16)).to_dict()
    assert reference["warnings"] == []
    lo, hi = ranges["x"]["min"], ranges["x"]["max"]
    assert np.isfinite([lo, hi]).all()
    if method == "minmax":  # the finite values of x, without the row holding the inf
        assert (lo, hi) == (float(np.nanmin(np.where(np.isinf(bad["x"]), np.nan, bad["x"]))),
                            float(np.nanmax(np.where(np.isinf(bad["x"]), np.nan, bad["x"]))))


def test_huge_values_are_reported_as_such(tmp_path, model_path):
    big = {k: v * np.float32(1e30) for k, v in feeds(64).items()}
    summary = calibrate_to_file(model_path, big, tmp_path / "r.json", calibration=CalibrationConfig(batch_size=16)).to_dict()
    top = float(np.abs(big["x"]).max())
    assert summary["warnings"] == [
        f"values reach {top:.3g} (tensor 'x' and 1 more tensor(s)): beyond 1.8e+19 a product of two float32 "
        "values overflows to inf, so the data is likely unscaled or corrupt"
    ]
    wide = {k: np.clip(v, -1, 1) * np.float32(3e38) for k, v in feeds(64).items()}
    warnings = calibrate_to_file(model_path, wide, tmp_path / "w.json", calibration=CalibrationConfig(batch_size=16)).to_dict()["warnings"]
    assert any(w.startswith("the range of tensor 'x'") and "overflows the float32 arithmetic of quantization" in w
               for w in warnings)


def test_tensors_without_any_finite_value_say_which_values_they_saw(tmp_path, model_path):
    model, data = two_input_model(), feeds(20)
    data["x"][:] = np.inf  # x @ w mixes +inf and -inf: NaN downstream
    loaded = load_calibration_data(data, input_specs(model))
    result = collect_ranges(model, ["x", "mm", "s"], loaded, CalibrationConfig(batch_size=8))
    assert "tensor 'x': all 80 values are +inf: no range (rewrite-eval gives it the default range)" in result.warnings()
    assert any(w.startswith("tensor 'mm': all 40 values are ") and "no range" in w for w in result.warnings())
    assert result.ranges["x"] is None and result.ranges["s"] is not None
    # no tensor with a finite value: every range would be the default, and nothing is written
    with pytest.raises(QtoolError, match=r"no finite value in any of the 2 tensor\(s\) it observed over the 20 "):
        calibrate_to_file(model_path, data, tmp_path / "r.json", calibration=CalibrationConfig(batch_size=8))
    assert not (tmp_path / "r.json").exists()


def test_rewrites_give_the_same_warnings_about_the_data():
    import qtool

    data = feeds(32)
    data["x"][5, 1] = -np.inf
    want = "tensor 'x': 1 of 128 values is -inf (first in batch 1); the range ignores non-finite values"
    assert want in qtool.rewrite_eval(two_input_model(), calibration_data=data).warnings
    assert want in qtool.rewrite_train(two_input_model(), calibration_data=data).summary["warnings"]
