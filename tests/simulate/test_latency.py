"""simulate --latency: one-thread batch-1 timings of the float and quantized models (ratios, not asserted
speeds: no test times anything; benchmarks/deploy.py is where speed goals are checked)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import qtool
from qtool.api import simulate
from qtool.cli import main
from qtool.errors import QtoolError
from qtool.simulate.config import SimulateConfig

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    out = tmp_path_factory.mktemp("latency") / "digits.qdq.onnx"
    qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), str(out), calibration_data=str(SAMPLES / "calib.npz"))
    return out


def test_the_report_has_every_models_time_as_a_multiple_of_float(quantized):
    res = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "eval.npz"),
                   SimulateConfig(labels="labels", quantized=[str(quantized)], latency_rounds=5))
    lat = res.to_dict()["latency"]
    assert lat["rounds"] == 5 and lat["threads"] == 1 and lat["batch"] == 1 and lat["float_ms"] > 0
    (model,) = lat["models"]
    assert model["name"] == res.models[0].name and model["ms"] > 0
    assert model["x_float"] == pytest.approx(model["ms"] / lat["float_ms"])
    text = res.format_text()
    assert "latency in onnxruntime, 1 thread, batch 1 (median of 5 rounds" in text
    assert f"{model['x_float']:.2f}x float" in text
    # without the option nothing is timed
    plain = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "eval.npz"), SimulateConfig(quantized=[str(quantized)]))
    assert plain.to_dict()["latency"] is None and "latency in onnxruntime" not in plain.format_text()


def test_the_what_if_models_are_timed_too():
    res = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "calib.npz"),
                   SimulateConfig(weight_bits="4,8", latency_rounds=3))
    assert [m["name"] for m in res.to_dict()["latency"]["models"]] == [m.name for m in res.models]


@pytest.mark.parametrize("args, rounds", [(["--latency"], 100), (["--latency", "7"], 7)])
def test_cli(quantized, tmp_path, args, rounds):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["simulate", str(SAMPLES / "digits_cnn.onnx"), "--data", str(SAMPLES / "eval.npz"),
                                       "--quantized", str(quantized), *args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["latency"]["rounds"] == rounds


def test_bad_rounds_are_refused():
    with pytest.raises(QtoolError, match="latency rounds must be a non-negative integer"):
        SimulateConfig(latency_rounds=-1)


def test_the_html_report_has_the_latency_table(quantized, tmp_path):
    res = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "eval.npz"),
                   SimulateConfig(quantized=[str(quantized)], latency_rounds=3, histograms=True))
    path = tmp_path / "r.html"
    res.write_html(str(path))
    page = path.read_text()
    ratio = res.to_dict()["latency"]["models"][0]["x_float"]
    assert "Latency in onnxruntime: one thread, batch 1, median of 3" in page and f"{ratio:.2f}x" in page


def test_rewrite_eval_latency_times_the_model_it_wrote_against_the_float_one(tmp_path):
    """``rewrite-eval --latency``: the written model and the float one timed on the first calibration sample
    (the JSON's ``latency``, a summary line); without the option nothing is timed."""
    out = tmp_path / "q.onnx"
    run = CliRunner().invoke(main, ["rewrite-eval", str(SAMPLES / "digits_cnn.onnx"), "-o", str(out),
                                    "--data", str(SAMPLES / "calib.npz"), "--latency", "4", "--json"])
    assert run.exit_code == 0, run.output
    lat = json.loads(run.stdout)["latency"]
    (model,) = lat["models"]
    assert lat["rounds"] == 4 and lat["float_ms"] > 0 and model["name"] == "quantized" and model["ms"] > 0
    result = qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), calibration_data=str(SAMPLES / "calib.npz"),
                                latency_rounds=3)
    ratio = result.latency.models["quantized"] / result.latency.float_ms
    assert f"  latency                {ratio:.2f}x float (" in result.format_text()
    assert "one thread, batch 1, median of 3 rounds)" in result.format_text()
    plain = qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), calibration_data=str(SAMPLES / "calib.npz"))
    assert "latency" not in plain.to_dict() and "latency " not in plain.format_text()


def test_a_quantized_model_no_faster_than_float_is_a_warning():
    from qtool.simulate.latency import Latency, timed_warnings

    assert timed_warnings(Latency(100, 0.5, {"quantized": 0.3})) == []
    (warning,) = timed_warnings(Latency(100, 0.5, {"quantized": 0.52}))
    assert warning.startswith("onnxruntime runs the quantized model no faster than the float one on this machine "
                              "(1.04x float's time: 0.52 ms against 0.5 ms, one thread, batch 1)")


def test_rewrite_eval_latency_needs_data(tmp_path):
    with pytest.raises(QtoolError, match="--latency times the models on the first sample of --data: give --data"):
        qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), latency_rounds=5)
    run = CliRunner().invoke(main, ["rewrite-eval", str(SAMPLES / "digits_cnn.onnx"), "-o", str(tmp_path / "q.onnx"),
                                    "--latency"])
    assert run.exit_code == 2 and "give --data" in run.output and not (tmp_path / "q.onnx").exists()


def _check_by_op(times, integer: bool):
    assert times and all(t["ms"] >= 0 and t["nodes"] >= 1 for t in times)
    assert [t["ms"] for t in times] == sorted((t["ms"] for t in times), reverse=True)
    ops = {t["op"] for t in times}
    # onnxruntime's optimized graph: the int8 model's convolutions run as QLinearConv, the float model's do not
    assert ("QLinearConv" in ops) == integer
    assert ops & {"Conv", "FusedConv", "QLinearConv"}


def test_rewrite_eval_latency_says_where_the_time_goes(tmp_path, monkeypatch):
    """The float and the written model, profiled by onnxruntime: per op type of its optimized graph, the
    milliseconds of a run and the node count (JSON ``latency.by_op``; two summary lines); the profiler's files go to
    a temporary folder that is removed."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), calibration_data=str(SAMPLES / "calib.npz"),
                                latency_rounds=3)
    by_op = result.to_dict()["latency"]["by_op"]
    assert set(by_op) == {"float", "quantized"}
    _check_by_op(by_op["float"], integer=False)
    _check_by_op(by_op["quantized"], integer=True)
    text = result.format_text()
    top = by_op["quantized"][0]
    assert f"    int8 time by op      {top['op']} {top['ms']:.3g} ms x{top['nodes']}" in text
    assert "    float time by op     " in text
    assert list(tmp_path.iterdir()) == []


def test_simulate_latency_profiles_every_model(quantized, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    res = simulate(str(SAMPLES / "digits_cnn.onnx"), str(SAMPLES / "eval.npz"),
                   SimulateConfig(quantized=[str(quantized)], latency_rounds=3))
    by_op = res.to_dict()["latency"]["by_op"]
    assert set(by_op) == {"float", res.models[0].name}
    _check_by_op(by_op["float"], integer=False)
    _check_by_op(by_op[res.models[0].name], integer=True)
    assert list(tmp_path.iterdir()) == []


def test_a_slower_model_shows_where_the_time_goes():
    from qtool.simulate.report import _latency_lines

    times = [{"op": f"Op{i}", "ms": 1.0 / (i + 1), "nodes": i + 1} for i in range(8)]
    lat = {"rounds": 5, "float_ms": 1.0, "models": [{"name": "q", "ms": 1.2, "x_float": 1.2},
                                                     {"name": "fast", "ms": 0.5, "x_float": 0.5}],
           "by_op": {"float": times, "q": times[:2], "fast": times}}
    lines = _latency_lines({"latency": lat}, 100)
    text = "\n".join(lines)
    assert "  slower than float: q" in text
    assert "    float:\n      Op0 1 ms x1, Op1 0.5 ms x2, Op2 0.333 ms x3, Op3 0.25 ms x4, Op4 0.2 ms x5," in text
    assert "3 more op types 0.435 ms" in text  # 1/6 + 1/7 + 1/8
    assert "    q:\n      Op0 1 ms x1, Op1 0.5 ms x2" in text
    assert "    fast:" not in text  # only the slower models and float


def test_op_summary_lines_never_split_an_item():
    from qtool.model.profile import op_summary_lines

    times = [{"op": "MatMulIntegerToFloat", "ms": 0.0705, "nodes": 11}, {"op": "QLinearConv", "ms": 0.05, "nodes": 3},
             {"op": "Add", "ms": 0.01, "nodes": 1}]
    assert op_summary_lines(times, 36) == ["MatMulIntegerToFloat 0.0705 ms x11,", "QLinearConv 0.05 ms x3,",
                                           "Add 0.01 ms x1"]
    assert op_summary_lines(times, 200, top=1) == ["MatMulIntegerToFloat 0.0705 ms x11, 2 more op types 0.06 ms"]


def test_rewrite_eval_latency_is_a_progress_stage():
    """Timing a large model takes a while (2 x (ROUNDS + 10) runs and the profiled ones): a stage of its own."""
    class Stages:
        def __init__(self):
            self.names = []

        def __call__(self, done, total):
            pass

        def stage(self, name, done, total):
            self.names.append(name)

    heard = Stages()
    qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), calibration_data=str(SAMPLES / "calib.npz"),
                       latency_rounds=2, progress=heard)
    assert heard.names[-1] == "timing the float and int8 models in onnxruntime"
    quiet = Stages()
    qtool.rewrite_eval(str(SAMPLES / "digits_cnn.onnx"), calibration_data=str(SAMPLES / "calib.npz"), progress=quiet)
    assert "timing the float and int8 models in onnxruntime" not in quiet.names


def test_the_html_report_says_where_a_slower_models_time_goes():
    from qtool.simulate.html import _latency

    times = [{"op": "QLinearMul", "ms": 0.134, "nodes": 24}]
    lat = {"rounds": 5, "float_ms": 1.0, "models": [{"name": "slow.onnx", "ms": 1.2, "x_float": 1.2},
                                                     {"name": "fast.onnx", "ms": 0.5, "x_float": 0.5}],
           "by_op": {"float": [{"op": "Conv", "ms": 0.3, "nodes": 24}], "slow.onnx": times, "fast.onnx": times}}
    page = "".join(_latency({"latency": lat}))
    assert "Where the time goes in the models slower than float" in page
    assert "<td>slow.onnx</td><td>QLinearMul 0.134 ms x24</td>" in page and "<td>float</td><td>Conv 0.3 ms x24</td>" in page
    assert "<td>fast.onnx</td><td>QLinearMul" not in page
    lat["models"] = lat["models"][1:]
    assert "Where the time goes" not in "".join(_latency({"latency": lat}))


def test_an_unreadable_profile_gives_no_breakdown_and_no_error(tmp_path):
    """The breakdown only explains the timing: a profile onnxruntime did not write (or wrote wrong) leaves it empty."""
    from qtool.model.profile import node_times, op_times

    class Session:
        outputs = ["y"]

        def __init__(self, text):
            self.session, self.text = self, text

        def run(self, feed, names, what):
            pass

        def end_profiling(self):
            if self.text is None:
                return ""
            path = tmp_path / "profile.json"
            path.write_text(self.text)
            return str(path)

    assert op_times(Session(None), {}) == []
    assert node_times(Session("{not json"), {}) == ({}, 0.0)
    assert not (tmp_path / "profile.json").exists()
