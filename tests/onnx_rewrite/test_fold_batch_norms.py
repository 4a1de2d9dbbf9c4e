"""Batch-norm folding (spec section 3): the folded float model computes the same in onnxruntime."""

import numpy as np
import onnx_ir as ir
import pytest
from model_builders import Builder, run, x_data

from qtool.model.names import NameScope, name_unnamed_nodes
from qtool.onnx_rewrite.fold_batch_norms import fold_batch_norms


def fold(model: ir.Model):
    name_unnamed_nodes(model.graph)
    return fold_batch_norms(model.graph, NameScope(model.graph))


def assert_equivalent(builder: Builder, out: str, feeds: dict, folded_count: int = 1):
    proto = builder.proto([out])
    want = run(proto, feeds, optimize=False)[0]
    model = ir.serde.deserialize_model(proto)
    report = fold(model)
    assert len(report.folded) == folded_count, report.skipped
    ops = [n.op_type for n in model.graph]
    assert "BatchNormalization" not in ops
    got = run(model, feeds, optimize=False)[0]
    rel = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert rel <= 1e-5
    return model


@pytest.mark.parametrize("constants", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_fold_conv(bias, constants):
    b = Builder(opset=11, constants=constants)
    x = b.input("x", ["N", 3, 8, 8])
    y = b.bn(b.conv(x, 3, 8, bias=bias), 8)
    model = assert_equivalent(b, y, {"x": x_data(2, 3, 8, 8)})
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert len(conv.inputs) == 3 and conv.inputs[2].const_value is not None  # folded bias is an initializer


@pytest.mark.parametrize("bias", [True, False])
def test_fold_depthwise_conv(bias):
    b = Builder()
    x = b.input("x", ["N", 6, 8, 8])
    y = b.bn(b.conv(x, 6, 6, group=6, bias=bias), 6)
    assert_equivalent(b, y, {"x": x_data(2, 6, 8, 8)})


@pytest.mark.parametrize("bias", [True, False])
def test_fold_grouped_conv(bias):
    b = Builder()
    x = b.input("x", ["N", 8, 6, 6])
    y = b.bn(b.conv(x, 8, 12, group=4, bias=bias), 12)
    assert_equivalent(b, y, {"x": x_data(2, 8, 6, 6)})


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_fold_conv_transpose(bias, group):
    b = Builder()
    x = b.input("x", ["N", 4, 5, 5])
    y = b.bn(b.conv_transpose(x, 4, 8, group=group, bias=bias), 8)
    assert_equivalent(b, y, {"x": x_data(2, 4, 5, 5)})


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_fold_gemm(trans_b, bias):
    b = Builder()
    x = b.input("x", ["N", 6])
    y = b.bn(b.gemm(x, 6, 5, trans_b=trans_b, bias=bias), 5)
    assert_equivalent(b, y, {"x": x_data(3, 6)})


def test_fold_gemm_with_alpha_beta():
    b = Builder()
    x = b.input("x", ["N", 6])
    y = b.bn(b.gemm(x, 6, 5, trans_b=0, alpha=0.7, beta=1.9), 5)
    model = assert_equivalent(b, y, {"x": x_data(3, 6)})
    gemm = next(n for n in model.graph if n.op_type == "Gemm")
    assert gemm.attributes["beta"].as_float() == 1.0


@pytest.mark.parametrize("bias", [True, False])
def test_fold_matmul(bias):
    b = Builder()
    x = b.input("x", ["N", 6])
    y = b.bn(b.matmul(x, 6, 4, bias=bias), 4)
    model = assert_equivalent(b, y, {"x": x_data(3, 6)})
    assert [n.op_type for n in model.graph] == ["MatMul", "Add"]


def test_fold_conv_with_separate_bias_add():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    conv = b.conv(x, 3, 4, bias=False)
    added = b.node("Add", [conv, b.const(np.arange(4, dtype=np.float32).reshape(4, 1, 1))])
    y = b.bn(added, 4)
    model = assert_equivalent(b, y, {"x": x_data(2, 3, 6, 6)})
    assert [n.op_type for n in model.graph] == ["Conv"]


def test_fold_keeps_graph_output_name():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    b.bn(b.conv(x, 3, 4), 4)
    b.nodes[-1].output[0] = "logits"
    b.output("logits")
    proto = b.proto()
    model = ir.serde.deserialize_model(proto)
    fold(model)
    assert [o.name for o in model.graph.outputs] == ["logits"]
    assert model.graph.outputs[0].producer().op_type == "Conv"


def test_fold_does_not_modify_a_shared_weight():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    w = b.const(x_data(4, 3, 3, 3))
    c1 = b.node("Conv", [x, w], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    c2 = b.node("Conv", [x, w], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y1 = b.bn(c1, 4)
    out = b.node("Add", [y1, c2])
    feeds = {"x": x_data(2, 3, 6, 6)}
    model = assert_equivalent(b, out, feeds)
    convs = [n for n in model.graph if n.op_type == "Conv"]
    assert convs[0].inputs[1] is not convs[1].inputs[1]
    assert convs[1].inputs[1].name == w  # the unfolded conv still reads the original weight


def reasons(b: Builder, out: str) -> list[str]:
    model = b.ir([out])
    report = fold(model)
    assert not report.folded
    return [s.reason for s in report.skipped]


def test_not_folded_when_layer_output_has_another_consumer():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    conv = b.conv(x, 3, 4)
    y = b.bn(conv, 4)
    out = b.node("Add", [y, conv])
    (reason,) = reasons(b, out)
    assert "other consumers" in reason


def test_not_folded_in_training_mode():
    b = Builder(opset=15)
    x = b.input("x", ["N", 3, 6, 6])
    y = b.bn(b.conv(x, 3, 4), 4)
    b.nodes[-1].attribute.append(__import__("onnx").helper.make_attribute("training_mode", 1))
    (reason,) = reasons(b, y)
    assert "training mode" in reason


def test_not_folded_when_statistics_are_not_constant():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    mean = b.input("mean", [4])
    conv = b.conv(x, 3, 4)
    consts = [b.const(np.ones(4, np.float32)) for _ in range(3)]
    y = b.node("BatchNormalization", [conv, consts[0], consts[1], mean, consts[2]])
    (reason,) = reasons(b, y)
    assert "mean is not a constant" in reason and "graph input" in reason


def test_not_folded_after_a_non_layer_op():
    b = Builder()
    x = b.input("x", ["N", 4, 6, 6])
    y = b.bn(b.node("Relu", [x]), 4)
    (reason,) = reasons(b, y)
    assert "from Relu" in reason


def test_not_folded_after_rank3_matmul():
    b = Builder()
    x = b.input("x", ["N", 4, 6])
    y = b.bn(b.matmul(x, 6, 4), 4)
    (reason,) = reasons(b, y)
    assert "rank 3" in reason


def test_excluded_batch_norm_is_not_folded():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    y = b.bn(b.conv(x, 3, 4), 4, name="bn_keep")
    model = b.ir([y])
    report = fold_batch_norms(model.graph, NameScope(model.graph), exclude={"bn_keep"})
    assert not report.folded and report.skipped[0].reason == "excluded (--exclude)"
