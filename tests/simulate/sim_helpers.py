"""Paths and helpers shared by the simulate tests."""

from pathlib import Path

import numpy as np

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MODEL = SAMPLES / "digits_cnn.onnx"
CALIB = SAMPLES / "calib.npz"
EVAL = SAMPLES / "eval.npz"
DAMAGED_LAYER = "Conv_2"



def ort_outputs(path, x, batch_size=16):
    """What a user gets: a default InferenceSession on the file, batch by batch."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    return np.concatenate([session.run([name], {"input": x[i : i + batch_size]})[0] for i in range(0, len(x), batch_size)])
