"""Paths the finetune tests share (a module of its own: ``conftest`` is not importable by name
when several test folders have one)."""

from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MODEL = SAMPLES / "digits_cnn.onnx"
CALIB = SAMPLES / "calib.npz"
EVAL = SAMPLES / "eval.npz"
