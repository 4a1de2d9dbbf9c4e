"""LSTMs run as onnxruntime's com.microsoft.DynamicQuantizeLSTM with qtool's int8 weights; GRU/RNN
stay float with their reason; the training graph fake-quantizes LSTM weights on the deployed grid.

The models are built with onnx.helper the way torch exports an ``nn.LSTM`` tagger (opset 17,
``[seq, batch, features]`` after a Transpose, a Linear head): a forward LSTM then a
bidirectional one, the second reading ``sequence_lens`` and initial states."""

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qtool
from qtool.config import QuantConfig
from qtool.model.codec import dynamic_lstm_weight

T, B, I, H, H2, C = 6, 4, 5, 8, 6, 3
RNG = np.random.default_rng(7)
W1 = RNG.normal(0, 0.4, (1, 4 * H, I)).astype(np.float32)
R1 = RNG.normal(0, 0.4, (1, 4 * H, H)).astype(np.float32)
B1 = RNG.normal(0, 0.2, (1, 8 * H)).astype(np.float32)
W2 = RNG.normal(0, 0.4, (2, 4 * H2, H)).astype(np.float32)
R2 = RNG.normal(0, 0.4, (2, 4 * H2, H2)).astype(np.float32)
B2 = RNG.normal(0, 0.2, (2, 8 * H2)).astype(np.float32)
FC = RNG.normal(0, 1.5, (2 * H2, C)).astype(np.float32)


def tagger(recurrent: str = "LSTM") -> onnx.ModelProto:
    """x [batch, seq, I] -> Transpose -> LSTM (forward) -> Squeeze -> LSTM (bidirectional, sequence_lens,
    initial states fed batch first and transposed) -> Transpose/Reshape -> MatMul + Add.
    ``recurrent="GRU"``: GRUs instead."""
    gates = 4 if recurrent == "LSTM" else 3
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (W1[:, :gates * H], "W1"), (R1[:, :gates * H], "R1"), (B1[:, :2 * gates * H], "B1"),
        (W2[:, :gates * H2], "W2"), (R2[:, :gates * H2], "R2"), (B2[:, :2 * gates * H2], "B2"), (FC, "fc.weight"),
        (np.zeros(C, np.float32) + 0.1, "fc.bias"), (np.array([1], np.int64), "axis1"),
        (np.array([0, 0, 2 * H2], np.int64), "shape"))]
    extra = ["h0", "c0"] if recurrent == "LSTM" else ["h0"]
    outs1 = ["Y1", "Y1h", "Y1c"] if recurrent == "LSTM" else ["Y1", "Y1h"]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="/rnn/Transpose"),
        helper.make_node(recurrent, ["xt", "W1", "R1", "B1"], outs1, hidden_size=H, name="/rnn/L0"),
        helper.make_node("Squeeze", ["Y1", "axis1"], ["y1"], name="/rnn/Squeeze"),
        *[helper.make_node("Transpose", [n], [f"{n}t"], perm=[1, 0, 2], name=f"/rnn/{n}/Transpose") for n in extra],
        helper.make_node(recurrent, ["y1", "W2", "R2", "B2", "lens", *[f"{n}t" for n in extra]], ["Y2"],
                         hidden_size=H2,
                         direction="bidirectional", name="/rnn/L1"),
        helper.make_node("Transpose", ["Y2"], ["y2t"], perm=[2, 0, 1, 3], name="/rnn/Transpose_1"),
        helper.make_node("Reshape", ["y2t", "shape"], ["y2"], name="/rnn/Reshape"),
        helper.make_node("MatMul", ["y2", "fc.weight"], ["mm"], name="/fc/MatMul"),
        helper.make_node("Add", ["mm", "fc.bias"], ["logits"], name="/fc/Add"),
    ]
    states = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2, H2]) for n in extra]
    graph = helper.make_graph(nodes, "tagger", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", T, I]),
        helper.make_tensor_value_info("lens", TensorProto.INT32, ["batch"]), *states],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", T, C])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def feeds(n: int = B, seed: int = 0, recurrent: str = "LSTM") -> dict:
    rng = np.random.default_rng(seed)
    data = {"x": rng.normal(0, 1, (n, T, I)).astype(np.float32), "lens": rng.integers(2, T + 1, n).astype(np.int32),
            "h0": rng.normal(0, 0.3, (n, 2, H2)).astype(np.float32)}
    if recurrent == "LSTM":
        data["c0"] = rng.normal(0, 0.3, (n, 2, H2)).astype(np.float32)
    return data


def run(model, data: dict, outputs=None) -> list:
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    declared = {o.name for o in model.graph.output}
    if any(o not in declared for o in outputs or ()):
        model = onnx.ModelProto.FromString(model.SerializeToString())
        for name in outputs:
            if name not in declared:  # an intermediate tensor (the second LSTM's Y)
                model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(outputs, data)


def deploy(quant: QuantConfig = QuantConfig(), model=None, recurrent: str = "LSTM"):
    result = qtool.rewrite_eval(model if model is not None else tagger(recurrent),
                                calibration_data=feeds(64, seed=1, recurrent=recurrent), quant=quant)
    return ir.serde.serialize_model(result.model), result


def initializer(model: onnx.ModelProto, suffix: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith(suffix))


def dynamic_nodes(model: onnx.ModelProto) -> list:
    return [n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM" and n.domain == "com.microsoft"]


def test_lstm_runs_as_dynamic_quantize_lstm_and_matches_float():
    quantized, result = deploy()
    nodes = dynamic_nodes(quantized)
    assert len(nodes) == 2 and not [n for n in quantized.graph.node if n.op_type == "LSTM"]
    second = next(n for n in nodes if n.name.startswith("/rnn/L1/"))
    assert second.input[4] == "lens" and second.input[5] == "h0t" and second.input[6] == "c0t"  # passed through
    attrs = {a.name: helper.get_attribute_value(a) for a in second.attribute}
    assert attrs["direction"] == b"bidirectional" and attrs["hidden_size"] == H2
    # the report: integer (dynamic), not float
    s = result.summary
    assert [r["layer"] for r in s["recurrent"]] == ["/rnn/L0", "/rnn/L1"]
    assert s["counts"]["lstms_dynamic"] == 2
    assert not [x for x in s["left_in_float"] + s["float_ops"] if x["op"] == "LSTM"]
    assert "LSTMs                  2" in result.format_text()
    # onnxruntime runs it; its outputs stay within the int8 error of float: max |error| < 2% of max |logit|
    data = feeds(32, seed=2)
    ref = run(tagger(), data)[0]
    got = run(quantized, data)[0]
    assert np.abs(ref).max() > 1
    assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max()
    # the LSTM itself (its hidden states are in (-1, 1)): within 0.02
    ref, got = run(tagger(), data, ["Y2"])[0], run(quantized, data, ["Y2"])[0]
    assert 0.0005 < np.abs(got - ref).max() < 0.02  # quantized (not float), and close
    # rewriting the result again changes nothing (qtool's own DynamicQuantizeLSTM is recognised)
    again = qtool.rewrite_eval(quantized, calibration_data=feeds(16, seed=1))
    assert not again.summary["changed"]


def test_written_weights_are_the_codecs_quantization():
    quantized, _ = deploy()
    for name, w, rows in (("L0", W1, 4 * H), ("L1", W2, 4 * H2)):
        stored = initializer(quantized, f"/rnn/{name}/lstm_quant/W_quantized")
        scale = initializer(quantized, f"/rnn/{name}/lstm_quant/W_scale")
        zp = initializer(quantized, f"/rnn/{name}/lstm_quant/W_zero_point")
        dirs, _, k = w.shape
        assert stored.dtype == np.int8 and stored.shape == (dirs, k, rows)  # ONNX's W transposed
        assert scale.shape == zp.shape == (dirs, rows) and not zp.any()  # per channel, zero points 0
        expected = dynamic_lstm_weight(w, bits=8, symmetric=True, per_channel=True)
        np.testing.assert_array_equal(stored, expected.stored)
        np.testing.assert_array_equal(scale, expected.scale)
        # independently: symmetric narrow 8-bit grid, one range per (direction, gate row)
        np.testing.assert_allclose(scale, np.abs(w).max(axis=2) / 127, rtol=1e-6)
        deq = np.transpose(stored.astype(np.float32) * scale[:, None, :], (0, 2, 1))
        assert np.all(np.abs(deq - w) <= scale[..., None] / 2 * (1 + 1e-5))
        np.testing.assert_array_equal(deq, expected.dequantized())


def test_options_the_kernel_allows():
    # per tensor, asymmetric: one range, its zero point (any int8) repeated per direction
    quantized, _ = deploy(QuantConfig(per_channel=False, symmetric_weights=False))
    scale = initializer(quantized, "/rnn/L1/lstm_quant/R_scale")
    assert scale.shape == (2,) and scale[0] == scale[1]
    expected = dynamic_lstm_weight(R2, bits=8, symmetric=False, per_channel=False)
    np.testing.assert_array_equal(initializer(quantized, "/rnn/L1/lstm_quant/R_zero_point"), expected.zero_point)
    assert expected.zero_point[0] != 0
    ref = run(tagger(), feeds(8, seed=3), ["Y2"])[0]
    assert np.abs(run(quantized, feeds(8, seed=3), ["Y2"])[0] - ref).max() < 0.02
    # asymmetric per channel is impossible (int8 per-channel zero points must be 0): symmetric, with a note
    quantized, result = deploy(QuantConfig(symmetric_weights=False))
    assert not initializer(quantized, "/rnn/L0/lstm_quant/W_zero_point").any()
    assert any("symmetric per channel" in n for n in result.summary["notes"])
    # 4-bit weights in the int8 container
    quantized, _ = deploy(QuantConfig(weight_bits=4))
    stored = initializer(quantized, "/rnn/L0/lstm_quant/W_quantized")
    assert stored.dtype == np.int8 and stored.min() >= -7 and stored.max() <= 7 and np.abs(stored).max() == 7
    run(quantized, feeds(2))


@pytest.mark.parametrize("quant, reason", [
    (QuantConfig(float_rnn=True), "kept in float (--float-rnn)"),
    (QuantConfig(standard_ops=True), "kept in float (--standard-ops)"),
    (QuantConfig(weight_bits=12), "8 bits at most"),
    (QuantConfig(exclude=frozenset({"/rnn/L1"})), "excluded"),
])
def test_lstm_left_in_float_with_its_reason(quant, reason):
    quantized, result = deploy(quant)
    left = [x for x in result.summary["left_in_float"] if x["op"] == "LSTM"]
    assert left and all(reason in x["reason"] for x in left)
    assert len([n for n in quantized.graph.node if n.op_type == "LSTM"]) == len(left)
    assert len(dynamic_nodes(quantized)) == 2 - len(left)
    run(quantized, feeds(2))


def test_gru_stays_float_with_the_reason():
    quantized, result = deploy(recurrent="GRU")
    left = [x for x in result.summary["left_in_float"] if x["op"] == "GRU"]
    assert [x["node"] for x in left] == ["/rnn/L0", "/rnn/L1"]
    assert all("no integer kernel for GRU" in x["reason"] for x in left)
    assert [n.op_type for n in quantized.graph.node].count("GRU") == 2
    assert not [x for x in result.summary["float_ops"] if x["op"] == "GRU"]  # reported once


def test_training_graph_quantizes_lstm_weights_on_the_deployed_grid():
    train = qtool.rewrite_train(tagger(), calibration_data=feeds(16, seed=1))
    contract = train.contract
    lstm_quantizers = [q for q in contract["weight_quantizers"] if q["op"] == "LSTM"]
    assert len(lstm_quantizers) == 4  # W and R of both layers
    assert {"W1", "R1", "B1", "W2", "R2", "B2"} <= set(contract["parameters"])  # they train
    proto = ir.serde.serialize_model(train.model)
    outputs = [q["output"] for q in lstm_quantizers]
    for name in outputs:
        proto.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    values = run(proto, {**feeds(2), "qtool_step": np.array(10, np.int64)}, outputs)
    deployed, _ = deploy(model=ir.serde.serialize_model(train.model))
    for q, fake_quantized in zip(lstm_quantizers, values):
        layer, what = q["layers"][0].split("/")[-1], q["input"][0]
        stored = initializer(deployed, f"/rnn/{layer}/lstm_quant/{what}_quantized")
        scale = initializer(deployed, f"/rnn/{layer}/lstm_quant/{what}_scale")
        deq = np.transpose(stored.astype(np.float32) * scale[:, None, :], (0, 2, 1))
        np.testing.assert_array_equal(fake_quantized, deq)


EXPORTED = Path(__file__).resolve().parents[1] / "data" / "recurrent" / "torch_rnn_tagger.onnx"


def test_torch_exported_tagger():
    """torch's export (tests/data/recurrent/make_rnn.py): a 2-layer bidirectional LSTM (two ONNX LSTMs)
    becomes two DynamicQuantizeLSTM; its GRU stays float with the reason; logits within 2% of float."""
    x = np.load(EXPORTED.with_suffix(".npz"))["x"]
    result = qtool.rewrite_eval(str(EXPORTED), calibration_data={"x": x})
    quantized = ir.serde.serialize_model(result.model)
    assert len(dynamic_nodes(quantized)) == 2
    assert [x["op"] for x in result.summary["left_in_float"]] == ["GRU"]
    ref = run(onnx.load(EXPORTED), {"x": x})[0]
    got = run(quantized, {"x": x})[0]
    assert 0 < np.abs(got - ref).max() < 0.02 * np.abs(ref).max()


def test_float_rnn_on_the_command_line(tmp_path):
    """``qtool rewrite-eval --float-rnn`` keeps the LSTMs; the training graph records the option and
    deploys with it."""
    from click.testing import CliRunner

    from qtool.cli import main

    data = tmp_path / "calib.npz"
    np.savez(data, x=np.load(EXPORTED.with_suffix(".npz"))["x"])
    out, train, deployed = tmp_path / "q.onnx", tmp_path / "train.onnx", tmp_path / "train.q.onnx"
    for args in (["rewrite-eval", EXPORTED, "-o", out, "--float-rnn", "--data", data],
                 ["rewrite-train", EXPORTED, "-o", train, "--float-rnn", "--data", data],
                 ["rewrite-eval", train, "-o", deployed]):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
    assert "kept in float (--float-rnn)" in result.output
    for path in (out, deployed):
        ops = [n.op_type for n in onnx.load(path).graph.node]
        assert ops.count("LSTM") == 2 and "DynamicQuantizeLSTM" not in ops


def test_lstm_weights_unsqueezed_from_constants():
    """spox (silero-vad's OpenVINO export) writes W and R as Unsqueeze of a 2-D Constant: still constants, so
    the LSTM deploys as DynamicQuantizeLSTM, and the training graph quantizes the same weights."""
    model = tagger()
    graph = model.graph
    for name in ("W1", "R1"):
        array = next(numpy_helper.to_array(t) for t in graph.initializer if t.name == name)
        graph.initializer.remove(next(t for t in graph.initializer if t.name == name))
        graph.node.insert(0, helper.make_node("Unsqueeze", [f"{name}_2d", "axis0"], [name]))
        graph.node.insert(0, helper.make_node("Constant", [], [f"{name}_2d"], value=numpy_helper.from_array(array[0])))
    graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    quantized, result = deploy(model=model)
    assert len(dynamic_nodes(quantized)) == 2 and result.summary["counts"]["lstms_dynamic"] == 2
    np.testing.assert_array_equal(run(quantized, feeds(4, seed=2))[0], run(deploy()[0], feeds(4, seed=2))[0])
    train = qtool.rewrite_train(model, calibration_data=feeds(16, seed=1)).contract
    assert len([q for q in train["weight_quantizers"] if q["op"] == "LSTM"]) == 4


def test_lstm_weights_concatenated_from_constants_are_not_activations():
    """spox also writes W as Unsqueeze(Concat(Concat(Slices), Concat(Slices))) of a 2-D Constant (the gates
    reordered at run time): tensors computed from constants alone, which onnxruntime folds. No Concat group
    is quantized there (it made QLinearConcat nodes onnxruntime could no longer fold, and fed the float LSTM
    weights on an 8-bit activation grid): qtool folds the expression into W (model.weight_expressions), and
    the LSTM runs as DynamicQuantizeLSTM like the others."""
    model = tagger()
    graph = model.graph
    w1 = next(t for t in graph.initializer if t.name == "W1")
    graph.initializer.remove(w1)
    graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), n) for v, n in
                              (([0], "s0"), ([H], "s1"), ([2 * H], "s2"), ([3 * H], "s3"), ([4 * H], "s4"))])
    c = numpy_helper.from_array(numpy_helper.to_array(w1)[0], "W1_c")
    slices = [helper.make_node("Slice", ["W1_c", f"s{k}", f"s{k + 1}", "s0"], [f"W1_{k}"]) for k in range(4)]
    head = [helper.make_node("Constant", [], ["W1_c"], value=c), *slices,
                      helper.make_node("Concat", ["W1_1", "W1_0"], ["W1_a"], axis=0),
                      helper.make_node("Concat", ["W1_3", "W1_2"], ["W1_b"], axis=0),
                      helper.make_node("Concat", ["W1_a", "W1_b"], ["W1_2d"], axis=0),
                      helper.make_node("Unsqueeze", ["W1_2d", "s0"], ["W1"])]
    for node in reversed(head):
        graph.node.insert(0, node)
    quantized, result = deploy(model=model)
    assert not [a for a in result.summary["activations"] if a["tensor"].startswith("W1")]
    assert not [n for n in quantized.graph.node if n.op_type == "DequantizeLinear" and n.output[0].startswith("W1")]
    assert not [x for x in result.summary["left_in_float"] if x["op"] == "LSTM"]
    assert result.summary["counts"]["weight_expressions_folded"] == 1 and result.summary["counts"]["lstms_dynamic"] == 2
    assert not [n for n in quantized.graph.node if n.op_type in ("Slice", "Concat")]
    train = qtool.rewrite_train(model, calibration_data=feeds(16, seed=1)).contract
    assert not [q for q in train["activation_quantizers"] if q["tensor"].startswith("W1")]


def test_standard_ops_write_no_onnxruntime_op_and_survive_a_training_graph(tmp_path):
    """``--standard-ops``: the deployed model holds ai.onnx ops only (for runtimes other than onnxruntime),
    given at rewrite-eval of a training graph too, which was written without it (a deployment option: no
    warning that it differs from what was trained)."""
    from click.testing import CliRunner

    from qtool.cli import main

    data = tmp_path / "calib.npz"
    np.savez(data, x=np.load(EXPORTED.with_suffix(".npz"))["x"])
    out, train, deployed = tmp_path / "q.onnx", tmp_path / "train.onnx", tmp_path / "train.q.onnx"
    for args in (["rewrite-eval", EXPORTED, "-o", out, "--standard-ops", "--data", data],
                 ["rewrite-train", EXPORTED, "-o", train, "--data", data],
                 ["rewrite-eval", train, "-o", deployed, "--standard-ops"]):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        assert "not what was trained" not in result.output
    assert "kept in float (--standard-ops)" in result.output
    for path in (out, deployed):
        model = onnx.load(path)
        assert {n.domain for n in model.graph.node} == {""} and "com.microsoft" not in {o.domain for o in model.opset_import}
        assert [n.op_type for n in model.graph.node].count("LSTM") == 2
        onnx.checker.check_model(model, full_check=True)

