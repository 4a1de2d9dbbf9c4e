"""The sample digits CNN: loads in onnxruntime, exact integer weights, accuracy within 1 point."""

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import qtool
from qtool.model.codec import widen
from qtool.model.names import NameScope, name_unnamed_nodes
from qtool.model.constants import constant_array
from qtool.api import rewrite_eval
from qtool.onnx_rewrite.fold_batch_norms import fold_batch_norms

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MODEL = SAMPLES / "digits_cnn.onnx"



def accuracy(model_path) -> float:
    data = np.load(SAMPLES / "eval.npz")
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": data["input"]})[0]
    return float((logits.argmax(1) == data["labels"]).mean())


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample") / "digits.qdq.onnx"
    result = rewrite_eval(str(MODEL), str(out), calibration_data=str(SAMPLES / "calib.npz"))
    return out, result


def test_sample_rewrite_summary(rewritten):
    _, result = rewritten
    c = result.summary["counts"]
    assert c["batch_norms_folded"] == 4 and c["batch_norms_not_folded"] == 0
    assert c["layers_quantized"] == 5
    assert result.summary["opset"] == {"input": 11, "output": 13}
    assert result.summary["calibration"]["samples"] == 100
    assert not result.warnings


def test_sample_loads_in_onnxruntime_and_runs_int8(rewritten, tmp_path):
    out, _ = rewritten
    onnx.checker.check_model(onnx.load(out), full_check=True)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]
    assert ops.count("QLinearConv") == 4 and "QGemm" in ops and "Conv" not in ops


def test_sample_stored_weights_equal_kernel_outputs(rewritten):
    out, _ = rewritten
    q = ir.load(str(out))
    # fold the float model the same way, then quantize its weights with the kernels
    ref = ir.load(str(MODEL))
    name_unnamed_nodes(ref.graph)
    fold_batch_norms(ref.graph, NameScope(ref.graph))
    layers = [n for n in ref.graph if n.op_type in ("Conv", "Gemm")]
    assert len(layers) == 5
    for layer in layers:
        w = constant_array(layer.inputs[1])
        lo, hi = qtool.kernels.minmax(w, axis=0)
        lo, hi = widen(lo, hi, bits=8, narrow=True, symmetric=True)  # weights: symmetric grid by default
        codes = qtool.kernels.quantize_codes(w, lo, hi, num_bits=8, narrow_range=True, axis=0)
        _, _, scale, zp = qtool.nudged_range(lo, hi, 8, narrow_range=True)
        prefix = f"{layer.name}/weights_quant"
        stored = constant_array(q.graph.initializers[f"{prefix}/quantized"])
        # the RGB stem's input channels are padded with zero codes to 4 (onnxruntime's fast QLinearConv)
        np.testing.assert_array_equal(stored[:, :w.shape[1]], codes - 128)
        assert not np.any(stored[:, w.shape[1]:])
        np.testing.assert_array_equal(constant_array(q.graph.initializers[f"{prefix}/scale"]), scale)
        np.testing.assert_array_equal(constant_array(q.graph.initializers[f"{prefix}/zero_point"]), zp - 128)


def test_sample_accuracy_within_one_point(rewritten):
    out, _ = rewritten
    float_acc = accuracy(MODEL)
    quant_acc = accuracy(out)
    assert float_acc >= 0.99
    assert quant_acc >= float_acc - 0.01, (float_acc, quant_acc)
