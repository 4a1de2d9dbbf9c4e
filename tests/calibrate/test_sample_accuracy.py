"""Accuracy of the sample model quantized with each calibration method (onnxruntime, int8 QDQ)."""

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import qtool
from qtool.config import CalibrationConfig, QuantConfig

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MODEL = SAMPLES / "digits_cnn.onnx"

METHODS = ["minmax", "ema", "percentile", "entropy", "mse"]


def accuracy(model) -> float:
    import onnxruntime as ort

    data = np.load(SAMPLES / "eval.npz")
    proto = ir.serde.serialize_model(model).SerializeToString()
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": data["input"]})[0]
    return float((logits.argmax(1) == data["labels"]).mean())


@pytest.fixture(scope="module")
def accuracies():
    out = {}
    for bits in (8, 3):
        for method in METHODS:
            result = qtool.rewrite_eval(str(MODEL), calibration_data=str(SAMPLES / "calib.npz"), quant=QuantConfig(activation_bits=bits), calibration=CalibrationConfig(method=method))
            out[bits, method] = accuracy(result.model)
    return out


@pytest.mark.parametrize("method", METHODS)
def test_8_bit_accuracy_is_the_float_accuracy(accuracies, method):
    assert accuracies[8, method] >= 0.994  # float: 0.996 (498/500)


@pytest.mark.parametrize("method", METHODS)
def test_3_bit_activations_stay_usable(accuracies, method):
    # measured: minmax 0.966, ema 0.980, percentile 0.972, entropy 0.974, mse 0.986
    assert accuracies[3, method] >= 0.95


def test_mse_beats_min_max_at_3_bits(accuracies):
    assert accuracies[3, "mse"] > accuracies[3, "minmax"]
