"""The graph onnxruntime runs: which layers its optimized graph computes in float.

qtool places Q/DQ pairs by rules that predict onnxruntime's QDQ fusions
(benchmarks/zoo/FINDINGS.md); the ground truth is the graph a session makes
of the written model after its optimizations. A session made with
:func:`saving_optimized_graph` writes that graph to a temporary folder (its
weights to a side file, so that any size fits and the graph itself stays
small to read), and :func:`layer_kernels` lists its layer nodes that kept a
float kernel (a ``Conv`` or ``FusedConv``, a ``MatMul``, a ``Gemm``...)
rather than an integer one (``QLinearConv``, ``MatMulIntegerToFloat``,
``QGemm``...), subgraphs included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass

import onnx
import onnx_ir as ir
import onnxruntime as ort
from google.protobuf.message import DecodeError

from qtool.model.io import tensor_bytes

# op types of onnxruntime's optimized graph (any domain: com.microsoft, com.microsoft.nchwc, ...).
# MatMulNBits (what onnxruntime makes of DequantizeLinear(int8 weight, axis 1) -> MatMul when the activation input
# has no DequantizeLinear) keeps float activations: a float layer here.
FLOAT_LAYER_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm",
                             "Attention", "MultiHeadAttention", "NhwcFusedConv", "MatMulNBits"})
INTEGER_LAYER_OPS = frozenset({"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "MatMulIntegerToFloat",
                               "QGemm", "DynamicQuantizeMatMul", "NhwcQLinearConv", "QLinearConvTranspose",
                               "QAttention", "DynamicQuantizeLSTM"})
# The optimized graph is written with its weights: not for models this large, where that is a second copy of
# gigabytes on disk.
MAX_MODEL_BYTES = 1 << 30
_GRAPH = "optimized.onnx"
_WEIGHTS = "optimized.data"


@contextlib.contextmanager
def saving_optimized_graph(options: ort.SessionOptions):
    """Have the session made from ``options`` inside this block write its optimized graph; yields the path it
    will be at (read it with :func:`layer_kernels` once the session exists), or None when no temporary folder can
    be made (nothing is written then). The folder is removed on exit."""
    try:
        folder = tempfile.mkdtemp(prefix="qtool-optimized-")
    except OSError:  # an unwritable temporary folder costs this look, not the command
        yield None
        return
    try:
        options.optimized_model_filepath = os.path.join(folder, _GRAPH)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", _WEIGHTS)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        yield options.optimized_model_filepath
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class LayerKernels:
    """The layer nodes of an optimized graph: those in float kernels (node name, op type) and the integer count."""

    float_layers: list[tuple[str, str]]
    integer_layers: int

    def to_dict(self) -> dict:
        return {"integer_layers": self.integer_layers,
                "float_layers": [{"node": name, "op": op} for name, op in self.float_layers]}


def worth_looking(model: ir.Model) -> bool:
    """Whether a session of ``model`` should write its optimized graph (:data:`MAX_MODEL_BYTES`)."""
    return tensor_bytes(model) < MAX_MODEL_BYTES


def layer_kernels(path: str) -> LayerKernels | None:
    """The layer nodes of the optimized graph at ``path`` (subgraphs included) by kernel kind; None when
    onnxruntime wrote no graph there (nothing is known)."""
    try:
        graph = onnx.load(path, load_external_data=False).graph
    except (OSError, DecodeError, ValueError):
        return None
    found: list[tuple[str, str]] = []
    integer = 0

    def walk(g):
        nonlocal integer
        for node in g.node:
            if node.op_type in FLOAT_LAYER_OPS:
                found.append((node.name, node.op_type))
            integer += node.op_type in INTEGER_LAYER_OPS
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for sub in attr.graphs:
                    walk(sub)

    walk(graph)
    return LayerKernels(found, integer)
