"""A constant Mul/Add right after a layer folds into its weight and bias (``fold_affine``), in the eval and
the training rewrite, as onnxruntime's float optimizer does (ConvMulFusion, ConvAddFusion).

PaddleOCR's PP-LCNetV3 (the real PP-OCRv4 recognizer) follows every conv with a learnable affine block
``Conv -> Mul(w) -> Add(b)``. Models written as paddle2onnx writes them: Constant nodes, unnamed nodes,
dynamic batch, HardSwish as ``x * Clip(x + 3, 0, 6) / 6``."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from model_builders import Builder, run, x_data
from test_hard_activations import float_output
from test_placement_integer import FLOAT_LAYERS, optimized_ops, quantize
from test_round_mode import _session as _tapped
from test_train_graph import contract_of, proto, run_step, session

from qtool.api import rewrite_eval, rewrite_train
from qtool.model.names import name_unnamed_nodes
from qtool.onnx_rewrite.fold_affine import fold_affine


def hard_swish(bld: Builder, y: str) -> str:
    three, six = bld.const(np.float32(3)), bld.const(np.float32(6))
    relu6 = bld.node("Clip", [bld.node("Add", [y, three]), bld.const(np.float32(0)), six])
    return bld.node("Div", [bld.node("Mul", [y, relu6]), six])


def affine_model(opset=12, scale=np.float32(0.8), shift=np.float32(0.3), bias=True, second_consumer=False,
                 mul_first=False):
    """conv -> Mul(scale) -> Add(shift) -> hardswish -> conv 1x1 (``shift`` None: no Add)."""
    bld = Builder(opset=opset, constants=True, named=False)
    x = bld.input("x", ["N", 8, 8, 8])
    conv = bld.conv(x, 8, 8, bias=bias)
    y = bld.node("Mul", [bld.const(np.asarray(scale, np.float32)), conv] if mul_first else
                 [conv, bld.const(np.asarray(scale, np.float32))])
    if shift is not None:
        y = bld.node("Add", [y, bld.const(np.asarray(shift, np.float32))])
    y = bld.conv(hard_swish(bld, y), 8, 4, k=1)
    if second_consumer:  # the conv output read twice
        y = bld.node("Add", [y, bld.node("ReduceMean", [conv], axes=[1], keepdims=1)])
    return bld.proto([y]), {"x": x_data(16, 8, 8, 8)}


def folded_ops(proto, exclude=frozenset()) -> tuple[onnx.ModelProto, object]:
    """The model with its affine blocks folded (nodes named first, as the rewrites do)."""
    model = ir.serde.deserialize_model(proto)
    name_unnamed_nodes(model.graph)
    report = fold_affine(model.graph, exclude=exclude)
    return ir.serde.serialize_model(model), report


def test_fold_matches_the_float_model_up_to_rounding():
    model, feeds = affine_model(mul_first=True)
    folded, report = folded_ops(model)
    assert len(report.folded) == 1 and not report.skipped
    assert report.folded[0].mul and report.folded[0].add
    assert not {"Mul", "Add"} & {n.op_type for n in folded.graph.node if n.output[0].startswith("conv")}
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("Mul") == 1 and ops.count("Add") == 1  # the HardSwish's own
    want, got = run(model, feeds)[0], run(folded, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [12, 17])
def test_conv_scale_shift_hardswish_conv_folds_and_runs_in_integers(opset, tmp_path):
    model, feeds = affine_model(opset)
    quantized, result = quantize(model, feeds)
    summary = result.summary
    assert summary["counts"]["affine_folded"] == 1 and summary["counts"]["affine_not_folded"] == 0
    fold = summary["affine_folded"][0]
    assert fold["op"] == "Conv" and fold["mul"] and fold["add"]
    assert "Mul/Add folded         1 of 1" in result.format_text()
    ops = optimized_ops(quantized, tmp_path)
    assert not FLOAT_LAYERS & set(ops), ops
    assert ops["Mul"] == 0 and ops["Add"] == 0, ops  # no float affine left (the HardSwish's run as QLinear)
    want = run(model, feeds)[0]
    got = run(quantized, feeds)[0]
    assert np.max(np.abs(got - want)) <= 0.1 * np.max(np.abs(want))


@pytest.mark.parametrize("scale,shift", [
    (np.linspace(0.5, 1.5, 8, dtype=np.float32).reshape(8, 1, 1), None),
    (np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8, 1, 1),
     np.linspace(-0.2, 0.2, 8, dtype=np.float32).reshape(8, 1, 1)),
])
@pytest.mark.parametrize("bias", [True, False])
def test_per_channel_constants_fold(scale, shift, bias):
    model, feeds = affine_model(scale=scale, shift=shift, bias=bias)
    folded, report = folded_ops(model)
    assert len(report.folded) == 1 and not report.skipped
    assert (report.folded[0].add is not None) == (shift is not None)
    conv = next(n for n in folded.graph.node if n.op_type == "Conv")
    assert (len(conv.input) == 3) == (bias or shift is not None)  # a Conv without a bias gets one for the Add
    np.testing.assert_allclose(run(folded, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_conv_add_alone_folds_into_a_conv_without_bias():
    model, feeds = affine_model(scale=np.float32(1), bias=False)
    model.graph.node.remove(next(n for n in model.graph.node if n.op_type == "Mul"))
    for n in model.graph.node:  # the Add reads the conv
        if n.op_type == "Add" and n.input[0].startswith("mul"):
            n.input[0] = next(m for m in model.graph.node if m.op_type == "Conv").output[0]
    folded, report = folded_ops(model)
    assert len(report.folded) == 1 and report.folded[0].mul is None
    np.testing.assert_allclose(run(folded, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_constant_that_is_not_per_channel_does_not_fold():
    model, feeds = affine_model(scale=np.linspace(0.5, 1.5, 64, dtype=np.float32).reshape(1, 1, 8, 8))
    folded, report = folded_ops(model)
    assert not report.folded
    assert len(report.skipped) == 1 and "not one value per output channel" in report.skipped[0].reason
    assert [n.op_type for n in folded.graph.node] == [n.op_type for n in model.graph.node]
    summary = quantize(model, feeds)[1].summary  # reported with its reason
    assert summary["counts"]["affine_folded"] == 0 and summary["affine_not_folded"][0]["op"] == "Mul"


def test_a_conv_output_read_twice_does_not_fold():
    model, feeds = affine_model(second_consumer=True)
    folded, report = folded_ops(model)
    assert not report.folded
    np.testing.assert_allclose(run(folded, feeds)[0], run(model, feeds)[0], rtol=0, atol=0)


def test_excluded_mul_stays_and_the_add_after_it_too():
    model, feeds = affine_model()
    named = ir.serde.deserialize_model(model)
    name_unnamed_nodes(named.graph)
    mul = next(n for n in named.graph if n.op_type == "Mul")
    folded, report = folded_ops(ir.serde.serialize_model(named), exclude=frozenset({mul.name}))
    assert not report.folded and report.skipped[0].reason == "excluded (--exclude)"
    assert [n.op_type for n in folded.graph.node] == [n.op_type for n in model.graph.node]


def test_a_shared_weight_is_copied_not_changed():
    bld = Builder(opset=12)
    x = bld.input("x", ["N", 8, 8, 8])
    a = bld.conv(x, 8, 8)
    conv = next(n for n in bld.nodes if n.op_type == "Conv")
    b = bld.node("Conv", list(conv.input), kernel_shape=[3, 3], pads=[1] * 4)  # same weight and bias
    y = bld.node("Add", [bld.node("Mul", [a, bld.const(np.float32(2.0))]), b])
    model, feeds = bld.proto([y]), {"x": x_data(4, 8, 8, 8)}
    folded, report = folded_ops(model)
    assert len(report.folded) == 1
    assert len([i for i in folded.graph.initializer if i.dims == [8, 8, 3, 3]]) == 2
    np.testing.assert_allclose(run(folded, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_gemm_and_matmul_fold_a_scale(op):
    bld = Builder(opset=13, named=False)
    x = bld.input("x", ["N", 16])
    y = bld.gemm(x, 16, 8, trans_b=0, beta=0.5) if op == "Gemm" else bld.matmul(x, 16, 8)
    y = bld.node("Mul", [y, bld.const(np.linspace(0.5, 1.5, 8, dtype=np.float32))])
    y = bld.node("Add", [y, bld.const(np.float32(0.25))])
    model, feeds = bld.proto([bld.node("Relu", [y])]), {"x": x_data(4, 16)}
    folded, report = folded_ops(model)
    assert len(report.folded) == 1
    ops = [n.op_type for n in folded.graph.node]
    assert "Mul" not in ops and ops.count("Add") == (op == "MatMul")  # a MatMul keeps its bias Add
    np.testing.assert_allclose(run(folded, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_training_graph_trains_the_folded_weight_and_deploys_it():
    """The training rewrite folds as the eval rewrite does: the folded weight is a parameter, the training
    graph after quant_delay computes what the eval graph of it deploys, and that deploys the same int8
    weights as the eval rewrite of the float model."""
    model, feeds = affine_model()
    trained = rewrite_train(model, calibration_data=feeds)
    assert trained.summary["counts"]["affine_folded"] == 1
    train = proto(trained)
    assert any(p.endswith("weights_affine") for p in contract_of(train)["parameters"])
    out = train.graph.output[0].name
    y_train = run_step(session(train), train, feeds, 1000)[out]
    via_train = proto(rewrite_eval(train))
    y_deployed = float_output(via_train, feeds)
    step = (y_deployed.max() - y_deployed.min()) / 255
    assert np.max(np.abs(y_train - y_deployed)) <= 2 * step
    direct = proto(rewrite_eval(model, calibration_data=feeds))
    assert _int8_weights(direct) == _int8_weights(via_train)
    # the weights the training graph computes with are the deployed ones, bit for bit
    w_train = [q["output"] for q in contract_of(train)["weight_quantizers"]]
    w_deploy = [n.output[0] for n in via_train.graph.node
                if n.op_type == "DequantizeLinear" and "/weights_quant/" in n.name]
    feeds_train = {**feeds, "qtool_step": np.array(10**6, np.int64), "qtool_range_update": np.array(0, np.float32)}
    got = _tapped(train, w_train).run(w_train, feeds_train)
    want = _tapped(via_train, w_deploy).run(w_deploy, feeds)
    assert len(got) == len(want) == 2
    # (a narrow conv's deployed weight has zero output channels added for onnxruntime's fast kernel: cut them)
    want = [w[:len(g)] for g, w in zip(sorted(got, key=lambda a: a.shape[1:]), sorted(want, key=lambda a: a.shape[1:]))]
    got = sorted(got, key=lambda a: a.shape[1:])
    assert sorted(a.tobytes() for a in got) == sorted(a.tobytes() for a in want)


def _int8_weights(model: onnx.ModelProto) -> list[bytes]:
    return sorted(onnx.numpy_helper.to_array(t).tobytes() for t in model.graph.initializer
                  if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 4)


def test_a_folded_graph_output_keeps_its_name_and_a_mul_of_two_tensors_is_no_candidate():
    bld = Builder(opset=17, named=False)
    x = bld.input("x", ["N", 8, 8, 8])
    y = bld.node("Mul", [bld.conv(x, 8, 8), bld.const(np.float32(0.5))], outputs=["scaled"])
    scores = bld.node("MatMul", [y, y])  # no constant weight: its Mul is not an affine candidate
    scores = bld.node("Mul", [scores, bld.const(np.float32(0.125))])
    model, feeds = bld.proto(["scaled", scores]), {"x": x_data(2, 8, 8, 8)}
    folded, report = folded_ops(model)
    assert len(report.folded) == 1 and not report.skipped
    assert [o.name for o in folded.graph.output][0] == "scaled"
    assert next(n for n in folded.graph.node if n.op_type == "Conv").output[0] == "scaled"
    for got, want in zip(run(folded, feeds), run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_paddle2onnx_identities_between_a_conv_its_bias_and_its_affine_block_are_dropped(tmp_path):
    """paddle2onnx (PP-OCRv5's recogniser) writes the conv bias as an Add and an Identity after every op:
    Conv -> Add(bias) -> Identity -> Mul(scale) -> Identity -> Add(shift) -> Identity -> HardSwish. The
    Identities hid the affine block from the fold (it ran as QLinearMul/QLinearAdd, requantizing twice per
    conv); they go first (onnxruntime drops them too), the tensors after each keeping its name."""
    bld = Builder(opset=14, constants=True, named=False)
    x = bld.input("x", ["N", 8, 8, 8])
    y = bld.node("Add", [bld.conv(x, 8, 8, bias=False), bld.const(np.linspace(-0.2, 0.2, 8, dtype=np.float32)
                                                               .reshape(1, 8, 1, 1))])
    y = bld.node("Identity", [y], outputs=["p2o.pd_op.add.0.0"])
    y = bld.node("Identity", [bld.node("Mul", [y, bld.const(np.float32(0.8))])], outputs=["p2o.pd_op.multiply.0.0"])
    y = bld.node("Identity", [bld.node("Add", [y, bld.const(np.float32(0.3))])], outputs=["p2o.pd_op.add.1.0"])
    y = bld.conv(bld.node("HardSwish", [y]), 8, 4, k=1)
    out = bld.node("Identity", [y], outputs=["fetch_name_0"])  # a graph output stays named
    model = bld.proto([out])
    feeds = {"x": x_data(16, 8, 8, 8)}
    quantized, result = quantize(model, feeds)
    counts = result.summary["counts"]
    assert counts["affine_folded"] == 2 and counts["scalar_operands_integer"] == 0  # the bias Add, then Mul + Add
    assert "Identity" not in {n.op_type for n in quantized.graph.node}
    assert [o.name for o in quantized.graph.output] == ["fetch_name_0"]
    assert "p2o.pd_op.add.1.0" in {a["tensor"] for a in result.summary["activations"]}  # the HardSwish input
    ops = optimized_ops(quantized, tmp_path)
    assert ops["QLinearMul"] <= 1 and ops["Mul"] == 0, ops  # (the HardSwish's own gate Mul only)
    want = run(model, feeds)[0]
    assert np.max(np.abs(run(quantized, feeds)[0] - want)) <= 0.1 * np.max(np.abs(want))
    train = rewrite_train(model, calibration_data=feeds)
    assert train.counts()["affine_folded"] == 2
