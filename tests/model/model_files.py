"""Small models for the file tests: two versions of one model (weights of 1s and of 2s), so that a
file on disk can be told to be exactly the old one or exactly the new one."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
SAMPLE_MODEL = SAMPLES / "digits_cnn.onnx"
SAMPLE_CALIB = SAMPLES / "calib.npz"


def gemm_proto(fill: float, n: int = 64) -> onnx.ModelProto:
    """y = x @ W^T + b with W, b filled with ``fill`` (W is 16 KiB: external data above 1 KiB)."""
    w = np.full((n, n), fill, np.float32)
    b = np.full((n,), fill, np.float32)
    node = helper.make_node("Gemm", ["x", "W", "b"], ["y"], name="fc", transB=1)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def gemm_model(fill: float) -> ir.Model:
    return ir.serde.deserialize_model(gemm_proto(fill))


def weight_fill(path) -> float:
    """The single value of the weight W of a model file written from :func:`gemm_model` (loads its
    external data: fails if the data is missing or truncated)."""
    proto = onnx.load(os.fspath(path))
    w = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "W"))
    values = np.unique(w)
    assert values.size == 1, f"mixed weights {values}"
    b = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "b"))
    assert np.all(b == values[0])
    return float(values[0])


def data_files(folder, name: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.startswith(name + ".") and f.endswith(".data"))


def referenced(path) -> set[str]:
    proto = onnx.load(os.fspath(path), load_external_data=False)
    return {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
