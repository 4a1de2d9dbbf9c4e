"""``rewrite-eval --calibration-method auto``: every method's ranges from one histogram pass, the model
written with each, and the one whose outputs on the first calibration samples are closest to float's kept."""

import math
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from model_builders import x_data
from test_output_check import convnet

import qtool
import qtool.api
from qtool.calibrate.observers import CandidatesObserver
from qtool.config import CalibrationConfig, QuantConfig
from qtool.errors import QtoolError
from qtool.simulate.output_check import WARN_DB, sqnr_db

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MODEL, CALIB = SAMPLES / "digits_cnn.onnx", SAMPLES / "calib.npz"


def written(result) -> bytes:
    return ir.serde.serialize_model(result.model).SerializeToString()


def run(model, feeds):
    proto = model if not isinstance(model, ir.Model) else ir.serde.serialize_model(model)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def loud_sample():
    """Twenty values a thousand times larger than the rest, in one sample after the first batch (which the
    check runs): min/max ranges leave the others a few codes (their output is noise); a 99 % percentile
    cuts them off."""
    x = x_data(24, 4, 12, 12)
    x[20].reshape(-1)[:20] = 1000.0
    return {"x": x}


def test_auto_keeps_the_method_whose_output_is_closest_to_float_and_writes_what_that_method_writes():
    model, x = convnet(), loud_sample()  # (random weights: one model for both rewrites)
    auto = qtool.rewrite_eval(model, calibration_data=x, calibration=CalibrationConfig(method="auto", percentile=99.0))
    summary = auto.to_dict()
    check, kept = summary["output_check"], summary["calibration"]["chosen"]
    assert list(check["tried"]) == ["minmax", "percentile", "mse"]
    assert check["tried"]["minmax"] < WARN_DB and kept == "percentile" == check["method"]
    assert check["tried"][kept] == max(check["tried"].values()) > check["tried"]["minmax"] + 3
    assert check["tried_calibrated_on"] == 8  # each method judged on the first 16 samples, calibrated on the rest
    judged = qtool.rewrite_eval(model, calibration_data={"x": x["x"][16:]},
                                calibration=CalibrationConfig(method=kept, percentile=99.0))
    first = {"x": x["x"][:16]}
    assert math.floor(sqnr_db(run(model, first), run(judged.model, first)) * 100) / 100 == check["tried"][kept]
    alone = qtool.rewrite_eval(model, calibration_data=x, calibration=CalibrationConfig(method=kept, percentile=99.0))
    assert written(auto) == written(alone)  # the same ranges as that method's own observer finds
    assert summary["calibration"]["method"] == "auto" and f"auto: {kept}" in auto.format_text()
    line = next(line for line in auto.format_text().splitlines() if "calibration methods" in line)
    assert "percentile" in line and "dB (kept)" in line and line.index("minmax") < line.index("percentile")


def test_auto_keeps_min_max_unless_another_method_is_clearly_closer():
    """The sample model's methods are within a fraction of a dB of each other: min/max (tried first) stays,
    and the model is the one --calibration-method minmax writes, to the byte."""
    auto = qtool.rewrite_eval(str(MODEL), calibration_data=str(CALIB), calibration=CalibrationConfig(method="auto"))
    minmax = qtool.rewrite_eval(str(MODEL), calibration_data=str(CALIB))
    tried = auto.to_dict()["output_check"]["tried"]
    assert auto.to_dict()["calibration"]["chosen"] == "minmax"
    assert max(tried.values()) <= tried["minmax"] + 0.5
    assert written(auto) == written(minmax)


def test_when_no_method_reaches_the_bar_the_warning_says_they_were_all_tried():
    result = qtool.rewrite_eval(convnet(), calibration_data=loud_sample(), calibration=CalibrationConfig(method="auto"),
                                quant=QuantConfig(activation_bits=2))
    tried = result.to_dict()["output_check"]["tried"]
    assert max(tried.values()) < WARN_DB
    warning = next(w for w in result.warnings if "far from the float model" in w)
    assert f"the best of {len(tried)} calibration methods" in warning and "Try" not in warning


def test_auto_tries_no_entropy_and_works_at_any_bit_width():
    """Not entropy (observers.AUTO_METHODS: it cost detectors their detections where the output check
    improved); at 12 bits, where entropy would need 16384 histogram bins, auto works as at 8."""
    result = qtool.rewrite_eval(convnet(), calibration_data=loud_sample(), calibration=CalibrationConfig(method="auto"),
                                quant=QuantConfig(activation_bits=12))
    assert list(result.to_dict()["output_check"]["tried"]) == ["minmax", "percentile", "mse"]


def test_one_histogram_gives_each_methods_range():
    """From one pass, each method's range as its own observer finds it: over every batch (the held-out
    first batch's histogram merged back exactly), and over the batches after the held-out one."""
    from qtool.calibrate.observers import make_observer

    x = np.random.default_rng(3).standard_normal(50_000).astype(np.float32) ** 3
    x[7] = 100.0  # the largest value only in the held-out batch
    batches = (x[:20_000], x[20_000:35_000], x[35_000:])
    auto = CandidatesObserver(held_out=1)
    for batch in batches:
        auto.update(batch)
    for held_out, seen in ((False, batches), (True, batches[1:])):
        for method, found in auto.candidates(held_out).items():
            alone = make_observer(method, num_bits=8)
            for batch in seen:
                alone.update(batch)
            assert found == alone.range(), (method, held_out)
    assert auto.range() == (float(x.min()), 100.0) and auto.candidates(True)["minmax"][1] < 100.0


def test_auto_is_for_rewrite_eval_only(tmp_path):
    auto = CalibrationConfig(method="auto")
    for call in (lambda: qtool.api.calibrate(str(MODEL), str(CALIB), calibration=auto),
                 lambda: qtool.api.calibrate_to_file(str(MODEL), str(CALIB), tmp_path / "r.json", calibration=auto),
                 lambda: qtool.rewrite_train(str(MODEL), calibration_data=str(CALIB), calibration=auto)):
        with pytest.raises(QtoolError, match="auto chooses by the int8 model it writes: rewrite-eval only"):
            call()
    assert not (tmp_path / "r.json").exists()


def test_with_no_sample_beyond_the_checked_ones_each_method_is_judged_on_its_own_samples():
    result = qtool.rewrite_eval(convnet(), calibration_data={"x": x_data(16, 4, 12, 12)},
                                calibration=CalibrationConfig(method="auto"))
    check = result.to_dict()["output_check"]
    assert check["tried_calibrated_on"] is None and len(check["tried"]) == 3
    assert check["sqnr_db"][next(iter(check["sqnr_db"]))] == check["tried"][check["method"]]
    line = next(line for line in result.format_text().splitlines() if "calibration methods" in line)
    assert line.endswith("(the worst output's SQNR with each)")


def test_auto_without_a_float_output_keeps_min_max_and_says_so():
    """A model whose only output is an ArgMax's class ids: auto has nothing to choose by."""
    from model_builders import Builder
    from onnx import TensorProto

    b = Builder(opset=13, constants=True, named=False)
    y = b.node("Relu", [b.conv(b.input("x", ["N", 4, 12, 12]), 4, 8)])
    ids = b.node("ArgMax", [b.node("Flatten", [b.conv(y, 8, 4)])], axis=1)
    b.output(ids, TensorProto.INT64)
    result = qtool.rewrite_eval(b.proto([]), calibration_data={"x": x_data(40, 4, 12, 12)},
                                calibration=CalibrationConfig(method="auto"))
    assert result.to_dict()["calibration"]["chosen"] == "minmax"
    assert "--calibration-method auto had no float output to choose by: min/max ranges" in result.warnings
