"""What the CLI tests share: the sample files and an in-process runner."""

from pathlib import Path

from click.testing import CliRunner

from qtool.cli import main

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MODEL = SAMPLES / "digits_cnn.onnx"
CALIB = SAMPLES / "calib.npz"


def invoke(*args):
    """Run ``qtool ARGS...`` in process (paths may be Path objects)."""
    return CliRunner().invoke(main, [str(a) for a in args])
