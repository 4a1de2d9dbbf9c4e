"""A Mul by one or an Add of zero removed before placement (``onnx_rewrite/noop_elimination.py``).

HGNetV2-B0 as timm builds it has a LearnableAffineBlock (``ReLU -> Mul(scale) -> Add(bias)``, scale 1 and bias 0
until trained) after each conv. onnxruntime's NoopElimination drops them from the float model; qtool quantized
each output, and onnxruntime ran a QLinearMul and a QLinearAdd per block (HGNetV2-B0: 1.2x the latency of
onnxruntime's own quantize_static)."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from model_builders import Builder, run
from test_exported_models import paths
from test_placement_integer import optimized_ops

import qtool
from qtool.onnx_rewrite.noop_elimination import neutral_ops_removed


@pytest.mark.parametrize("name", ["dynamo_AffineBlock", "legacy17_AffineBlock"])
def test_learnable_affine_blocks_at_their_initial_values_run_no_integer_mul_or_add(name, tmp_path):
    """Both exporters' HGNetV2 block: the four neutral ops go (named in the summary), onnxruntime's optimized int8
    graph has no QLinearMul / QLinearAdd and no float Mul / Add, every layer runs in integers, output as float's."""
    model, data = paths(name)
    feeds = dict(np.load(data))
    result = qtool.rewrite_eval(model, calibration_data=feeds)
    assert result.summary["counts"]["neutral_ops_removed"] == len(result.summary["neutral_ops_removed"]) == 4
    assert "x*1, x+0 removed       4" in result.format_text()
    proto = ir.serde.serialize_model(result.model)
    ops = optimized_ops(proto, tmp_path)
    assert not any(ops[op] for op in ("QLinearMul", "QLinearAdd", "Mul", "Add", "Conv", "Gemm", "FusedConv")), ops
    assert ops["QLinearConv"] == 2, ops
    want, got = run(onnx.load(model), feeds)[0], run(proto, feeds)[0]
    assert got.shape == want.shape and np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def test_the_training_graph_keeps_them():
    """rewrite-train keeps a scale of one: it is a parameter's initial value, which fine-tuning may train."""
    model, _ = paths("legacy17_AffineBlock")
    trained = ir.serde.serialize_model(qtool.rewrite_train(model).model)
    assert sum(n.op_type == "Mul" for n in trained.graph.node) >= 2


def _graph(op, const, swap=False, x_shape=("batch", 4, 6, 6)):
    b = Builder(opset=17)
    x = b.input("x", list(x_shape))
    y = b.node("Relu", [x])
    c = b.const(np.asarray(const, np.float32))
    z = b.node(op, [c, y] if swap else [y, c], name="op")
    return b, b.node("Relu", [z])


@pytest.mark.parametrize("op,const,swap", [("Mul", 1.0, False), ("Mul", [1.0], True), ("Div", [[[[1.0]]]], False),
                                           ("Add", 0.0, True), ("Sub", [[0.0]], False)])
def test_neutral(op, const, swap):
    b, out = _graph(op, const, swap)
    model = b.ir([out])
    assert neutral_ops_removed(model.graph) == ["op"]
    assert [n.op_type for n in model.graph] == ["Relu", "Relu"]
    x = np.random.default_rng(0).normal(size=(2, 4, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(run(ir.serde.serialize_model(model), {"x": x})[0], np.maximum(x, 0))


@pytest.mark.parametrize("op,const,swap", [
    ("Mul", 2.0, False),  # not neutral
    ("Mul", [1.0, 1.0, 1.0, 1.0], False),  # ones of another shape: broadcasts (leave it to the other rules)
    ("Mul", [[[[[1.0]]]]], False),  # rank 5 on a rank-4 tensor: the output has one more dim
    ("Sub", 0.0, True),  # 0 - x is -x
    ("Div", 1.0, True),  # 1 / x
    ("Add", 1.0, False),
])
def test_not_neutral(op, const, swap):
    b, out = _graph(op, const, swap)
    model = b.ir([out])
    assert neutral_ops_removed(model.graph) == []
    assert [n.op_type for n in model.graph] == ["Relu", op, "Relu"]


def test_out_of_scope_and_graph_output():
    """An excluded node stays; a neutral op whose output is a graph output leaves the model's outputs as they were."""
    b, out = _graph("Mul", 1.0)
    model = b.ir([out])
    assert neutral_ops_removed(model.graph, lambda node: "excluded" if node.name == "op" else None) == []
    b = Builder(opset=17)
    x = b.input("x", ["batch", 4])
    y = b.node("Mul", [x, b.const(np.float32(1.0))], name="op")
    model = b.ir([y])
    neutral_ops_removed(model.graph)
    assert [o.name for o in model.graph.outputs] == [y] and model.graph.outputs[0].producer() is not None
