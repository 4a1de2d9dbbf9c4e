"""An Add/Mul of a quantized tensor and a scalar constant runs in integers (placement.integer,
``plan.scalar_operands``).

PaddleOCR's PP-LCNetV3 (the real PP-OCRv4 recognizer) follows every convolution and every HardSwish
with a learnable affine block ``w * x + b`` of scalar constants; left in float between a DQ and a Q,
they kept the HardSwish's Mul in float too and the int8 recognizer ran slower than float. The
eval graph reads each scalar through its own DequantizeLinear (one code, scale = |constant|: exact)
and onnxruntime runs QLinearMul/QLinearAdd. Models written as paddle2onnx writes them: opset 12,
Constant nodes, unnamed nodes, dynamic batch, HardSwish as ``x * Clip(x + 3, 0, 6) / 6``."""

import numpy as np
import onnx
import pytest
from model_builders import Builder, x_data
from onnx import numpy_helper
from test_hard_activations import float_output
from test_placement_integer import FLOAT_LAYERS, optimized_ops, quantize
from test_train_graph import proto, run_step, session

from qtool.api import rewrite_eval, rewrite_train


def lab_model(w: float, b: float, shape=(), act: str = "hardswish") -> tuple[onnx.ModelProto, dict]:
    """conv -> hardswish (Relu6 form; or a Relu) -> w * x + b -> conv 1x1, as paddle2onnx writes it."""
    bld = Builder(opset=12, constants=True, named=False)
    x = bld.input("x", ["N", 8, 8, 8])
    y = bld.conv(x, 8, 8)
    if act == "hardswish":
        three, six = bld.const(np.float32(3)), bld.const(np.float32(6))
        relu6 = bld.node("Clip", [bld.node("Add", [y, three]), bld.const(np.float32(0)), six])
        y = bld.node("Div", [bld.node("Mul", [y, relu6]), six])
    else:
        y = bld.node("Relu", [y])
    y = bld.node("Mul", [bld.const(np.full(shape, w, np.float32)), y])
    y = bld.node("Add", [y, bld.const(np.full(shape, b, np.float32))])
    return bld.proto([bld.conv(y, 8, 4, k=1)]), {"x": x_data(16, 8, 8, 8) * 3}


def _constant_dqs(model: onnx.ModelProto) -> list[float]:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = []
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and "constant_quant" in n.name:
            q, s, z = (inits[i] for i in n.input)
            values.append((q.astype(np.float32) - z.astype(np.float32)) * s)
    return values


@pytest.mark.parametrize("w,b,shape", [(0.8, 0.3, ()), (-0.6, -0.2, (1,)), (1.7, 0.0, (1, 1, 1))])
def test_an_affine_block_after_hard_swish_runs_in_integers(w, b, shape, tmp_path):
    model, feeds = lab_model(w, b, shape)
    quantized, result = quantize(model, feeds)
    ops = optimized_ops(quantized, tmp_path)
    assert not FLOAT_LAYERS & set(ops)
    assert ops["Mul"] == 0 and ops["Add"] == 0 and ops["HardSigmoid"] == 0, ops  # no float arithmetic left
    # an Add of 0 is no op: removed before placement (noop_elimination), as onnxruntime does in float
    constants = [np.float32(w)] + ([np.float32(b)] if b else [])
    assert ops["QLinearMul"] == 2 and ops["QLinearAdd"] == len(constants), ops  # HardSwish's Mul and gate, w and b
    summary = result.summary
    assert summary["counts"]["neutral_ops_removed"] == (0 if b else 1)
    assert summary["counts"]["scalar_operands_integer"] == len(constants)
    assert (f"{len(constants)} scalar constant{'s' if len(constants) > 1 else ''} of Add/Mul read as integers"
            in result.format_text())
    assert {e["constant"] for e in summary["scalar_operands"]} == set(constants)
    assert not {"Mul", "Add", "Div", "Clip"} & set(summary["other_float_ops"])
    # each constant dequantizes to itself, bit for bit (its shape kept: it broadcasts as it did)
    got = _constant_dqs(quantized)
    assert sorted(float(v.reshape(-1)[0]) for v in got) == sorted(float(c) for c in constants)
    assert all(v.shape == shape for v in got)
    y, want = float_output(quantized, feeds), float_output(model, feeds)
    assert np.max(np.abs(y - want)) <= 0.05 * np.max(np.abs(want))


@pytest.mark.parametrize("signed", [False, True])
def test_symmetric_activations_read_the_constant_in_their_container(signed, tmp_path):
    model, feeds = lab_model(-0.6, 0.25, act="relu")  # (a HardSwish stays float on a symmetric grid)
    quantized, _ = quantize(model, feeds, symmetric=True, int8_activations=signed)
    inits = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}
    dqs = [n for n in quantized.graph.node if n.op_type == "DequantizeLinear" and "constant_quant" in n.name]
    assert len(dqs) == 2 and all(inits[n.input[0]].dtype == (np.int8 if signed else np.uint8) for n in dqs)
    assert sorted(float(v) for v in _constant_dqs(quantized)) == [float(np.float32(-0.6)), 0.25]


def test_a_scalar_shared_with_a_clip_bound_stays_a_constant_for_the_clip(tmp_path):
    """paddle2onnx shares helper constants: the 6 of a Relu6 bound is also the HardSwish's divisor, and
    here a Mul's operand. Only the Mul reads the DequantizeLinear; the Clip keeps its constant bound."""
    bld = Builder(opset=12, constants=True, named=False)
    x = bld.input("x", ["N", 8, 8, 8])
    six = bld.const(np.float32(6))
    y = bld.node("Clip", [bld.conv(x, 8, 8), bld.const(np.float32(0)), six])
    y = bld.node("Mul", [y, six])
    model = bld.proto([bld.conv(y, 8, 4, k=1)])
    feeds = {"x": x_data(16, 8, 8, 8)}
    quantized, result = quantize(model, feeds)
    clip = [n for n in quantized.graph.node if n.op_type == "Clip"]
    producers = {o: n.op_type for n in quantized.graph.node for o in n.output}
    assert all(producers.get(i) in ("Constant", None) for n in clip for i in n.input[1:])
    assert result.summary["counts"]["scalar_operands_integer"] == 1
    assert "QLinearMul" in optimized_ops(quantized, tmp_path)


def test_the_training_graph_trains_what_deploys():
    """The training graph quantizes the same tensors (the affine block's outputs) and reads the constants
    as they are: after quant_delay it computes what the eval graph deploys (rounding ties aside)."""
    model, feeds = lab_model(0.8, 0.3)
    trained = rewrite_train(model, calibration_data=feeds)
    deployed = rewrite_eval(model, calibration_data=feeds)
    points = {(a["tensor"], a["kind"]) for a in deployed.summary["activations"]}
    assert points == {(a["tensor"], a["kind"]) for a in trained.summary["activations"]}
    assert {"activation_Mul_quant", "activation_Add_quant"} <= {kind for _, kind in points}
    train = proto(trained)
    out = train.graph.output[0].name
    trained = run_step(session(train), train, feeds, 1000)[out]
    deployed = float_output(proto(rewrite_eval(train)), feeds)
    step = (deployed.max() - deployed.min()) / 255
    assert np.max(np.abs(trained - deployed)) <= 2 * step
