"""What the finetune tests share: training graphs of the sample CNN, and JAX's compilation cache.

The training graphs are written once per session by ``rewrite_train`` (the
sample at W3A3 and at 8 bits, batch norms frozen from step 0). JAX's
persistent compilation cache points at a session temp folder, so two runs
that compile the same training step (the API test and the CLI test) compile
it once.
"""

import os
from pathlib import Path

import pytest
from finetune_helpers import CALIB, MODEL
from qtool.config import QuantConfig, TrainSchedule


@pytest.fixture(scope="session", autouse=True)
def jax_cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jax-cache")
    old = os.environ.get("QTOOL_JAX_CACHE")
    os.environ["QTOOL_JAX_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("QTOOL_JAX_CACHE", None)
    else:
        os.environ["QTOOL_JAX_CACHE"] = old


def _train_graph(folder: Path, name: str, bits: int, round_mode: str = "half_up") -> Path:
    from qtool.api import rewrite_train

    out = folder / name
    rewrite_train(str(MODEL), str(out), calibration_data=str(CALIB),
                  quant=QuantConfig(weight_bits=bits, activation_bits=bits, round_mode=round_mode),
                  schedule=TrainSchedule(freeze_bn_delay=0))
    return out


@pytest.fixture(scope="session")
def graphs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("graphs")
    return {"w3a3": _train_graph(folder, "w3a3.qat.onnx", 3), "w8a8": _train_graph(folder, "w8a8.qat.onnx", 8),
            "w3a3_even": _train_graph(folder, "w3a3.even.qat.onnx", 3, "half_to_even")}
