"""Shared fixtures: the sample model, its data, and quantized versions made once per session."""

import numpy as np
import pytest

from sim_helpers import CALIB, DAMAGED_LAYER, EVAL, MODEL  # noqa: E402
from qtool.config import QuantConfig

@pytest.fixture(scope="session")
def qdir(tmp_path_factory):
    return tmp_path_factory.mktemp("simulate")


@pytest.fixture(scope="session")
def q8(qdir):
    import qtool

    path = qdir / "w8a8.onnx"
    qtool.rewrite_eval(MODEL, path, calibration_data=CALIB)
    return path


@pytest.fixture(scope="session")
def q_damaged(qdir):
    """W8A8 except one layer whose weights are quantized to 2 bits (its int32 bias follows its new scale)."""
    import onnx_ir as ir

    import qtool
    from qtool.model.io import save_model

    m8 = qtool.rewrite_eval(MODEL, calibration_data=CALIB).model
    m2 = qtool.rewrite_eval(MODEL, calibration_data=CALIB, quant=QuantConfig(weight_bits=2)).model
    moved = 0
    for suffix in ("weights_quant/quantized", "weights_quant/scale", "weights_quant/zero_point",
                   "bias_quant/quantized", "bias_quant/scale"):
        name = f"{DAMAGED_LAYER}/{suffix}"
        src = m2.graph.initializers[name].const_value
        dst = m8.graph.initializers[name]
        assert dst.const_value.dtype == src.dtype
        dst.const_value = ir.Tensor(src.numpy().copy(), dtype=src.dtype, name=name)
        moved += 1
    assert moved == 5
    path = qdir / "damaged.onnx"
    save_model(m8, path)
    return path


@pytest.fixture(scope="session")
def eval_data():
    with np.load(EVAL) as d:
        return {k: d[k] for k in d.files}
