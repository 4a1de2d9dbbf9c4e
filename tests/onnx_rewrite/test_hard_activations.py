"""HardSwish / HardSigmoid as onnxruntime's integer Add and Mul (``onnx_rewrite.hard_activations``).

onnxruntime has no integer HardSwish/HardSigmoid; the eval graph writes the gate as an Add whose
uint8 QuantizeLinear saturates at the clip bounds, so the optimized graph has QLinearAdd/QLinearMul
and no float HardSigmoid. Checked on exporter-style models (opset 17 HardSwish, opset 13
``x * HardSigmoid(x)`` as torch writes it below opset 14, hand-written Relu6 forms, a
squeeze-excite HardSigmoid gate)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_builders import Builder, x_data
from test_placement_integer import FLOAT_LAYERS, optimized_ops, quantize
from test_train_graph import contract_of, proto, run_step, session

from qtool.api import rewrite_eval, rewrite_train
from qtool.config import TrainSchedule
from qtool.onnx_rewrite.fake_quant_function import DOMAIN, NAME


def hard_swish_model(form: str, se: bool = False) -> tuple[onnx.ModelProto, dict, str]:
    """conv -> HardSwish -> [squeeze-excite with a HardSigmoid gate] -> conv; returns the model, feeds and
    the HardSwish's output name."""
    b = Builder(opset=17 if form == "op" else 13, named=False)
    x = b.input("x", ["N", 8, 8, 8])
    y = b.conv(x, 8, 8)
    if form == "op":
        y = b.node("HardSwish", [y])
    elif form == "hardsigmoid_mul":  # torch below opset 14
        y = b.node("Mul", [y, b.node("HardSigmoid", [y], alpha=1 / 6, beta=0.5)])
    else:  # hand-written with a Relu6: x * relu6(x + 3) / 6 ("relu6_product") or x * (relu6(x + 3) / 6)
        relu6 = b.node("Clip", [b.node("Add", [y, b.const(np.float32(3))]), b.const(np.float32(0)),
                                b.const(np.float32(6))])
        if form == "relu6_product":
            y = b.node("Div", [b.node("Mul", [y, relu6]), b.const(np.float32(6))])
        else:
            y = b.node("Mul", [y, b.node("Mul", [relu6, b.const(np.float32(1 / 6))])])
    hs = y
    if se:
        pooled = b.node("GlobalAveragePool", [y])
        gate = b.node("HardSigmoid", [b.conv(b.node("Relu", [b.conv(pooled, 8, 4, k=1)]), 4, 8, k=1)],
                      alpha=1 / 6, beta=0.5)
        y = b.node("Mul", [y, gate])
    return b.proto([b.conv(y, 8, 4, k=1)]), {"x": x_data(16, 8, 8, 8) * 3}, hs


def float_output(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("form,se", [("op", False), ("op", True), ("hardsigmoid_mul", False),
                                     ("relu6_product", False), ("relu6_gate", True)])
def test_hard_swish_and_gates_run_as_qlinear_add_and_mul(form, se, tmp_path):
    model, feeds, _ = hard_swish_model(form, se)
    quantized, result = quantize(model, feeds)
    ops = optimized_ops(quantized, tmp_path)
    assert not FLOAT_LAYERS & set(ops)
    gates = 2 if se else 1
    assert ops["HardSigmoid"] == 0 and ops["HardSwish"] == 0, ops
    assert ops["QLinearAdd"] == gates and ops["QLinearMul"] == gates, ops
    summary = result.summary
    assert summary["counts"]["hard_sigmoids_integer"] == gates
    assert not {"HardSwish", "HardSigmoid", "Clip", "Div", "Mul", "Add"} & set(summary["other_float_ops"])
    # numerics: the gate's 8-bit grid on [0, 1] costs no more than the float sandwich's quantizers do
    got, want = float_output(quantized, feeds), float_output(model, feeds)
    assert np.max(np.abs(got - want)) <= 0.05 * np.max(np.abs(want))


def test_the_gate_is_hard_sigmoid_clipped_by_its_quantizer():
    """The eval graph's gate equals HardSigmoid(x) on the [0, 1] grid (1/255 steps), x beyond the clip
    bounds included."""
    model, feeds, hs = hard_swish_model("op")
    quantized = proto(rewrite_eval(model, calibration_data=feeds))
    gate = next(n for n in quantized.graph.node if n.op_type == "Mul")
    dq_gate = next(n for n in quantized.graph.node if n.output[0] == gate.input[1])
    dq_x = next(n for n in quantized.graph.node if n.output[0] == gate.input[0])
    probe = onnx.ModelProto()
    probe.CopyFrom(quantized)
    probe.graph.output.extend([onnx.helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, None)
                               for n in (dq_x, dq_gate)])
    x, g = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        [dq_x.output[0], dq_gate.output[0]], feeds)
    assert x.min() < -3 and x.max() > 3  # both clip bounds are exercised
    # the gate's level: HardSigmoid(x) * 255 rounded; at an exact tie onnxruntime's QLinearAdd (a
    # rescaled integer sum) may round either way, and which x are ties depends on the calibrated scale
    levels = np.clip(x.astype(np.float64) / 6 + 0.5, 0, 1) * 255
    got = g.astype(np.float64) * 255
    tie = np.abs(levels - np.floor(levels) - 0.5) < 1e-3
    np.testing.assert_allclose(got[~tie], np.round(levels[~tie]), atol=1e-3)
    assert np.all((np.abs(got[tie] - np.floor(levels[tie])) < 1e-3) | (np.abs(got[tie] - np.ceil(levels[tie])) < 1e-3))
    assert not tie.all()


def test_training_graph_computes_the_gate_as_the_eval_graph_does():
    """The gate is the eval graph's integer Add in float32 ops, from the HardSigmoid's input: ``(x + 3) /
    (s * 6)`` clipped and rounded to the 8-bit levels (a FakeQuant on [0, 255]), times ``s``; its fixed
    range [0, 1] is constants, and the HardSigmoid stays for the quant delay (and rewrite-eval)."""
    model, feeds, hs = hard_swish_model("op")
    train = proto(rewrite_train(model, calibration_data=feeds, schedule=TrainSchedule(quant_delay=5)))
    nodes = {o: n for n in train.graph.node for o in n.output}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in train.graph.initializer}
    hard_sigmoid = next(n for n in train.graph.node if n.op_type == "HardSigmoid")
    assert not any(n.op_type == "HardSwish" for n in train.graph.node)
    gate = next(q for q in contract_of(train)["activation_quantizers"] if q["kind"] == "gate_quant")
    assert gate["input"] == hard_sigmoid.output[0] and gate["range_source"] == "fixed"
    assert [float(inits[gate[k]]) for k in ("min", "max")] == [0.0, 1.0]  # the fixed range: constants, not state
    assert gate["gate"] == {"alpha": float(np.float32(1 / 6)), "beta": 0.5}
    delayed = nodes[gate["output"]]
    assert delayed.op_type == "Where" and delayed.input[2] == hard_sigmoid.output[0]  # HardSigmoid before the delay
    mul = nodes[delayed.input[1]]
    fq = nodes[mul.input[0]]
    assert fq.domain == DOMAIN and fq.op_type == NAME and [float(inits[i]) for i in fq.input[1:3]] == [0.0, 255.0]
    chain = [nodes[fq.input[0]]]  # Clip <- Div <- Add(x, 3)
    while chain[-1].op_type != "Add":
        chain.append(nodes[chain[-1].input[0]])
    assert [n.op_type for n in chain] == ["Clip", "Div", "Add"] and chain[-1].input[0] == hard_sigmoid.input[0]
    assert float(inits[chain[-1].input[1]]) == 3.0
    assert nodes[hs].op_type == "Mul" and gate["output"] in nodes[hs].input  # x * gate
    # after quant_delay the training graph computes what the eval graph deploys (rounding ties aside)
    out = train.graph.output[0].name
    trained = run_step(session(train), train, feeds, 1000)[out]
    deployed = float_output(proto(rewrite_eval(train)), feeds)
    step = (deployed.max() - deployed.min()) / 255
    assert np.max(np.abs(trained - deployed)) <= 2 * step


def test_symmetric_activations_keep_hard_swish_as_it_was(tmp_path):
    model, feeds, _ = hard_swish_model("op")
    quantized, result = quantize(model, feeds, symmetric=True)
    assert any(n.op_type == "HardSwish" for n in quantized.graph.node)
    assert result.summary["counts"]["hard_sigmoids_integer"] == 0
    assert result.summary["other_float_ops"].get("HardSwish") == 1
