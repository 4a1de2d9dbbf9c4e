"""A ReduceMean over the spatial axes as the GlobalAveragePool it is (``onnx_rewrite/global_pools.py``).

torch's dynamo exporter (``torch.onnx.export``'s default) writes ``adaptive_avg_pool2d(x, 1)`` as a ReduceMean, and
every exporter writes ``x.mean((2, 3))`` as one. onnxruntime has no integer ReduceMean: the int8 model dequantized
each squeeze-excite map and averaged it in float (the zoo's EfficientNet exported by dynamo: 0.98x float against
0.80x for its TorchScript export)."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from model_builders import Builder, run, x_data
from test_exported_models import paths
from test_placement_integer import optimized_ops

import qtool
from qtool.config import QuantConfig
from qtool.model.names import NameScope
from qtool.onnx_rewrite.global_pools import means_as_global_pools

LAYERS = ("Conv", "Gemm", "MatMul", "FusedConv", "FusedGemm")


@pytest.mark.parametrize("name", ["dynamo_SEBlock", "legacy17_SEBlock"])
def test_squeeze_excite_and_head_means_run_in_integer_pools(name, tmp_path):
    """EfficientNet's MBConv exported by dynamo at torch's default opset (20: both means are ReduceMean) and by the
    TorchScript exporter (the head's ``x.mean((2, 3))`` a ReduceMean with keepdims=0, no value_info): both pools
    run as QLinearGlobalAveragePool, no float ReduceMean and no layer left in float."""
    model, data = paths(name)
    feeds = dict(np.load(data))
    result = qtool.rewrite_eval(model, calibration_data=feeds)
    proto = ir.serde.serialize_model(result.model)
    ops = optimized_ops(proto, tmp_path)
    assert "ReduceMean" not in ops and ops["QLinearGlobalAveragePool"] == 2, ops
    assert not any(ops[op] for op in LAYERS), ops
    want, got = run(onnx.load(model), feeds)[0], run(proto, feeds)[0]
    assert got.shape == want.shape and np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def test_the_training_graph_pools_the_same_way():
    """rewrite-train quantizes the tensors rewrite-eval does: the pooled tensors, not the ReduceMean's."""
    model, data = paths("dynamo_SEBlock")
    trained = ir.serde.serialize_model(qtool.rewrite_train(model).model)
    ops = [n.op_type for n in trained.graph.node]
    assert "ReduceMean" not in ops and ops.count("GlobalAveragePool") == 2
    deployed = qtool.rewrite_eval(trained, calibration_data=dict(np.load(data)))
    plain = qtool.rewrite_eval(model, calibration_data=dict(np.load(data)))
    assert deployed.summary["counts"]["activations_quantized"] == plain.summary["counts"]["activations_quantized"]
    assert sorted(a["tensor"] for a in deployed.summary["activations"]) == \
        sorted(a["tensor"] for a in plain.summary["activations"])
    assert len(plain.summary["means_as_global_pools"]) == plain.summary["counts"]["means_as_global_pools"] == 2


def _means(opset: int, keepdims: int, axes, rank: int = 4, axes_as_input: bool | None = None):
    b = Builder(opset=opset)
    shape = ["batch", 4, 6, 5, 3][:rank]
    x = b.input("x", shape)
    y = b.conv(x, 4, 4, k=1, pads=[0] * 4) if rank == 4 else x
    as_input = opset >= 18 if axes_as_input is None else axes_as_input
    if axes is None:
        mean = b.node("ReduceMean", [y], keepdims=keepdims)
    elif as_input:
        mean = b.node("ReduceMean", [y, b.const(np.array(axes, np.int64))], keepdims=keepdims)
    else:
        mean = b.node("ReduceMean", [y], axes=axes, keepdims=keepdims)
    return b.ir([mean]), b.proto([mean])


@pytest.mark.parametrize("opset,keepdims,axes", [(11, 1, [2, 3]), (11, 0, [3, 2]), (13, 0, [2, 3]),
                                                 (18, 1, [-1, -2]), (20, 0, [2, -1])])
def test_a_spatial_mean_becomes_a_global_pool_with_the_same_values(opset, keepdims, axes):
    model, proto = _means(opset, keepdims, axes)
    done = means_as_global_pools(model.graph, opset, NameScope(model.graph))
    ops = [n.op_type for n in model.graph]
    assert len(done) == 1 and "ReduceMean" not in ops
    assert ops[-2:] == (["GlobalAveragePool", "Squeeze"] if not keepdims else ["Conv", "GlobalAveragePool"])
    x = x_data(3, 4, 6, 5)
    written = ir.serde.serialize_model(model)
    assert not [i.name for i in written.graph.initializer if i.name not in {n for m in written.graph.node
                                                                            for n in m.input}]
    np.testing.assert_allclose(run(written, {"x": x})[0], run(proto, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset,axes,rank", [
    (13, [1], 4),  # over the channels: a LayerNorm over C (ConvNeXt), not a pool
    (13, [2], 3),  # the last axis of [N, T, D]: a LayerNorm's mean
    (13, [0, 2, 3], 4),  # the batch too
    (18, None, 4),  # no axes: every axis
])
def test_other_means_stay(opset, axes, rank):
    model, _ = _means(opset, 1, axes, rank=rank)
    assert means_as_global_pools(model.graph, opset, NameScope(model.graph)) == []
    assert "ReduceMean" in [n.op_type for n in model.graph]


def test_axes_computed_at_run_time_stay():
    b = Builder(opset=18)
    x, axes = b.input("x", ["batch", 4, 6, 5]), b.input("axes", [2], onnx.TensorProto.INT64)
    model = b.ir([b.node("ReduceMean", [x, axes])])
    assert means_as_global_pools(model.graph, 18, NameScope(model.graph)) == []


def test_an_excluded_mean_stays():
    model, _ = _means(13, 1, [2, 3])
    mean = next(n for n in model.graph if n.op_type == "ReduceMean")
    config = QuantConfig(exclude=frozenset({mean.name}))
    assert means_as_global_pools(model.graph, 13, NameScope(model.graph), config.out_of_scope) == []
