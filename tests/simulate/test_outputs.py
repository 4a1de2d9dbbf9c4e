"""Outputs that are not (samples, classes): a time-major RNN state (--batch-axis) and one value per sample."""

import math

import numpy as np
import onnx
import pytest
from model_builders import RNG
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import qtool
from qtool.errors import QtoolError
from qtool.simulate.config import SimulateConfig
from qtool.api import simulate


def _save(graph, path):
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def gru(tmp_path_factory):
    """x [N, 7, 4] -> time-major GRU -> its last state [1, N, 6] -> MatMul: 'state' [1, N, 5] (samples on axis 1)."""
    tmp = tmp_path_factory.mktemp("gru")
    hidden, feat, k = 6, 4, 5
    inits = [nh.from_array(RNG.normal(0, 0.5, shape).astype(np.float32), name)
             for name, shape in (("W", (1, 3 * hidden, feat)), ("R", (1, 3 * hidden, hidden)), ("P", (hidden, k)))]
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="to_time_major"),
             h.make_node("GRU", ["xt", "W", "R"], ["Y", "Y_h"], hidden_size=hidden, name="gru"),
             h.make_node("MatMul", ["Y_h", "P"], ["state"], name="proj")]
    graph = h.make_graph(nodes, "gru", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7, feat])],
                         [h.make_tensor_value_info("state", TensorProto.FLOAT, [1, "N", k])], inits)
    path = _save(graph, tmp / "gru.onnx")
    data = {"x": RNG.normal(0, 1, (40, 7, feat)).astype(np.float32)}
    q = tmp / "gru.qdq.onnx"
    qtool.rewrite_eval(path, q, calibration_data=data)
    return path, q, data


def test_a_time_major_output_needs_its_batch_axis(gru):
    path, q, data = gru
    with pytest.raises(QtoolError, match=r"'state' has shape \[1, 16, 5\]: expected the 16 samples of the batch "
                                         r"on axis 0 \(name the samples axis with --batch-axis"):
        simulate(path, data, SimulateConfig(quantized=[q]))


@pytest.mark.parametrize("axis", [1, "1", "state=1", {"state": 1}, ["state=1"], -2])
def test_with_the_batch_axis_the_numbers_are_per_sample(gru, axis):
    import onnxruntime as ort

    path, q, data = gru
    rep = simulate(path, data, SimulateConfig(quantized=[q], batch_axis=axis, batch_size=16)).report
    assert rep["batch_axis"] in (1, -2) and rep["output_kind"] == "classes"

    def top1(p):
        s = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        out = np.concatenate([s.run(["state"], {"x": data["x"][i : i + 16]})[0] for i in range(0, 40, 16)], axis=1)
        return np.argmax(out[0], axis=1), out

    (ft, f), (qt, qv) = top1(path), top1(q)
    (m,) = rep["models"]
    assert m["agreement"] == np.mean(ft == qt)
    f64, q64 = f.astype(np.float64), qv.astype(np.float64)
    assert m["output"]["sqnr_db"] == pytest.approx(10 * math.log10(np.sum(f64**2) / np.sum((f64 - q64) ** 2)), rel=1e-9)


@pytest.mark.parametrize(
    "axis, message",
    [("nope=1", "batch axis given for output 'nope', but the model .* has no such output"),
     ("state=x", "expected an integer axis"),
     (["1", "0"], "batch axis given twice for all outputs"),
     (3, "has no batch axis 3")],
)
def test_a_bad_batch_axis_is_one_clear_error(gru, axis, message):
    path, q, data = gru
    with pytest.raises(QtoolError, match=message):
        simulate(path, data, SimulateConfig(quantized=[q], batch_axis=axis))


def test_the_config_normalizes_every_spelling_once():
    assert SimulateConfig(batch_axis=None).batch_axis == {"": 0}
    assert SimulateConfig(batch_axis=["a=1", "2"]).batch_axis == {"a": 1, "": 2}
    c = SimulateConfig(weight_bits="4, 8,4", activation_bits=16, quantized="q.onnx", batch_axis={"a": 1})
    assert c.weight_bits == (4, 8) and c.activation_bits == (16,) and c.quantized == ("q.onnx",)
    assert c.axis_for("a") == 1 and c.axis_for("b") == 0 and not c.what_if
    with pytest.raises(Exception):  # frozen
        c.batch_size = 3


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    """x [N, 8] -> Gemm -> Relu -> Gemm -> y [N, 1]: one value per sample."""
    tmp = tmp_path_factory.mktemp("regression")
    inits = [nh.from_array(RNG.normal(0, 0.5, s).astype(np.float32), n)
             for n, s in (("W1", (8, 16)), ("b1", (16,)), ("W2", (16, 1)), ("b2", (1,)))]
    nodes = [h.make_node("Gemm", ["x", "W1", "b1"], ["h"], name="fc1"), h.make_node("Relu", ["h"], ["r"], name="relu"),
             h.make_node("Gemm", ["r", "W2", "b2"], ["y"], name="fc2")]
    graph = h.make_graph(nodes, "reg", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], inits)
    x = RNG.normal(0, 1, (64, 8)).astype(np.float32)
    return _save(graph, tmp / "reg.onnx"), {"x": x, "labels": np.zeros(64, np.int64)}


def test_one_value_per_sample_is_judged_by_sqnr_not_agreement(regression):
    path, data = regression
    res = simulate(path, {"x": data["x"]}, SimulateConfig(activation_bits="4,8"))
    rep = res.report
    assert rep["output_kind"] == "values" and rep["float"]["accuracy"] is None
    a4, a8 = rep["models"]
    for m in (a4, a8):
        assert m["agreement"] is None and m["accuracy"] is None  # not "100% agreement"
        o = m["output"]
        assert o["relative_rms_error"] == pytest.approx(10 ** (-o["sqnr_db"] / 20), rel=1e-9)
    assert a4["output"]["sqnr_db"] < a8["output"]["sqnr_db"]
    text = res.format_text()
    assert "one value per sample" in text and "rel.err" in text and "agreement" not in text
    rows = [line for line in text.splitlines() if line.startswith(("  W8A4 ", "  W8A8 "))]
    assert len(rows) == 2 and not any("%" in r for r in rows)


def test_class_labels_on_one_value_per_sample_are_refused(regression):
    path, data = regression
    with pytest.raises(QtoolError, match="one value per sample .* compare it without labels"):
        simulate(path, data, SimulateConfig(labels="labels"))


# --- outputs with classes at every position: a tagger [N, T, C], a segmenter [N, C, H, W] ----------------
@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """x [N, 6, 8] -> MatMul -> Relu -> MatMul -> y [N, 6, 5]: 5 classes at each of 6 frames."""
    tmp = tmp_path_factory.mktemp("tagger")
    inits = [nh.from_array(RNG.normal(0, 0.5, s).astype(np.float32), n) for n, s in (("W1", (8, 16)), ("W2", (16, 5)))]
    nodes = [h.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"), h.make_node("Relu", ["h"], ["r"], name="relu"),
             h.make_node("MatMul", ["r", "W2"], ["y"], name="fc2")]
    graph = h.make_graph(nodes, "tag", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 8])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 5])], inits)
    path = _save(graph, tmp / "tag.onnx")
    x = RNG.normal(0, 1, (48, 6, 8)).astype(np.float32)
    q = tmp / "tag.qdq.onnx"
    qtool.rewrite_eval(path, q, calibration_data={"x": x}, quant=qtool.QuantConfig(activation_bits=4, weight_bits=4))
    return path, q, x


def _run(path, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_a_tagger_gets_top1_per_frame_with_its_class_axis(tagger):
    path, q, x = tagger
    labels = RNG.integers(0, 5, (48, 6))
    rep = simulate(path, {"x": x, "tags": labels}, SimulateConfig(quantized=[q], labels="tags", class_axis=-1,
                                                                 batch_size=16)).report
    want_float, want_q = _run(path, x).argmax(-1), _run(q, x).argmax(-1)
    assert rep["output_kind"] == "classes" and rep["positions"] == 6 and rep["class_axis"] == -1
    assert rep["float"]["accuracy"] == pytest.approx(np.mean(want_float == labels))
    model = rep["models"][0]
    assert model["agreement"] == pytest.approx(np.mean(want_q == want_float))  # per frame, not per sample
    assert model["accuracy"] == pytest.approx(np.mean(want_q == labels))
    assert model["agreement"] < 1.0  # 4 bits: some frames change


def test_without_a_class_axis_a_tagger_has_no_top1(tagger):
    path, q, x = tagger
    res = simulate(path, {"x": x}, SimulateConfig(quantized=[q]))
    rep = res.report
    assert rep["output_kind"] == "values" and rep["models"][0]["agreement"] is None
    assert any("--class-axis" in note for note in rep["notes"])
    assert "several axes per sample" in res.format_text()
    with pytest.raises(QtoolError, match="per-position labels need --class-axis"):
        simulate(path, {"x": x, "tags": RNG.integers(0, 5, (48, 6))}, SimulateConfig(quantized=[q], labels="tags"))
    with pytest.raises(QtoolError, match="several axes per sample: name its classes axis with --class-axis"):
        simulate(path, {"x": x, "tags": RNG.integers(0, 5, 48)}, SimulateConfig(quantized=[q], labels="tags"))


def test_class_axis_mistakes_are_one_clear_error(tagger):
    path, q, x = tagger
    cases = {0: "is the samples axis", 3: "has 3 axes", -4: "has 3 axes"}
    for axis, message in cases.items():
        with pytest.raises(QtoolError, match=message):
            simulate(path, {"x": x}, SimulateConfig(quantized=[q], class_axis=axis))
    with pytest.raises(QtoolError, match=r"have shape \[5\] per sample, but output 'y' has \[6\] positions"):
        simulate(path, {"x": x, "tags": RNG.integers(0, 5, (48, 5))},
                 SimulateConfig(quantized=[q], labels="tags", class_axis=2))
    with pytest.raises(QtoolError, match="class id 7, but output 'y' has 5 classes"):
        simulate(path, {"x": x, "tags": np.full((48, 6), 7)}, SimulateConfig(quantized=[q], labels="tags", class_axis=2))
    with pytest.raises(QtoolError, match="class axis must be an integer"):
        SimulateConfig(class_axis="last")


def test_a_segmenter_gets_top1_per_pixel_on_its_channel_axis(tmp_path):
    """x [N, 3, 5, 7] -> 1x1 Conv -> y [N, 4, 5, 7]: classes on axis 1, 35 pixels per sample; from the CLI."""
    from click.testing import CliRunner

    from qtool.cli import main

    w = nh.from_array(RNG.normal(0, 0.5, (4, 3, 1, 1)).astype(np.float32), "W")
    graph = h.make_graph([h.make_node("Conv", ["x", "W"], ["y"], name="head")], "seg",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 5, 7])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 5, 7])], [w])
    path = _save(graph, tmp_path / "seg.onnx")
    x = RNG.normal(0, 1, (20, 3, 5, 7)).astype(np.float32)
    labels = RNG.integers(0, 4, (20, 5, 7))
    np.savez(tmp_path / "d.npz", x=x, masks=labels)
    result = CliRunner().invoke(main, ["simulate", str(path), "--data", str(tmp_path / "d.npz"), "--labels", "masks",
                                       "--class-axis", "1", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    import json

    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["positions"] == 35
    assert rep["float"]["accuracy"] == pytest.approx(np.mean(_run(path, x).argmax(1) == labels))


def test_lstm_weights_are_compared_as_the_kernel_reads_them(tmp_path):
    """An LSTM becomes DynamicQuantizeLSTM (qtool's, and onnxruntime's quantize_dynamic): its int8 W and
    R, dequantized in the LSTM's layout, are compared with the float weights, one row each."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from qtool.model.codec import dynamic_lstm_weight

    rng = np.random.default_rng(3)
    hidden, feat = 6, 5
    w = rng.normal(0, 0.5, (2, 4 * hidden, feat)).astype(np.float32)
    r = rng.normal(0, 0.5, (2, 4 * hidden, hidden)).astype(np.float32)
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="/rnn/Transpose"),
             h.make_node("LSTM", ["xt", "W", "R"], ["Y"], hidden_size=hidden, direction="bidirectional",
                         name="/rnn/LSTM")]
    graph = h.make_graph(nodes, "tagger", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7, feat])],
                         [h.make_tensor_value_info("Y", TensorProto.FLOAT, [7, 2, "N", hidden])],
                         [nh.from_array(w, "W"), nh.from_array(r, "R")])
    path = _save(graph, tmp_path / "lstm.onnx")
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.normal(0, 1, (16, 7, feat)).astype(np.float32))
    ort_q = tmp_path / "lstm.ort.onnx"
    quantize_dynamic(str(path), str(ort_q), weight_type=QuantType.QInt8)
    res = simulate(path, data, SimulateConfig(quantized=[ort_q], batch_axis=2))
    res_qtool = simulate(path, data, SimulateConfig(calibration_data=data, batch_axis=2))
    for m in (res.report["models"][0], res_qtool.report["models"][0]):
        rows = {x["role"]: x for x in m["weights"] if x["op"] == "LSTM"}
        assert set(rows) == {"W", "R"} and all(x["layer"] == "/rnn/LSTM" for x in rows.values()), m["weights"]
        assert all(x["sqnr_db"] is not None and 30 < x["sqnr_db"] < 60 for x in rows.values())
    rows = {x["role"]: x for x in res_qtool.report["models"][0]["weights"]}
    for role, array in (("W", w), ("R", r)):
        deq = dynamic_lstm_weight(array, bits=8, symmetric=True, per_channel=True).dequantized()
        err = array.astype(np.float64) - deq
        want = 10 * np.log10(np.sum(array.astype(np.float64) ** 2) / np.sum(err ** 2))
        assert rows[role]["sqnr_db"] == pytest.approx(want, rel=1e-9)
        assert rows[role]["max_abs_error"] == pytest.approx(np.max(np.abs(err)), rel=1e-6)


def test_an_output_without_a_samples_axis_is_compared_with_batch_axis_none(tmp_path):
    """Yolo-FastestV2 (PyTorch 1.8, opset 11) takes [1, 3, 352, 352] and returns [605, 95]: its one image's
    cells, no samples axis. simulate's error named only --batch-axis OUTPUT=AXIS, which no axis satisfies;
    ``none`` compares the output as one sample per batch."""
    from model_builders import Builder, x_data

    b = Builder(opset=11)
    y = b.node("Transpose", [b.conv(b.input("x", [1, 3, 8, 8]), 3, 8)], perm=[0, 2, 3, 1])
    b.node("Reshape", [y, b.const(np.array([-1, 8], np.int64))], outputs=["cells"])
    path = _save(b.proto(["cells"]).graph, tmp_path / "cells.onnx")
    data = {"x": x_data(6, 3, 8, 8)}
    with pytest.raises(QtoolError, match=r"\[64, 8\]: expected the 1 samples .* or OUTPUT=none for an output that"):
        simulate(path, data, SimulateConfig())
    for axis in ("none", "cells=none", ["None"]):
        rep = simulate(path, data, SimulateConfig(batch_axis=axis)).report
        assert rep["batch_axis"] is None and rep["samples"] == 6 and rep["models"][0]["output"]["sqnr_db"] > 20
    rep = simulate(path, data, SimulateConfig(batch_axis="none", class_axis=-1)).report
    assert rep["positions"] == 64
