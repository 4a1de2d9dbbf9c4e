"""The ONNX -> JAX interpreter: the sample training graph bit for bit, op by op against onnxruntime, errors."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from finetune_helpers import CALIB, EVAL, MODEL, exact_report, exact_reports
from model_builders import RNG, gate_calibration, gate_inputs, gate_model
from onnx import TensorProto, helper, numpy_helper

from qtool.api import rewrite_train
from qtool.errors import QtoolError
from qtool.finetune.interpreter import Interpreter
from qtool.config import QuantConfig, TrainSchedule


# --- the sample training graph: JAX == onnxruntime -------------------------------------------------------
@pytest.fixture(scope="module")
def gate_graph(tmp_path_factory) -> tuple[Path, Path]:
    """The training graph of HardSwish and HardSigmoid gates (``--round-mode half_to_even``) with its gates
    as graph outputs, and feeds on the ties of their grids (ranges held)."""
    folder = tmp_path_factory.mktemp("gates")
    train = ir.serde.serialize_model(rewrite_train(gate_model(), quant=QuantConfig(round_mode="half_to_even"),
                                                   calibration_data=gate_calibration()).model)
    contract = json.loads({p.key: p.value for p in train.metadata_props}["qtool.training"])
    train.graph.output.extend(helper.make_tensor_value_info(q["output"], TensorProto.FLOAT, None)
                              for q in contract["activation_quantizers"] if "gate" in q)
    onnx.save(train, folder / "gates.qat.onnx")
    np.savez(folder / "gates.npz", x=gate_inputs(), qtool_range_update=np.float32(0))
    return folder / "gates.qat.onnx", folder / "gates.npz"


def test_training_graph_forward_is_bit_exact_with_onnxruntime(graphs, gate_graph):
    """The sample at W3A3, quantization on, batch norms frozen (the graph freezes from step 0): the
    logits and every activation-range update are bit for bit onnxruntime's on 500 samples, in both
    round modes (``w3a3_even``: ``--round-mode half_to_even``); so are the integer HardSwish/HardSigmoid
    gates of ``gate_graph`` and everything after them, on the ties of the gates' grids.
    (FakeQuant keeps its divisors un-fused; XLA's CPU ISA is capped to AVX in the subprocess so
    nothing is contracted into an FMA.) The moving batch-norm statistics are means over the batch,
    summed in another order by XLA: equal to float32 rounding."""
    reports = exact_reports([graphs["w3a3"], graphs["w3a3_even"], gate_graph[0]], [EVAL, EVAL, gate_graph[1]], [0, 7])
    for step, outputs in reports[2].items():
        assert all(r["equal"] for r in outputs.values()), (step, outputs)
    for graph, report in zip(("w3a3", "w3a3_even"), reports):
        for step, outputs in report.items():
            assert outputs["logits"]["equal"], (graph, step, outputs["logits"])
            for out, r in outputs.items():
                if "act_quant" in out or "input_quant" in out or "conv_quant" in out:
                    assert r["equal"], (graph, step, out, r)
                else:
                    assert r["max_abs_diff"] <= 1e-6 * max(1.0, r["max_abs"]), (graph, step, out, r)


def test_training_graph_forward_at_8_bits(graphs):
    """At 8 bits a Conv/Gemm sum in another order can move a pre-quantization value (and so a batch
    max, an EMA range, a scale) by an ulp, or a value across a rounding boundary: the logits agree
    within float32 rounding for >= 99% of them, and no value is more than one 8-bit step away."""
    report = exact_report(graphs["w8a8"], EVAL, [0])
    logits = report["0"]["logits"]
    assert logits["close_fraction"] >= 0.99, logits
    assert logits["max_abs_diff"] <= 1.01 * 2 * logits["max_abs"] / 255, logits


def test_integer_gates_have_straight_through_gradients_and_are_hard_sigmoid_unquantized(gate_graph):
    """The gradient of an integer gate (``gate_graph``) by its input is alpha where the gate is inside (0, 1)
    and 0 where it saturates (straight through the rounding, as TF's FakeQuant); with quantization off
    (finetune's teacher) the gates are HardSigmoid up to float rounding."""
    train = onnx.load(gate_graph[0])
    gates = {q["gate"]["alpha"]: q["output"] for q in json.loads(
        {p.key: p.value for p in train.metadata_props}["qtool.training"])["activation_quantizers"] if "gate" in q}
    names = list(gates.values())
    interp = Interpreter(train)
    x = gate_inputs()
    feeds = {"qtool_step": np.array(10**6, np.int64), "qtool_range_update": np.array(0, np.float32)}

    def run(v, quantized=True):
        return interp.run({"x": v, **feeds}, fake_quant=quantized, outputs=names)

    @jax.jit  # one compilation; the gates are elementwise in x: the first copy's gradient is the first gate's
    def evaluate(v):
        def loss(u):
            out = run(u)
            return jnp.sum(out[names[0]][:len(v)]) + jnp.sum(out[names[1]][len(v):])
        return jax.grad(loss)(jnp.concatenate([v, v])), run(v, False)

    slopes, off = evaluate(jnp.asarray(x))
    y = x.astype(np.float64)  # the Conv's weight is 1: the gates read x's grid
    for i, (alpha, name) in enumerate(gates.items()):
        slope = np.asarray(slopes)[i * len(x):(i + 1) * len(x)]
        inside = (alpha * y + 0.5 > 0) & (alpha * y + 0.5 < 1)
        np.testing.assert_allclose(slope[inside], alpha, rtol=1e-5)
        assert np.all(slope[~inside] == 0) and inside.sum() > 100 and (~inside).sum() > 0
        np.testing.assert_allclose(np.asarray(off[name]), np.clip(alpha * y + 0.5, 0, 1), atol=1e-6)


def test_training_graph_before_freeze_and_quant_delay(tmp_path):
    """Batch statistics before the freeze, the quant delay's float pass: equal to onnxruntime
    within float32 rounding (the batch mean/variance sums differ in order)."""
    from qtool.api import rewrite_train

    path = tmp_path / "delayed.qat.onnx"
    rewrite_train(str(MODEL), str(path), calibration_data=str(CALIB), quant=QuantConfig(weight_bits=4, activation_bits=4), schedule=TrainSchedule(quant_delay=3, freeze_bn_delay=5))
    interp = Interpreter(onnx.load(path))
    x = np.load(CALIB)["input"][:32]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    run = jax.jit(lambda x, step: interp.run({"input": x, "qtool_step": step}))
    for step in (0, 4, 9):
        ref = session.run(None, {"input": x, "qtool_step": np.array(step, np.int64)})
        out = run(jnp.asarray(x), jnp.int32(step))
        for name, r in zip(interp.output_names, ref):
            o = np.asarray(out[name])
            if name == "logits" and step == 0:  # no quantization yet: a float network
                np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4)
            elif name == "logits":
                # quantized logits: equal but for a level flipped by the batch-statistics rounding
                assert np.mean(o == r) > 0.98, (step, np.mean(o == r))
            else:
                np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6, err_msg=f"{name} at step {step}")


# --- op by op against onnxruntime -----------------------------------------------------------------------------
def _model(node, inputs: dict, consts: dict, n_out: int, opset: int):
    f = TensorProto.FLOAT
    graph_inputs = []
    for name, arr in inputs.items():
        graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
    outs = [helper.make_tensor_value_info(o, f, None) for o in node.output[:n_out]]
    graph = helper.make_graph([node], "g", graph_inputs, outs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(op_type, inputs, consts=None, attrs=None, opset=13, n_out=1, tol=1e-5, input_order=None, outputs=None):
    consts = consts or {}
    order = input_order or (list(inputs) + list(consts))
    outputs = outputs or [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, order, outputs, **(attrs or {}))
    model = _model(node, inputs, consts, n_out, opset)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    got = Interpreter(model).run({k: jnp.asarray(v) for k, v in inputs.items()})
    for name, r in zip(outputs, ref):
        g = np.asarray(got[name])
        assert g.shape == r.shape, (op_type, attrs, g.shape, r.shape)
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol, err_msg=f"{op_type} {attrs}")




def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("attrs, wshape, xshape", [
    ({}, (4, 3, 3, 3), (2, 3, 7, 7)),
    ({"pads": [1, 2, 0, 1], "strides": [2, 1]}, (4, 3, 3, 2), (2, 3, 8, 7)),
    ({"dilations": [2, 2], "pads": [2, 2, 2, 2]}, (4, 3, 3, 3), (1, 3, 9, 9)),
    ({"group": 3}, (6, 1, 3, 3), (1, 3, 6, 6)),
    ({"group": 2, "strides": [2, 2]}, (4, 2, 3, 3), (1, 4, 9, 8)),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (4, 3, 4, 4), (1, 3, 7, 8)),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, (4, 3, 4, 4), (1, 3, 7, 8)),
    ({"auto_pad": "VALID"}, (4, 3, 2, 2), (1, 3, 5, 5)),
    ({"pads": [1, 1]}, (4, 3, 3), (2, 3, 9)),
])
def test_conv(attrs, wshape, xshape):
    _check("Conv", {"x": _r(*xshape)}, {"w": _r(*wshape), "b": _r(wshape[0])}, attrs)


@pytest.mark.parametrize("attrs, wshape, xshape", [
    ({"strides": [2, 2]}, (3, 4, 3, 3), (1, 3, 5, 5)),
    ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, (3, 4, 3, 3), (1, 3, 5, 4)),
    ({"group": 2, "strides": [2, 1]}, (4, 3, 2, 2), (1, 4, 4, 4)),
    ({"dilations": [2, 2]}, (3, 2, 3, 3), (1, 3, 4, 4)),
    ({"strides": [2, 2], "output_shape": [10, 10]}, (3, 2, 3, 3), (1, 3, 5, 5)),
])
def test_conv_transpose(attrs, wshape, xshape):
    _check("ConvTranspose", {"x": _r(*xshape)}, {"w": _r(*wshape)}, attrs)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1, "alpha": 0.5, "beta": 2.0}])
def test_gemm(attrs):
    a = _r(4, 5) if not attrs.get("transA") else _r(5, 4)
    b = _r(5, 3) if not attrs.get("transB") else _r(3, 5)
    _check("Gemm", {"a": a}, {"b": b, "c": _r(3)}, attrs)


def test_matmul_batched():
    _check("MatMul", {"a": _r(2, 3, 4, 5), "b": _r(2, 3, 5, 6)})
    _check("MatMul", {"a": _r(2, 3, 4, 5)}, {"b": _r(5, 6)})


@pytest.mark.parametrize("op_type, attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
])
def test_pooling(op_type, attrs):
    _check(op_type, {"x": _r(2, 3, 8, 9)}, attrs=attrs)


@pytest.mark.parametrize("attrs, scales, sizes", [
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 2, 2], None),
    ({"mode": "nearest"}, [1, 1, 1.5, 2.5], None),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, None, [2, 3, 7, 11]),
    ({"mode": "linear"}, [1, 1, 2, 2], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [2, 3, 9, 4]),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 0.5, 2], None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [2, 3, 1, 7]),
])
def test_resize(attrs, scales, sizes):
    consts = {"roi": np.zeros(0, np.float32), "scales": np.asarray(scales or [], np.float32)}
    if sizes is not None:
        consts["sizes"] = np.asarray(sizes, np.int64)
    _check("Resize", {"x": _r(2, 3, 4, 5)}, consts, attrs, input_order=["x"] + list(consts))


def test_data_movement():
    x = _r(2, 3, 4, 5)
    _check("Concat", {"a": x, "b": _r(2, 2, 4, 5)}, attrs={"axis": 1})
    _check("Split", {"x": x}, {"s": np.asarray([1, 3], np.int64)}, {"axis": 2}, n_out=2)
    _check("Split", {"x": x}, attrs={"axis": 1, "split": [1, 2]}, opset=11, n_out=2)
    _check("Slice", {"x": x}, {"st": np.asarray([-1, 1], np.int64), "en": np.asarray([-100, 4], np.int64),
                               "ax": np.asarray([3, 1], np.int64), "sp": np.asarray([-2, 1], np.int64)})
    _check("Gather", {"x": x}, {"i": np.asarray([[0, -1], [2, 1]], np.int64)}, {"axis": 2})
    _check("Reshape", {"x": x}, {"s": np.asarray([0, -1, 5], np.int64)})
    _check("Transpose", {"x": x}, attrs={"perm": [0, 2, 3, 1]})
    _check("Flatten", {"x": x}, attrs={"axis": 2})
    _check("Squeeze", {"x": _r(2, 1, 3, 1)}, {"a": np.asarray([1, -1], np.int64)})
    _check("Unsqueeze", {"x": x}, {"a": np.asarray([0, -1], np.int64)})
    _check("Unsqueeze", {"x": x}, attrs={"axes": [1]}, opset=11)
    _check("Expand", {"x": _r(3, 1)}, {"s": np.asarray([2, 1, 4], np.int64)})
    _check("Tile", {"x": _r(2, 3)}, {"r": np.asarray([2, 1], np.int64)})
    _check("Pad", {"x": x}, {"p": np.asarray([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}, {"mode": "reflect"})
    # a causal mask (torch.triu in a decoder's export) on a batched input, both triangles, both signs of k
    _check("Trilu", {"x": _r(2, 5, 5)}, {"k": np.asarray(1, np.int64)}, opset=14)
    _check("Trilu", {"x": _r(2, 4, 6)}, {"k": np.asarray(-1, np.int64)}, {"upper": 0}, opset=14)
    _check("Trilu", {"x": _r(4, 6)}, opset=14)
    # a streaming cache written in place (GTCRN: cache[:, :, a:b] = x, exported as ScatterND), negative indices
    _check("ScatterND", {"x": _r(2, 3, 4), "u": _r(2, 2, 4)},
           {"i": np.asarray([[[0, 1], [1, -1]], [[1, 0], [0, 0]]], np.int64)}, input_order=["x", "i", "u"], opset=13)
    _check("ScatterND", {"x": _r(4, 3), "u": _r(2, 3)}, {"i": np.asarray([[1], [3]], np.int64)},
           {"reduction": "add"}, input_order=["x", "i", "u"], opset=16)


@pytest.mark.parametrize("op_type, attrs, opset", [
    ("Relu", {}, 13), ("LeakyRelu", {"alpha": 0.2}, 13), ("Sigmoid", {}, 13), ("Tanh", {}, 13),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 13), ("HardSwish", {}, 14), ("Erf", {}, 13),
    ("Softmax", {"axis": 1}, 11), ("Softmax", {"axis": 1}, 13), ("LogSoftmax", {}, 13), ("Abs", {}, 13),
    ("Neg", {}, 13), ("Exp", {}, 13), ("Floor", {}, 13), ("Ceil", {}, 13), ("Round", {}, 13),
    ("Elu", {}, 13), ("Identity", {}, 13),
])
def test_unary(op_type, attrs, opset):
    _check(op_type, {"x": _r(2, 5, 3) * 3}, attrs=attrs, opset=opset)


def test_positive_unary_and_binary():
    x = np.abs(_r(3, 4)) + 0.1
    for op_type in ("Sqrt", "Log", "Reciprocal"):
        _check(op_type, {"x": x})
    a, b = _r(3, 4), np.abs(_r(4)) + 0.5
    for op_type in ("Add", "Sub", "Mul", "Div", "Min", "Max"):
        _check(op_type, {"a": a}, {"b": b})
    _check("Pow", {"a": x}, {"b": np.asarray(1.7, np.float32)})
    _check("Clip", {"x": a}, {"lo": np.asarray(-0.5, np.float32), "hi": np.asarray(0.7, np.float32)})
    _check("Clip", {"x": a}, attrs={"min": -0.5, "max": 0.7}, opset=6)


def test_magnitude_gradient_is_finite_where_both_parts_are_zero():
    """Sqrt(re**2 + im**2) (silero-vad's STFT): where both parts are exactly 0, as fake-quantized quiet audio
    gives, the gradient is 0 instead of inf * 0 = NaN; elsewhere d sqrt(x) = 1 / (2 sqrt(x))."""
    nodes = [helper.make_node("Mul", ["re", "re"], ["r2"]), helper.make_node("Mul", ["im", "im"], ["i2"]),
             helper.make_node("Add", ["r2", "i2"], ["s"]), helper.make_node("Sqrt", ["s"], ["y"])]
    vec = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [3])  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes, "g", [vec("re"), vec("im")], [vec("y")]),
                              opset_imports=[helper.make_opsetid("", 13)])
    run = Interpreter(model).run
    re, im = jnp.asarray([0.0, 3.0, 0.0], jnp.float32), jnp.asarray([0.0, 4.0, 2.0], jnp.float32)
    grad = jax.grad(lambda r: jnp.sum(run({"re": r, "im": im})["y"]))(re)
    np.testing.assert_allclose(np.asarray(grad), [0.0, 0.6, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(run({"re": re, "im": im})["y"]), [0.0, 5.0, 2.0])


def test_logic():
    a, b = np.round(_r(3, 4)), np.round(_r(3, 4))
    for op_type in ("Equal", "Greater", "GreaterOrEqual", "Less"):
        node = helper.make_node(op_type, ["a", "b"], ["c"])
        where = helper.make_node("Where", ["c", "a", "b"], ["y0"])
        notn = helper.make_node("Not", ["c"], ["n"])
        andn = helper.make_node("And", ["c", "n"], ["k"])
        cast = helper.make_node("Cast", ["k"], ["y1"], to=TensorProto.FLOAT)
        graph = helper.make_graph([node, where, notn, andn, cast], "g",
                                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape),
                                   helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)],
                                  [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None),
                                   helper.make_tensor_value_info("y1", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"a": a, "b": b})
        got = Interpreter(model).run({"a": jnp.asarray(a), "b": jnp.asarray(b)})
        np.testing.assert_array_equal(np.asarray(got["y0"]), ref[0])
        np.testing.assert_array_equal(np.asarray(got["y1"]), ref[1])


@pytest.mark.parametrize("op_type, opset, axes_input", [
    ("ReduceMean", 13, False), ("ReduceMean", 18, True), ("ReduceSum", 13, True), ("ReduceSum", 11, False),
    ("ReduceMax", 13, False), ("ReduceMin", 18, True),
])
def test_reductions(op_type, opset, axes_input):
    x = _r(2, 3, 4)
    for keep in (0, 1):
        if axes_input:
            _check(op_type, {"x": x}, {"ax": np.asarray([0, -1], np.int64)}, {"keepdims": keep}, opset=opset)
        else:
            _check(op_type, {"x": x}, attrs={"axes": [0, -1], "keepdims": keep}, opset=opset)


@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin"])
def test_extremes_of_an_empty_set_are_infinite(op_type):
    """A key/value cache's past is empty at a decoder's first step (optimum's GPT-2 export, capp-gpt-serve): the
    training graph's batch range reduces it, and onnxruntime gives -inf / +inf where numpy and jax raise."""
    x = np.zeros((2, 4, 0, 16), np.float32)
    _check(op_type, {"x": x}, attrs={"keepdims": 0})
    _check(op_type, {"x": x}, attrs={"axes": [2], "keepdims": 1})
    _check(op_type, {"x": x}, attrs={"axes": [1], "keepdims": 1})  # not reduced over the empty axis: empty


def test_normalization():
    x = _r(4, 3, 5, 5)
    gamma, beta, mean, var = _r(3), _r(3), _r(3), np.abs(_r(3)) + 0.5
    _check("BatchNormalization", {"x": x}, {"g": gamma, "b": beta, "m": mean, "v": var}, {"epsilon": 1e-3})
    _check("BatchNormalization", {"x": x}, {"g": gamma, "b": beta, "m": mean, "v": var},
           {"training_mode": 1, "momentum": 0.8}, opset=15, n_out=3)
    _check("LayerNormalization", {"x": _r(2, 5, 8)}, {"s": _r(8), "b": _r(8)}, {"axis": -1}, opset=17)


def test_shape_chain_is_static_under_jit():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, and ConstantOfShape: concrete at trace time."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Shape", ["flat"], ["fs"]),
        helper.make_node("ConstantOfShape", ["fs"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
        helper.make_node("Add", ["flat", "ones"], ["y"]),
    ]
    consts = [numpy_helper.from_array(np.asarray(0, np.int64), "zero"),
              numpy_helper.from_array(np.asarray([0], np.int64), "zero1"),
              numpy_helper.from_array(np.asarray([-1], np.int64), "minus1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    interp = Interpreter(model)
    x = _r(5, 3, 4)
    y = jax.jit(lambda x: interp.run({"x": x})["y"])(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(y), x.reshape(5, -1) + 1)


# --- errors ----------------------------------------------------------------------------------------------------
def test_unknown_op_is_a_clear_error_naming_it():
    node = helper.make_node("NonMaxSuppression", ["x", "s"], ["y"], name="nms_1")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4]),
                                            helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(QtoolError, match=r"node 'nms_1' is a NonMaxSuppression \(the default domain\).*"
                                         r"does not implement"):
        Interpreter(model, label="m.onnx")
    node = helper.make_node("Mystery", ["x"], ["y"], name="custom", domain="com.vendor")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.vendor", 1)])
    with pytest.raises(QtoolError, match=r"node 'custom' is a Mystery \(domain 'com.vendor'\)"):
        Interpreter(model)


def test_traced_shape_is_a_clear_error():
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_by_data")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                            helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    interp = Interpreter(model)
    with pytest.raises(QtoolError, match="reshape_by_data.*target shape.*static shapes"):
        jax.jit(lambda x, s: interp.run({"x": x, "s": s})["y"])(jnp.ones((2, 3)), jnp.asarray([3, 2]))
