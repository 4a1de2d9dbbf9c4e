"""The JAX interpreter's LSTM, GRU and RNN against onnxruntime (ONNX semantics: gates iofc / zrh,
directions, sequence_lens, initial states, peepholes, linear_before_reset, clip, activations), the
batch-first layout against the sequence-first one (onnxruntime has no layout=1 kernel), clear errors
for what it does not implement, and an LSTM training graph (weights fake-quantized) == onnxruntime."""

from pathlib import Path

import jax
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qtool
from qtool.errors import QtoolError
from qtool.finetune.interpreter import Interpreter

T, B, I, H = 7, 3, 5, 4
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_model(kind, direction="forward", layout=0, seq=False, init=False, peepholes=False, **attrs):
    rng = np.random.default_rng(3)
    d = 2 if direction == "bidirectional" else 1
    g = GATES[kind]
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(np.float32), name) for name, shape in
             (("W", (d, g * H, I)), ("R", (d, g * H, H)), ("B", (d, 2 * g * H)))]
    x_shape = [B, T, I] if layout else [T, B, I]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    feeds = {"X": rng.normal(0, 1, x_shape).astype(np.float32)}
    names = ["X", "W", "R", "B", "lens" if seq else "", "h0" if init else ""]
    if seq:
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [B]))
        feeds["lens"] = np.array([T, 2, 5], np.int32)
    state = [B, d, H] if layout else [d, B, H]
    states = ["h0", "c0"] if kind == "LSTM" else ["h0"]
    for s in states if init else ():
        inputs.append(helper.make_tensor_value_info(s, TensorProto.FLOAT, state))
        feeds[s] = rng.normal(0, 1, state).astype(np.float32)
    if kind == "LSTM":
        names.append("c0" if init else "")
        if peepholes:
            names.append("P")
            inits.append(numpy_helper.from_array(rng.normal(0, 0.5, (d, 3 * H)).astype(np.float32), "P"))
    outputs = ["Y", "Y_h", "Y_c"][:3 if kind == "LSTM" else 2]
    node = helper.make_node(kind, names, outputs, hidden_size=H, direction=direction, name="rnn",
                            **({"layout": 1} if layout else {}), **attrs)
    graph = helper.make_graph([node], "rnn", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), feeds


def jax_run(model, feeds):
    interpreter = Interpreter(model)
    return {k: np.asarray(v) for k, v in jax.jit(interpreter.run)(feeds).items()}


def onnxruntime_run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


CASES = [
    dict(kind="LSTM"),
    dict(kind="LSTM", direction="reverse", seq=True, init=True),
    dict(kind="LSTM", direction="bidirectional", seq=True, init=True, peepholes=True),
    dict(kind="LSTM", clip=0.5, activations=["Sigmoid", "Tanh", "Relu"]),
    dict(kind="GRU", direction="bidirectional", seq=True, init=True),
    dict(kind="GRU", direction="reverse", seq=True, linear_before_reset=1, clip=1.0, activations=["Sigmoid", "Relu"]),
    dict(kind="RNN", direction="bidirectional", seq=True, init=True, activations=["Relu", "Tanh"]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_recurrent_op_matches_onnxruntime(case):
    model, feeds = recurrent_model(**case)
    expected = onnxruntime_run(model, feeds)
    got = jax_run(model, feeds)
    for name, want in zip(["Y", "Y_h", "Y_c"], expected):
        np.testing.assert_allclose(got[name], want, atol=2e-6, rtol=0)
    if case.get("seq"):  # outputs past a sequence's end are 0
        assert not got["Y"][2:, :, 1].any() and got["Y"][1, :, 1].any()


def test_batch_first_layout_is_the_transposed_sequence_first_one():
    first, feeds = recurrent_model("LSTM", direction="bidirectional", seq=True, init=True)
    batch, _ = recurrent_model("LSTM", direction="bidirectional", seq=True, init=True, layout=1)
    want = jax_run(first, feeds)
    moved = {k: (np.swapaxes(v, 0, 1) if v.ndim == 3 else v) for k, v in feeds.items()}
    got = jax_run(batch, moved)
    np.testing.assert_allclose(got["Y"], np.transpose(want["Y"], (2, 0, 1, 3)), atol=1e-6, rtol=0)
    for name in ("Y_h", "Y_c"):
        np.testing.assert_allclose(got[name], np.swapaxes(want[name], 0, 1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("attrs, message", [
    (dict(activations=["Sigmoid", "Tanh", "Softsign"]), "activation 'Softsign' is not supported"),
    (dict(activation_alpha=[0.1]), "activation_alpha/activation_beta are not supported"),
    (dict(input_forget=1), "input_forget=1 is not supported"),
])
def test_what_is_not_implemented_is_a_clear_error(attrs, message):
    model, feeds = recurrent_model("LSTM", **attrs)
    with pytest.raises(QtoolError, match=message):
        Interpreter(model).run(feeds)


def test_lstm_training_graph_matches_onnxruntime():
    """rewrite-train's LSTM graph (W/R fake-quantized per channel, shape [D, 4H, 1] ranges): the JAX forward
    with quantization on equals onnxruntime's within float32 rounding."""
    model, feeds = recurrent_model("LSTM", direction="bidirectional", seq=True, init=True)
    proto = ir.serde.serialize_model(qtool.rewrite_train(model).model)
    step = {"qtool_step": np.array(5, np.int64)}
    expected = onnxruntime_run(proto, {**feeds, **step})
    got = jax_run(proto, {**feeds, **step})
    for output, want in zip(proto.graph.output, expected):
        np.testing.assert_allclose(got[output.name], want, atol=2e-6, rtol=0)
    plain = onnxruntime_run(model, feeds)[0]
    assert np.abs(got["Y"] - plain).max() > 1e-4  # the weights were quantized


def test_torch_exported_tagger_matches_onnxruntime():
    """torch's export of a 2-layer bidirectional LSTM and a GRU (linear_before_reset=1, initial states from
    Shape/ConstantOfShape): the JAX forward equals onnxruntime's within float32 rounding."""
    path = Path(__file__).resolve().parents[1] / "data" / "recurrent" / "torch_rnn_tagger.onnx"
    x = np.load(path.with_suffix(".npz"))["x"]
    model = onnx.load(path)
    want = onnxruntime_run(model, {"x": x})[0]
    got = jax_run(model, {"x": x})["logits"]
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
