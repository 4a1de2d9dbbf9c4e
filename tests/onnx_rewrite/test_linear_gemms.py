"""A Linear on an input with symbolic dims (``MatMul + Add(bias)`` on ``[batch, tokens, dim]``) is written as
``Reshape -> Gemm -> Reshape`` with its int32 bias (``onnx_rewrite/linear_gemms.py``): onnxruntime runs it as one
QGemm, where it ran ``MatMulIntegerToFloat`` and a separate float bias Add. Checked on onnxruntime's optimized graph
of torch exports (dynamo and TorchScript) and on small built models; no test times anything (``benchmarks/``)."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from model_builders import Builder, x_data
from test_exported_models import paths
from test_placement_integer import FLOAT_LAYERS, optimized_ops
from test_train_bias_quant import _contract, _run, hold_ranges

import qtool
from qtool.config import QuantConfig, TrainSchedule


def _sqnr(want, got):
    return 10 * np.log10(np.sum(want.astype(np.float64) ** 2) / np.sum((want - got).astype(np.float64) ** 2))


def _outputs(model, feeds, optimize=True):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


# the PostNormBlock (a BERT layer: qkv, proj, fc1, fc2 on [N, T, 32], a head Linear on the class token [N, 32]);
# the shapes its Linears read: dynamo declares T = 16 (one symbolic dim: constant Reshape targets), the other two
# exports leave T symbolic too (the targets come from the input's Shape)
EXPORTS = {"dynamo_PostNormBlock": 1, "dynamo_seq_PostNormBlock": 2, "legacy17_PostNormBlock": 2}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_the_linears_of_an_exported_transformer_block_run_as_qgemm(name, tmp_path, monkeypatch):
    model, data = paths(name)
    feeds = dict(np.load(data))
    float_ops = optimized_ops(onnx.load(model), tmp_path)
    assert float_ops["MatMul"] + float_ops["FusedMatMul"] >= 5  # the float model's Linears stay MatMuls but the head
    result = qtool.rewrite_eval(model, calibration_data=feeds)
    proto = ir.serde.serialize_model(result.model)
    ops = optimized_ops(proto, tmp_path)
    assert not FLOAT_LAYERS & set(ops), ops
    # every Linear one QGemm (4 rewritten + the head, a Gemm onnxruntime fuses itself); Q.K^T and P.V integer too
    assert ops["QGemm"] == 5 and ops["MatMulIntegerToFloat"] + ops["QLinearMatMul"] == 2, ops
    assert result.summary["counts"]["linears_as_gemms"] == 4 and len(result.summary["biases"]) == 5
    # no bias Add left: the float Adds are the residual ones (as Sum) and the attention scale's
    assert ops["Add"] <= 1 and "BiasGelu" not in ops and "Erf" not in ops, ops  # the GELU fused in float
    shapes = [n for n in result.model.graph if n.op_type == "Shape" and "/gemm_output" in n.name]
    # one for the four Linears: their inputs' dims [N, T, ...] have the same names
    assert len(shapes) == (0 if EXPORTS[name] == 1 else 1)
    concats = [n for n in result.model.graph if n.op_type == "Concat" and "/gemm_output" in n.name]
    assert len(concats) == (0 if EXPORTS[name] == 1 else 3)  # [N, T, 96], [N, T, 32], [N, T, 128]
    want = _outputs(model, feeds)
    assert _sqnr(want, _outputs(proto, feeds)) > 25
    # the values of the graph as written are those of MatMul + Add with the int32 bias (float rounding apart)
    monkeypatch.setattr("qtool.onnx_rewrite.eval_graph.linears_as_gemms", lambda *args: [])
    plain = ir.serde.serialize_model(qtool.rewrite_eval(model, calibration_data=feeds).model)
    assert [n.op_type for n in plain.graph.node].count("MatMul") == 6  # the 4 Linears, Q.K^T and P.V
    np.testing.assert_allclose(_outputs(proto, feeds, optimize=False), _outputs(plain, feeds, optimize=False),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(EXPORTS))
def test_rewriting_the_output_again_adds_nothing(name, tmp_path):
    model, data = paths(name)
    once = tmp_path / "once.onnx"
    qtool.rewrite_eval(model, str(once), calibration_data=data)
    again = qtool.rewrite_eval(str(once), str(tmp_path / "twice.onnx"), calibration_data=data)
    counts = again.summary["counts"]
    assert counts["activations_quantized"] == 0 and counts["layers_quantized"] == 0, counts
    assert once.read_bytes() == (tmp_path / "twice.onnx").read_bytes()


def _mlp(tokens: list):
    """Two Linears reading one tensor (q and k of an attention), a Linear after a ReLU, biases [N] and [1, 1, N]."""
    b = Builder(opset=17, named=True)
    x = b.input("x", ["N", *tokens, 16])
    rng = np.random.default_rng(5)
    q = b.matmul(x, 16, 16, bias=True, name="q")
    k = b.matmul(x, 16, 16, bias=True, name="k")
    h = b.node("Relu", [b.node("Add", [q, k])])
    w = b.const((rng.standard_normal((16, 8)) * 0.3).astype(np.float32))
    y = b.node("Add", [b.node("MatMul", [h, w], name="out"),
                       b.const((rng.standard_normal((1, 1, 8)) * 0.1).astype(np.float32))])
    return b.proto([y]), y


def test_one_flattened_input_per_tensor_and_a_constant_target_for_one_symbolic_dim(tmp_path):
    proto, _ = _mlp([5])
    feeds = {"x": x_data(4, 5, 16)}
    result = qtool.rewrite_eval(proto, calibration_data=feeds)
    graph = result.model.graph
    assert [g["matmul"] for g in result.summary["linear_gemms"]] == ["q", "k", "out"]
    flat = [n for n in graph if n.op_type == "Reshape" and "/gemm_input" in n.name]
    assert len(flat) == 2  # x (read by q and k) and the ReLU's output
    targets = {tuple(n.inputs[1].const_value.numpy()) for n in graph if n.op_type == "Reshape"
               and n.name.endswith("/gemm/Reshape")}
    assert targets == {(-1, 5, 16), (-1, 5, 8)}
    assert not any(n.op_type in ("Shape", "MatMul") for n in graph)
    ops = optimized_ops(ir.serde.serialize_model(result.model), tmp_path)
    assert ops["QGemm"] == 3 and not FLAT_FLOAT & set(ops), ops


FLAT_FLOAT = FLOAT_LAYERS | {"MatMulIntegerToFloat"}


@pytest.mark.parametrize("tokens", [["T"], [3, "T"]], ids=["N_T", "N_3_T"])
def test_a_shape_target_where_more_than_one_dim_is_symbolic(tokens, tmp_path):
    proto, _ = _mlp(tokens)
    feeds = {"x": x_data(32, *[3 if t == 3 else 7 for t in tokens], 16)}
    result = qtool.rewrite_eval(proto, calibration_data=feeds)
    proto_q = ir.serde.serialize_model(result.model)
    assert result.summary["counts"]["linears_as_gemms"] == 3
    ops = optimized_ops(proto_q, tmp_path)
    assert ops["QGemm"] == 3 and not FLAT_FLOAT & set(ops), ops
    for n in (1, 4):  # other batch and sequence sizes than calibrated, at both optimization levels
        other = {"x": x_data(n, *[3 if t == 3 else 2 * n + 1 for t in tokens], 16)}
        want = _outputs(proto, other)
        got = _outputs(proto_q, other)
        assert got.shape == want.shape and _sqnr(want, got) > 18
        np.testing.assert_allclose(got, _outputs(proto_q, other, optimize=False), rtol=1e-4, atol=1e-4)


def test_a_static_or_2d_input_and_a_float_bias_are_left_to_onnxruntime(tmp_path):
    """onnxruntime makes the Gemm of a static-shaped Linear itself; a MatMul without a bias Add, or with a bias that
    is not one value per output, stays a MatMul (MatMulIntegerToFloat)."""
    b = Builder(opset=17, named=True)
    x = b.input("x", ["N", 5, 16])
    y = b.matmul(x, 16, 8, name="nobias")
    y = b.node("Add", [b.node("MatMul", [y, b.const(np.ones((8, 8), np.float32) * 0.1)], name="wide"),
                       b.const(np.ones((5, 8), np.float32))])
    result = qtool.rewrite_eval(b.proto([y]), calibration_data={"x": x_data(4, 5, 16)})
    assert result.summary["counts"]["linears_as_gemms"] == 0 and result.summary["biases"] == []
    static = Builder(opset=17, named=True)
    s = static.matmul(static.input("x", [2, 5, 16]), 16, 8, bias=True, name="static")
    result = qtool.rewrite_eval(static.proto([s]), calibration_data={"x": x_data(2, 5, 16)})
    assert result.summary["counts"]["linears_as_gemms"] == 0 and len(result.summary["biases"]) == 1
    assert optimized_ops(ir.serde.serialize_model(result.model), tmp_path)["QGemm"] == 1


@pytest.mark.parametrize("bits", [4, 8])
def test_the_training_graph_adds_the_deployed_bias_bit_for_bit(bits, tmp_path):
    """Train == eval: the training graph models the int32 bias of these Linears (``qtool::FakeQuantBias``), and with
    its ranges held computes bit for bit what the deployed model computes, optimizations off and on."""
    proto, out = _mlp(["T"])
    onnx.save(proto, str(tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal((16, 6, 16)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    qtool.rewrite_train(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), calibration_data=str(tmp_path / "calib.npz"),
                        quant=QuantConfig(weight_bits=bits, activation_bits=bits), schedule=TrainSchedule())
    deployed = qtool.rewrite_eval(str(tmp_path / "q.onnx"), str(tmp_path / "q.qdq.onnx"))
    assert deployed.summary["counts"]["linears_as_gemms"] == 3
    assert {q["layer"] for q in _contract(onnx.load(str(tmp_path / "q.onnx")))["bias_quantizers"]} == {"q", "k", "out"}
    held = hold_ranges(tmp_path / "q.onnx", tmp_path / "held.onnx")
    t = _run(held, [out], {"x": x, "qtool_step": np.array(100, np.int64)})[out]
    for optimize in (False, True):
        d = _outputs(str(tmp_path / "q.qdq.onnx"), {"x": x}, optimize=optimize)
        assert np.array_equal(t.view(np.uint32), d.view(np.uint32)), optimize
