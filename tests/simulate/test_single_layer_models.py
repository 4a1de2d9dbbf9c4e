"""``--sensitivity``'s single-layer models undo every quantizer but one layer's. Undoing all of them must give back
the float model (to float rounding): every form rewrite-eval (or onnxruntime's quantizer) writes must be undone,
or every single-layer number of such a model is wrong (or the whole simulate run fails in onnxruntime)."""

import math
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import qtool
from qtool.api import simulate
from qtool.simulate.compare import no_quantizer_model
from qtool.simulate.config import SimulateConfig

EXPORTED = Path(__file__).resolve().parents[1] / "data" / "exported"


def _run(model, feeds: dict) -> np.ndarray:
    proto = ir.serde.serialize_model(model) if isinstance(model, ir.Model) else model
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _sqnr(ref: np.ndarray, test: np.ndarray) -> float:
    ref, test = ref.astype(np.float64), test.astype(np.float64)
    err = np.sum((ref - test) ** 2)
    return math.inf if err == 0 else 10 * math.log10(np.sum(ref ** 2) / err)


def _no_quantizer_sqnr(float_path, quantized: ir.Model, feeds: dict) -> float:
    none, why = no_quantizer_model(quantized, ir.load(str(float_path)))
    assert none is not None, why
    return _sqnr(_run(onnx.load(str(float_path)), feeds), _run(none, feeds))


@pytest.mark.parametrize("name, form", [
    ("legacy17_MobileBlock", "depthwise channels padded to 16 (the depthwise Conv's group widened)"),
    ("legacy17_SEBlock", "RGB stem's input codes padded to 4 channels, a squeeze-excite gate's codes tiled"),
    ("legacy11_ResBlock", "a narrow Conv's outputs widened to 16 and its codes sliced back"),
    ("legacy17_Decoder", "a ConvTranspose written as a Conv and a DepthToSpace"),
    ("legacy17_PostNormBlock", "Linear layers on [B, S, K] written as Reshape -> Gemm -> Reshape"),
])
def test_the_model_with_no_quantizer_is_the_float_model(name, form):
    """Before: the weight of a rewritten layer had no float value (every single-layer model skipped), or a float
    weight of the layer's old shape met the widened graph (onnxruntime failed: 'M: 8 group: 16')."""
    path = EXPORTED / f"{name}.onnx"
    data = dict(np.load(EXPORTED / f"{name}.npz"))
    quantized = qtool.rewrite_eval(path, calibration_data=EXPORTED / f"{name}.npz").model
    assert _no_quantizer_sqnr(path, quantized, data) > 80, form


def _save(graph, path, opset=17) -> Path:
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_grayscale_stem_and_two_element_pools(tmp_path):
    """A stride-2 stem on 1 channel reads its input codes through a SpaceToDepth (its weight in the stride-1 form),
    and an AveragePool over 2 elements becomes a depthwise Conv that the float model does not have."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (16, 1, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.2, (16, 16, 3, 3)).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1], kernel_shape=[3, 3],
                         name="/stem/Conv"),
             h.make_node("Relu", ["c1"], ["r1"], name="/stem/Relu"),
             h.make_node("AveragePool", ["r1"], ["p1"], kernel_shape=[2, 1], strides=[2, 1], name="/pool/AveragePool"),
             h.make_node("Conv", ["p1", "w2"], ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3], name="/head/Conv")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 32, 64])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                         [nh.from_array(w1, "w1"), nh.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b1"),
                          nh.from_array(w2, "w2")])
    path = _save(graph, tmp_path / "gray.onnx")
    x = rng.normal(0, 1, (8, 1, 32, 64)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    result = qtool.rewrite_eval(path, calibration_data=tmp_path / "d.npz")
    ops = {n.op_type for n in result.model.graph}
    assert {"SpaceToDepth"} <= ops and "AveragePool" not in ops, ops  # the forms this test is about
    assert _no_quantizer_sqnr(path, result.model, {"x": x}) > 80


def _lstm_model(tmp_path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(1)
    hidden, feat = 6, 5
    w = rng.normal(0, 0.5, (1, 4 * hidden, feat)).astype(np.float32)
    r = rng.normal(0, 0.5, (1, 4 * hidden, hidden)).astype(np.float32)
    fc = rng.normal(0, 0.5, (hidden, 3)).astype(np.float32)
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="/rnn/Transpose"),
             h.make_node("LSTM", ["xt", "W", "R"], ["Y"], hidden_size=hidden, name="/rnn/LSTM"),
             h.make_node("Squeeze", ["Y", "axis"], ["ys"], name="/rnn/Squeeze"),
             h.make_node("MatMul", ["ys", "fc"], ["y"], name="/fc/MatMul")]
    graph = h.make_graph(nodes, "tagger", [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7, feat])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                         [nh.from_array(w, "W"), nh.from_array(r, "R"), nh.from_array(fc, "fc"),
                          nh.from_array(np.array([1], np.int64), "axis")])
    return _save(graph, tmp_path / "lstm.onnx"), rng.normal(0, 1, (16, 7, feat)).astype(np.float32)


def test_an_lstm_is_read_in_float_and_is_a_layer_of_its_own(tmp_path):
    """A DynamicQuantizeLSTM stayed int8 in every single-layer model (the zoo LSTM's model with no quantizer:
    45.8 dB); it is now the float LSTM there, and its own single-layer model ranks it."""
    path, x = _lstm_model(tmp_path)
    np.savez(tmp_path / "d.npz", x=x)
    quantized = qtool.rewrite_eval(path, calibration_data=tmp_path / "d.npz").model
    assert any(n.op_type == "DynamicQuantizeLSTM" for n in quantized.graph)
    assert _no_quantizer_sqnr(path, quantized, {"x": x}) > 80
    (m,) = simulate(path, tmp_path / "d.npz", SimulateConfig(calibration_data=tmp_path / "d.npz", sensitivity=True,
                                                             batch_axis=1)).report["models"]
    rows = {s["layer"]: s for s in m["sensitivity"]}
    assert "/rnn/LSTM/lstm_quant/DynamicQuantizeLSTM" in rows and len(rows) == 2, rows
    assert all(math.isfinite(s["output"]["sqnr_db"]) for s in rows.values())


def test_onnxruntime_constants_read_by_other_ops_are_read_in_float(tmp_path):
    """onnxruntime's quantize_static quantizes an embedding table (read by Gather), a LayerNorm scale and a MatMul's
    bias Add operand: no layer's weight, so they stayed int8 in every single-layer model (the zoo BERT's model
    with no quantizer: 40 dB)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(2)
    table = rng.normal(0, 1, (20, 8)).astype(np.float32)
    nodes = [h.make_node("Gather", ["table", "ids"], ["e"], name="/emb/Gather"),
             h.make_node("LayerNormalization", ["e", "gamma", "beta"], ["n"], axis=-1, name="/norm/LayerNorm"),
             h.make_node("MatMul", ["n", "w"], ["m"], name="/fc/MatMul"),
             h.make_node("Add", ["b", "m"], ["y"], name="/fc/Add")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", TensorProto.INT64, ["N", 6])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                         [nh.from_array(table, "table"),
                          nh.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "gamma"),
                          nh.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "beta"),
                          nh.from_array(rng.normal(0, 0.5, (8, 4)).astype(np.float32), "w"),
                          nh.from_array(rng.normal(0, 0.5, 4).astype(np.float32), "b")])
    path = _save(graph, tmp_path / "emb.onnx")
    ids = rng.integers(0, 20, (16, 6)).astype(np.int64)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"ids": ids}])

        def get_next(self):
            return next(self.batches, None)

    q_path = tmp_path / "emb.ort.onnx"
    quantize_static(str(path), str(q_path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    quantized = ir.load(str(q_path))
    readers = {u.op_type for n in quantized.graph if n.op_type == "DequantizeLinear" and n.inputs[0].const_value is not None
               for u, _ in n.outputs[0].uses()}
    assert {"Gather", "Add"} <= readers, readers  # the constants this test is about are quantized
    assert _no_quantizer_sqnr(path, quantized, {"ids": ids}) > 80


def test_sensitivity_runs_on_a_widened_model_and_renders(tmp_path):
    """``simulate --sensitivity`` on a model whose stem rewrite-eval widens failed in onnxruntime (a float weight
    of 3 input channels met the stem's 4-channel codes); every single-layer SQNR is finite and the reports render."""
    path, data = EXPORTED / "legacy17_SEBlock.onnx", EXPORTED / "legacy17_SEBlock.npz"
    result = simulate(path, data, SimulateConfig(calibration_data=data, sensitivity=True),
                      json_path=tmp_path / "r.json", html_path=tmp_path / "r.html")
    (m,) = result.report["models"]
    alone = [s["output"]["sqnr_db"] for s in m["sensitivity"]]
    assert len(alone) >= 4 and all(math.isfinite(a) and a > m["output"]["sqnr_db"] for a in alone), alone
    assert not [n for n in m["notes"] if n.startswith("sensitivity")], m["notes"]
    assert "sensitivity" in result.format_text() and (tmp_path / "r.html").stat().st_size > 0


@pytest.mark.parametrize("name, form", [
    ("legacy13_MLP", "a MatMul and its batch norm fused into a Gemm of new names"),
    ("tf2onnx13_KerasCNN", "a Conv's constant Mul and Add folded into it, its Relu6 dropped"),
    ("legacy17_LinearAttention", "a Relu dropped where a Transpose moved across it (the tensor renamed)"),
])
def test_onnxruntime_pre_processed_models(tmp_path, name, form):
    """onnxruntime's quant_pre_process fuses and moves nodes before quantize_static: the float weight of a fused
    Gemm was not found, and an activation quantizer that stands for a dropped Relu / Relu6 was bypassed unclamped
    (the models with no quantizer: 'no float value', 23 dB, -13 dB)."""
    import contextlib

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    path, data = EXPORTED / f"{name}.onnx", dict(np.load(EXPORTED / f"{name}.npz"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([data])

        def get_next(self):
            return next(self.batches, None)

    pre, q_path = tmp_path / "pre.onnx", tmp_path / "q.onnx"
    with contextlib.chdir(tmp_path):
        quant_pre_process(str(path), str(pre))
    quantize_static(str(pre), str(q_path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    assert _no_quantizer_sqnr(path, ir.load(str(q_path)), data) > 80, form
