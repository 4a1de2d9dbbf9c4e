"""Layer weights the graph computes from constants (``model.weight_expressions``).

Written as torch's TorchScript exporter writes an ``nn.LSTM`` where its constant folding does not run
(inside an If branch, ``do_constant_folding=False``): ``W = Unsqueeze(Concat(Slice(weight_ih, i), Slice(...
o), ...))`` re-cutting PyTorch's gate order into ONNX's, weights held in Constant nodes, opset 11 and 17;
and a Conv whose weight is a ``Concat`` of two Constant halves (a model stitched from two).
"""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qtool

T, B, I, H = 5, 3, 6, 8
RNG = np.random.default_rng(11)


def _const(name, array):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name + "_value"))


def _gates(prefix, weight, opset):
    """torch's LSTM symbolic: ``Concat(Slice(w, [0, H]), Slice(w, [3H, 4H]), Slice(w, [H, 3H]))`` on axis 0,
    Unsqueezed to ``[1, 4H, K]``."""
    nodes, parts = [], []
    for k, (begin, end) in enumerate(((0, H), (3 * H, 4 * H), (H, 3 * H))):
        name = f"{prefix}/Slice_{k}"
        if opset >= 10:
            nodes += [_const(f"{name}/starts", np.array([begin], np.int64)), _const(f"{name}/ends", np.array([end], np.int64)),
                      _const(f"{name}/axes", np.array([0], np.int64)),
                      helper.make_node("Slice", [weight, f"{name}/starts", f"{name}/ends", f"{name}/axes"], [name + "_out"])]
        else:
            nodes.append(helper.make_node("Slice", [weight], [name + "_out"], starts=[begin], ends=[end], axes=[0]))
        parts.append(name + "_out")
    nodes.append(helper.make_node("Concat", parts, [f"{prefix}/cat"], axis=0))
    if opset >= 13:
        nodes += [_const(f"{prefix}/zero", np.array([0], np.int64)),
                  helper.make_node("Unsqueeze", [f"{prefix}/cat", f"{prefix}/zero"], [f"{prefix}/w"])]
    else:
        nodes.append(helper.make_node("Unsqueeze", [f"{prefix}/cat"], [f"{prefix}/w"], axes=[0]))
    return nodes, f"{prefix}/w"


def lstm_model(opset: int, arithmetic: bool = False) -> onnx.ModelProto:
    """x [T, B, I] -> LSTM (W, R, B computed from Constant nodes) -> Conv1d-free head: Y_h -> MatMul."""
    w_ih = RNG.normal(0, 0.4, (4 * H, I)).astype(np.float32)
    w_hh = RNG.normal(0, 0.4, (4 * H, H)).astype(np.float32)
    bias = RNG.normal(0, 0.2, (8 * H,)).astype(np.float32)
    nodes = [_const("weight_ih", w_ih), _const("weight_hh", w_hh), _const("bias", bias)]
    w_nodes, w = _gates("/rnn/W", "weight_ih", opset)
    r_nodes, r = _gates("/rnn/R", "weight_hh", opset)
    nodes += w_nodes + r_nodes
    if arithmetic:  # a weight scaled in the graph: arithmetic is not folded (onnxruntime's float steps)
        nodes += [_const("two", np.array(2.0, np.float32)), helper.make_node("Mul", [w, "two"], ["/rnn/W2"])]
        w = "/rnn/W2"
    nodes += [_const("/rnn/b_axes", np.array([0], np.int64)) if opset >= 13 else _const("unused", np.zeros(1, np.float32))]
    nodes += [helper.make_node("Unsqueeze", ["bias", "/rnn/b_axes"], ["/rnn/B"]) if opset >= 13 else
              helper.make_node("Unsqueeze", ["bias"], ["/rnn/B"], axes=[0]),
              helper.make_node("LSTM", ["x", w, r, "/rnn/B"], ["Y", "Y_h", "Y_c"], hidden_size=H),
              _const("head", RNG.normal(0, 0.5, (H, 2)).astype(np.float32)),
              helper.make_node("MatMul", ["Y_h", "head"], ["logits"])]
    nodes = [n for n in nodes if n.output[0] != "unused"]
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, "batch", I])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model


def conv_model() -> onnx.ModelProto:
    """A Conv whose weight is ``Concat`` of two Constant halves along the output channels."""
    halves = [RNG.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32) for _ in range(2)]
    nodes = [_const("w_a", halves[0]), _const("w_b", halves[1]),
             helper.make_node("Concat", ["w_a", "w_b"], ["w"], axis=0),
             _const("b", RNG.normal(0, 0.1, 16).astype(np.float32)),
             helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def run(model, feeds):
    proto = model if isinstance(model, onnx.ModelProto) else ir.serde.serialize_model(model)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def ops(model) -> list[str]:
    return [n.op_type for n in ir.serde.serialize_model(model).graph.node]


@pytest.mark.parametrize("opset", [11, 17])
def test_an_lstm_whose_weights_the_graph_cuts_from_constants_runs_dynamic_int8(opset):
    model = lstm_model(opset)
    x = RNG.standard_normal((T, 4, I)).astype(np.float32)
    result = qtool.rewrite_eval(model, calibration_data={"x": x})
    counts = result.counts()
    # W and R (B, an Unsqueeze of one constant, was read as a constant already)
    assert counts["weight_expressions_folded"] == 2 and counts["lstms_dynamic"] == 1
    assert not any(x["op"] == "LSTM" for x in result.left_in_float())
    assert "weights folded         2" in result.format_text()
    assert "Slice" not in ops(result.model) and "Concat" not in ops(result.model)
    folded = result.to_dict()["weight_expressions_folded"]
    assert [(e["op"], e["input"], e["computed_by"]) for e in folded] == [("LSTM", 1, "Unsqueeze"),
                                                                           ("LSTM", 2, "Unsqueeze")]
    int8 = run(result.model, {"x": x})
    want = run(model, {"x": x})
    assert np.abs(int8 - want).max() < 0.1 * np.abs(want).max()


def test_folding_changes_no_value_of_the_float_model():
    from qtool.model.weight_expressions import fold_weight_expressions

    for model, opset in ((lstm_model(11), 11), (lstm_model(17), 17), (conv_model(), 13)):
        ir_model = ir.serde.deserialize_model(model)
        assert fold_weight_expressions(ir_model.graph, opset)
        name = model.graph.input[0].name
        shape = [d.dim_value or 2 for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = {name: RNG.standard_normal(shape).astype(np.float32)}
        assert np.array_equal(run(ir_model, x), run(model, x))
        assert not {"Slice", "Concat"} & set(ops(ir_model))


def test_a_conv_weight_concatenated_from_constants_is_quantized_and_trains():
    x = RNG.standard_normal((4, 3, 8, 8)).astype(np.float32)
    result = qtool.rewrite_eval(conv_model(), calibration_data={"x": x})
    assert result.counts()["weight_expressions_folded"] == 1 and result.counts()["layers_quantized"] == 1
    train = qtool.rewrite_train(conv_model(), calibration_data={"x": x})
    assert train.counts()["layers_quantized"] == 1 and "Concat" not in ops(train.model)


def test_weight_arithmetic_is_not_folded_and_the_layer_says_why():
    model = lstm_model(17, arithmetic=True)
    x = RNG.standard_normal((T, 4, I)).astype(np.float32)
    result = qtool.rewrite_eval(model, calibration_data={"x": x})
    assert result.counts()["weight_expressions_folded"] == 1 and result.counts()["lstms_dynamic"] == 0  # R
    reason = next(x["reason"] for x in result.left_in_float() if x["op"] == "LSTM")
    assert "is computed at run time by Mul node" in reason


def test_an_excluded_layer_keeps_its_expression():
    model = conv_model()
    name = "conv"
    model.graph.node[4].name = name
    result = qtool.rewrite_eval(model, quant=qtool.QuantConfig(exclude=(name,)),
                                calibration_data={"x": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)})
    assert result.counts()["weight_expressions_folded"] == 0 and "Concat" in ops(result.model)
