"""A post-norm transformer's float residual Add before its LayerNorm written as Sum (``kernel_forms.
residual_adds_as_sums``): onnxruntime's SkipLayerNormFusion (static 3-D shapes, as torch's dynamo exporter
declares them) made it a SkipLayerNormalization, 4x slower on CPU than the Add and the LayerNormalization."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from model_builders import Builder, run, x_data
from test_exported_models import paths
from test_placement_integer import optimized_ops

import qtool
from qtool.model.names import NameScope
from qtool.onnx_rewrite.kernel_forms import residual_adds_as_sums


def test_a_dynamo_bert_layer_keeps_its_layer_norms_unfused(tmp_path):
    model, data = paths("dynamo_PostNormBlock")
    feeds = dict(np.load(data))
    assert optimized_ops(onnx.load(model), tmp_path)["SkipLayerNormalization"] == 2  # the float model: fused
    result = qtool.rewrite_eval(model, calibration_data=feeds)
    proto = ir.serde.serialize_model(result.model)
    ops = optimized_ops(proto, tmp_path)
    assert "SkipLayerNormalization" not in ops and ops["LayerNormalization"] == 2, ops
    assert not any(ops[op] for op in ("MatMul", "Gemm", "FusedMatMul", "FusedGemm")), ops
    assert result.summary["counts"]["residual_adds_as_sums"] == 2
    assert [s["layer_norm"] for s in result.summary["residual_sums"]] == ["node_layer_norm", "node_layer_norm_1"]
    want, got = run(onnx.load(model), feeds)[0], run(proto, feeds)[0]
    assert np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def _block(readers: str, constant: bool = False):
    """x -> Conv-free stand-in: two dequantized tensors added, then what reads the sum."""
    b = Builder(opset=17)
    x = b.input("x", [1, 4, 8])
    scale, zero = b.const(np.float32(0.05)), b.const(np.uint8(128))
    a = b.node("DequantizeLinear", [b.node("QuantizeLinear", [x, scale, zero]), scale, zero])
    other = b.const(np.ones((1, 4, 8), np.float32)) if constant else b.node("Relu", [a])
    s = b.node("Add", [a, other])
    gamma, beta = b.const(np.ones(8, np.float32)), b.const(np.zeros(8, np.float32))
    if readers == "layernorm":
        outs = [b.node("LayerNormalization", [s, gamma, beta], axis=-1)]
    elif readers == "prenorm":  # the residual stream goes on: the Add has two readers
        outs = [b.node("LayerNormalization", [s, gamma, beta], axis=-1), b.node("Add", [s, a])]
    elif readers == "written_out":  # Sub(x, ReduceMean(x)) -> ...: onnxruntime's LayerNormFusion's input
        centred = b.node("Sub", [s, b.node("ReduceMean", [s], axes=[-1])])
        outs = [b.node("Div", [centred, b.node("Sqrt", [b.node("ReduceMean", [b.node("Mul", [centred, centred])],
                                                                               axes=[-1])])])]
    else:
        outs = [b.node("Relu", [s])]
    return b.ir(outs), b.proto(outs)


@pytest.mark.parametrize("readers,rewritten", [("layernorm", True), ("written_out", True), ("prenorm", False),
                                               ("relu", False)])
def test_which_adds_become_sums(readers, rewritten):
    model, proto = _block(readers)
    done = residual_adds_as_sums(model.graph, NameScope(model.graph))
    assert len(done) == int(rewritten)
    ops = [n.op_type for n in model.graph]
    assert ("Sum" in ops) == rewritten
    x = x_data(1, 4, 8)
    for got, want in zip(run(model, {"x": x}, optimize=False), run(proto, {"x": x}, optimize=False)):
        np.testing.assert_array_equal(got, want)  # the same float addition


def test_an_add_of_a_constant_stays():
    model, _ = _block("layernorm", constant=True)
    assert residual_adds_as_sums(model.graph, NameScope(model.graph)) == []
