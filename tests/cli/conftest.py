import shutil

import pytest
from cli_helpers import CALIB, MODEL


@pytest.fixture
def work(tmp_path):
    """A temp folder holding a copy of the sample model (model.onnx) and its calibration data (calib.npz)."""
    shutil.copy(MODEL, tmp_path / "model.onnx")
    shutil.copy(CALIB, tmp_path / "calib.npz")
    return tmp_path
