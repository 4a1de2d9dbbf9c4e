"""If branches quantized as models of their own (``onnx_rewrite.branches``).

The models are written the way the Silero VAD exports are: all the work inside an ``If`` on the
sample rate, weights as the enclosing graph's initializers (the opset-18 dynamo export) or as
Constant nodes inside the branch (the TorchScript export), an If nested in a branch, unnamed nodes.
"""

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qtool
from qtool.api import calibrate_to_file, simulate
from qtool.config import CalibrationConfig
from qtool.onnx_rewrite.branches import finish_branches
from qtool.simulate.config import SimulateConfig

RNG = np.random.default_rng(20261124)
FLOAT_LAYERS = {"Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul"}


def _weights(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _const(name, array):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name + "_value"))


def _branch(tag: str, x: str, w_outer: str, constant_weights: bool, nested: bool = False) -> onnx.GraphProto:
    """Conv (outer weight) -> Relu -> Conv (weight as a Constant node or outer) -> Relu -> mean over time."""
    w2 = f"{tag}_w2"
    nodes = [helper.make_node("Conv", [x, w_outer], [f"{tag}_c1"], pads=[1, 1]),  # unnamed, as exporters write
             helper.make_node("Relu", [f"{tag}_c1"], [f"{tag}_r1"])]
    if constant_weights:
        nodes.insert(0, _const(w2, _weights(8, 8, 3)))
    if nested:  # an If inside the branch on the sign of the mean, each side a Conv of its own
        inner = [
            helper.make_node("ReduceMean", [f"{tag}_c1"], [f"{tag}_m"], keepdims=0),
            helper.make_node("Greater", [f"{tag}_m", "zero"], [f"{tag}_pos"]),
            helper.make_node("If", [f"{tag}_pos"], [f"{tag}_r2"], name=f"{tag}_inner",
                             then_branch=_single_conv(f"{tag}_t", f"{tag}_r1"),
                             else_branch=_single_conv(f"{tag}_e", f"{tag}_r1")),
        ]
        nodes += inner
    else:
        nodes += [helper.make_node("Conv", [f"{tag}_r1", w2 if constant_weights else "w2"], [f"{tag}_c2"], pads=[1, 1]),
                  helper.make_node("Relu", [f"{tag}_c2"], [f"{tag}_r2"])]
    nodes += [helper.make_node("GlobalAveragePool", [f"{tag}_r2"], [f"{tag}_p"]),
              helper.make_node("Flatten", [f"{tag}_p"], [f"{tag}_out"])]
    out = helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT, None)
    return helper.make_graph(nodes, tag, [], [out])


def _single_conv(tag: str, x: str) -> onnx.GraphProto:
    nodes = [_const(f"{tag}_w", _weights(8, 8, 3)),
             helper.make_node("Conv", [x, f"{tag}_w"], [f"{tag}_c"], pads=[1, 1]),
             helper.make_node("Relu", [f"{tag}_c"], [f"{tag}_y"])]
    return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}_y", TensorProto.FLOAT, None)])


def silero_like(opset=18, constant_weights=False, nested=False) -> onnx.ModelProto:
    """``y = If(sr == 16000, then: net(x; w16), else: net(x; w8))``, x ``[N, 4, 32]``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 32])
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
    inits = [numpy_helper.from_array(_weights(8, 4, 3), "w16"), numpy_helper.from_array(_weights(8, 4, 3), "w8"),
             numpy_helper.from_array(_weights(8, 8, 3), "w2"), numpy_helper.from_array(np.array(16000), "k16"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    nodes = [helper.make_node("Equal", ["sr", "k16"], ["is16"]),
             helper.make_node("If", ["is16"], ["y"], name="by_rate",
                              then_branch=_branch("t", "x", "w16", constant_weights, nested),
                              else_branch=_branch("e", "x", "w8", constant_weights, nested))]
    graph = helper.make_graph(nodes, "silero_like", [x, sr], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def data(n=16, sr=16000):
    return {"x": np.random.default_rng(7).standard_normal((n, 4, 32)).astype(np.float32), "sr": np.array(sr)}


def run(model, feeds, tmp_path=None):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if tmp_path is not None:
        options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    proto = model if isinstance(model, onnx.ModelProto) else ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def branch_ops(path) -> dict[str, Counter]:
    """Op counts of each branch (any depth) of onnxruntime's optimized graph, by branch graph name."""
    found = {}

    def walk(graph):
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    found[f"{node.name}.{attr.name}"] = Counter(n.op_type for n in attr.g.node)
                    walk(attr.g)
    walk(onnx.load(str(path)).graph)
    return found


def sqnr(want, got):
    return 10 * np.log10(np.sum(want ** 2) / np.sum((want - got) ** 2))


@pytest.mark.parametrize("opset,constant_weights", [(18, False), (17, True), (11, False)])
def test_the_branch_taken_runs_in_integers(opset, constant_weights, tmp_path):
    model = silero_like(opset, constant_weights)
    result = qtool.rewrite_eval(model, calibration_data=data())
    out = ir.serde.serialize_model(result.model)
    onnx.checker.check_model(out, full_check=True)
    got, want = run(out, data(), tmp_path), run(model, data())
    assert sqnr(want, got) > 25
    ops = branch_ops(tmp_path / "optimized.onnx")
    then, other = ops["by_rate.then_branch"], ops["by_rate.else_branch"]
    assert then["QLinearConv"] == 2 and not FLOAT_LAYERS & set(then), then
    assert other["Conv"] + other["FusedConv"] == 2 and not other["QLinearConv"], other  # 8 kHz: no sample took it
    counts = result.counts()
    assert counts["layers_quantized"] == 2 and counts["activations_quantized"] > 0
    left = {x["node"]: x["reason"] for x in result.left_in_float()}
    assert len(left) == 2 and all(r == "inside If 'by_rate' (else_branch): no calibration sample took this branch"
                                  for r in left.values()), left
    assert result.summary["if_branches"][0] == {"node": "by_rate", "attribute": "then_branch", "quantized": True,
                                                "samples": 16, "reason": None,
                                                "counts": result.branches[0].result.counts()}
    assert "calibrated in If branches: 16 samples" in result.format_text()
    assert not result.warnings
    # the 8 kHz data takes the other branch, which then is the quantized one
    result8 = qtool.rewrite_eval(model, calibration_data=data(sr=8000))
    assert [b.samples for b in result8.branches] == [0, 16] and result8.branches[1].result is not None
    assert sqnr(run(model, data(sr=8000)), run(result8.model, data(sr=8000))) > 25


def test_outer_weights_only_the_branches_read_are_not_kept_float(tmp_path):
    result = qtool.rewrite_eval(silero_like(18), calibration_data=data())
    top = ir.serde.serialize_model(result.model).graph
    names = {i.name for i in top.initializer}
    assert "w16" not in names  # quantized inside the branch: its float copy is gone
    assert {"w8", "w2"} <= names  # still read by the float branch


def test_nested_if_branches_are_quantized_on_the_samples_that_take_them(tmp_path):
    model = silero_like(17, constant_weights=True, nested=True)
    feeds = data(32)
    result = qtool.rewrite_eval(model, calibration_data=feeds, calibration=qtool.config.CalibrationConfig(batch_size=1))
    inner = result.branches[0].result.branches
    assert [(b.node, b.attribute) for b in inner] == [("t_inner", "then_branch"), ("t_inner", "else_branch")]
    assert sum(b.samples for b in inner) == 32 and all(b.result is not None for b in inner), \
        [(b.samples, b.reason) for b in inner]
    out = ir.serde.serialize_model(result.model)
    onnx.checker.check_model(out, full_check=True)
    got = np.concatenate([run(out, {"x": feeds["x"][i:i + 1], "sr": feeds["sr"]}, tmp_path) for i in range(32)])
    want = np.concatenate([run(model, {"x": feeds["x"][i:i + 1], "sr": feeds["sr"]}) for i in range(32)])
    assert sqnr(want, got) > 25
    ops = branch_ops(tmp_path / "optimized.onnx")
    assert ops["t_inner.then_branch"]["QLinearConv"] == 1 and ops["t_inner.else_branch"]["QLinearConv"] == 1, ops
    assert result.counts()["layers_quantized"] == 3  # the 16 kHz branch's first conv and both inner ones


def test_without_calibration_data_the_branches_stay_float_and_say_why():
    result = qtool.rewrite_eval(silero_like(18))
    assert result.counts()["layers_quantized"] == 0
    reasons = {x["reason"] for x in result.left_in_float()}
    assert reasons == {f"inside If 'by_rate' ({a}): not calibrated (no --data or --ranges)"
                       for a in ("then_branch", "else_branch")}
    assert any(w.startswith("no layer quantized: all 4 layer op(s) are inside If/Loop/Scan bodies") for w in
               result.warnings)


def test_a_ranges_file_holds_the_branches_tensors(tmp_path):
    """calibrate -> rewrite-eval --ranges writes the model rewrite-eval --data writes, byte for byte."""
    model = silero_like(17, constant_weights=True, nested=True)
    feeds = data(32)
    one = qtool.config.CalibrationConfig(batch_size=1)
    direct = qtool.rewrite_eval(model, calibration_data=feeds, calibration=one)
    summary = calibrate_to_file(model, feeds, tmp_path / "ranges.json", calibration=one)
    # every tensor is inside the branches: the summary counts the batches the data was streamed in for them
    assert summary.tensors > 0 and (summary.samples, summary.batches) == (32, 32) and summary.seconds > 0
    via_file = qtool.rewrite_eval(model, ranges=tmp_path / "ranges.json")
    assert via_file.counts()["layers_quantized"] == direct.counts()["layers_quantized"] == 3
    assert ir.serde.serialize_model(via_file.model).SerializeToString() == \
        ir.serde.serialize_model(direct.model).SerializeToString()
    # a ranges file of another model has none of the branch's tensors: the branch stays float and says so
    partial = qtool.rewrite_eval(model, ranges={"x": (-3.0, 3.0)})
    assert all("the ranges have none for its tensors" in x["reason"] for x in partial.left_in_float()
               if x["node"].startswith("t_"))


def test_simulate_what_if_quantizes_the_branches():
    report = simulate(silero_like(18), data(), SimulateConfig()).to_dict()
    assert 20 < report["models"][0]["output"]["sqnr_db"] < 60  # quantized (a float branch compares exactly: inf)


def test_names_a_branch_repeats_from_the_enclosing_graph_are_renamed():
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT))
    top_relu = ir.node("Relu", [x], name="r")
    top_relu.outputs[0].name = "a/quant"
    body_relu = ir.node("Relu", [top_relu.outputs[0]])
    body_relu.outputs[0].name = "a/quant"  # what a branch model named without seeing the enclosing graph
    body = ir.Graph([], [body_relu.outputs[0]], nodes=[body_relu], name="b")
    other = ir.node("Identity", [x])
    other.outputs[0].name = "x2"
    cond = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL))
    node = ir.node("If", [cond], attributes={"then_branch": body,
                                              "else_branch": ir.Graph([], other.outputs, nodes=[other], name="o")},
                   num_outputs=1)
    graph = ir.Graph([x, cond], node.outputs, nodes=[top_relu, node], opset_imports={"": 18})
    finish_branches(graph)
    assert top_relu.outputs[0].name == "a/quant" and body_relu.outputs[0].name == "a/quant_1"
    assert other.outputs[0].name == "x2"


def test_an_lstm_in_a_branch_imports_the_domain_of_its_dynamic_kernel():
    """silero-vad's decoder LSTM is inside the If: it became com.microsoft.DynamicQuantizeLSTM in the branch,
    but only the branch model imported com.microsoft, so onnx.checker refused the output ("No opset import
    for domain 'com.microsoft'"; onnxruntime loaded it anyway)."""
    hidden, feats = 4, 8

    def branch(tag):
        nodes = [_const(f"{tag}_W", _weights(1, 4 * hidden, feats)), _const(f"{tag}_R", _weights(1, 4 * hidden, hidden)),
                 helper.make_node("Transpose", ["x"], [f"{tag}_xt"], perm=[2, 0, 1]),
                 helper.make_node("LSTM", [f"{tag}_xt", f"{tag}_W", f"{tag}_R"], ["", f"{tag}_h"], hidden_size=hidden),
                 helper.make_node("Squeeze", [f"{tag}_h", "axis0"], [f"{tag}_out"])]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT, None)])

    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "k16"], ["is16"]),
         helper.make_node("If", ["is16"], ["y"], name="by_rate", then_branch=branch("t"), else_branch=branch("e"))],
        "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", feats, 32]),
                helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", hidden])],
        [numpy_helper.from_array(np.array(16000), "k16"), numpy_helper.from_array(np.array([0], np.int64), "axis0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": np.random.default_rng(3).standard_normal((8, feats, 32)).astype(np.float32), "sr": np.array(16000)}
    result = qtool.rewrite_eval(model, calibration_data=feeds)
    assert result.counts()["lstms_dynamic"] == 1
    out = ir.serde.serialize_model(result.model)
    assert {o.domain: o.version for o in out.opset_import}.get("com.microsoft") == 1
    onnx.checker.check_model(out)
    assert sqnr(run(model, feeds), run(out, feeds)) > 20


def test_if_branches_are_calibrated_by_each_method_in_turn():
    """silero's work is all inside If branches: each method calibrates the branch taken, and the one kept
    is the model that method alone writes."""
    model = silero_like()  # (random weights: one model for both rewrites)
    auto = qtool.rewrite_eval(model, calibration_data=data(), calibration=CalibrationConfig(method="auto"))
    check = auto.to_dict()["output_check"]
    assert list(check["tried"]) == ["minmax", "percentile", "mse"]
    alone = qtool.rewrite_eval(model, calibration_data=data(),
                               calibration=CalibrationConfig(method=check["method"]))
    assert ir.serde.serialize_model(auto.model) == ir.serde.serialize_model(alone.model)
    assert auto.to_dict()["if_branches"][0]["quantized"]


def _stateful(identities: bool) -> onnx.ModelProto:
    """silero-vad's TorchScript export: ``output, stateN = If(sr == 16000)``, each branch a Conv and the new
    state a Concat of two of its reductions, written out through ``Identity`` nodes (the branch's output
    behind one, and each If output behind one before the graph output)."""
    def branch(tag, w):
        last = f"{tag}_state" if identities else f"{tag}_out_state"
        nodes = [helper.make_node("Conv", ["x", w], [f"{tag}_c"], pads=[1, 1]),
                 helper.make_node("Relu", [f"{tag}_c"], [f"{tag}_r"]),
                 helper.make_node("GlobalAveragePool", [f"{tag}_r"], [f"{tag}_p"]),
                 helper.make_node("Flatten", [f"{tag}_p"], [f"{tag}_out_y"]),
                 helper.make_node("ReduceMax", [f"{tag}_r"], [f"{tag}_h"], axes=[2], keepdims=0),
                 helper.make_node("ReduceMin", [f"{tag}_c"], [f"{tag}_l"], axes=[2], keepdims=0),
                 helper.make_node("Unsqueeze", [f"{tag}_h", "axis0"], [f"{tag}_h0"]),
                 helper.make_node("Unsqueeze", [f"{tag}_l", "axis0"], [f"{tag}_l0"]),
                 helper.make_node("Concat", [f"{tag}_h0", f"{tag}_l0"], [last], axis=0)]
        if identities:
            nodes.append(helper.make_node("Identity", [last], [f"{tag}_out_state"]))
        outs = [helper.make_tensor_value_info(f"{tag}_out_{n}", TensorProto.FLOAT, None) for n in ("y", "state")]
        return helper.make_graph(nodes, tag, [], outs)

    ifs = ["if_y", "if_state"] if identities else ["output", "stateN"]
    nodes = [helper.make_node("Equal", ["sr", "k16"], ["is16"]),
             helper.make_node("If", ["is16"], ifs, name="by_rate", then_branch=branch("t", "w16"),
                              else_branch=branch("e", "w8"))]
    if identities:
        nodes += [helper.make_node("Identity", ["if_y"], ["output"]), helper.make_node("Identity", ["if_state"], ["stateN"])]
    inits = [numpy_helper.from_array(np.random.default_rng(5).standard_normal((8, 4, 3)).astype(np.float32) * 0.3, w)
             for w in ("w16", "w8")]
    inits += [numpy_helper.from_array(np.array(16000), "k16"), numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    graph = helper.make_graph(nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 32]),
                                             helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 8]),
                               helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "N", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_state_output_behind_identities_is_placed_as_without_them():
    """A branch output written as ``Concat -> Identity`` kept the Concat's pair, carried through the Identity
    (the rule that drops a Concat output's pair no integer op reads saw a carried reader), so silero-vad's
    recurrent state left the model rounded to one 8-bit grid for h and c (scale 0.199: h in [-1, 1] on ~10
    levels), which its 16k_op15 export, with no Identity, never was. The Identities go before planning: both
    writings give the same int8 model, and the state output reads the Concat, no DequantizeLinear."""
    feeds = {"x": data()["x"], "sr": np.array(16000)}
    written = {}
    for identities in (True, False):
        out = ir.serde.serialize_model(qtool.rewrite_eval(_stateful(identities), calibration_data=feeds).model)
        onnx.checker.check_model(out, full_check=True)
        assert [o.name for o in out.graph.output] == ["output", "stateN"]
        if_node = next(n for n in out.graph.node if n.op_type == "If")
        then = next(a.g for a in if_node.attribute if a.name == "then_branch")
        producers = {o: n for n in then.node for o in n.output}
        assert producers[then.output[1].name].op_type == "Concat"
        written[identities] = [run(out, feeds)] + ort.InferenceSession(
            out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[1:]
    for with_identities, without in zip(written[True], written[False]):
        np.testing.assert_array_equal(with_identities, without)


def test_rewrite_train_quantizes_the_branches_the_data_takes_and_says_which_stay_float():
    """The 16 kHz branch (the calibration data's rate) is quantized for training; the 8 kHz branch, which no
    sample takes, stays float (as rewrite-eval leaves it), said by name; so do the branches of an If in a branch."""
    result = qtool.rewrite_train(silero_like(), calibration_data=data())
    warning, = [w for w in result.warnings if "inside If/Loop/Scan bodies" in w]
    assert warning.startswith("2 layer op(s)")
    assert "inside If 'by_rate' (else_branch): no calibration sample took this branch" in warning
    assert "If branches quantized for training as models of their own (their state in the graph): inside If " \
           "'by_rate' (then_branch)" in result.messages()[1]
    # the summary lists the float branch's layers with its reason, not the quantized branch's ("does not rewrite
    # subgraphs" was the plan's reason for both), and says where the initial ranges came from
    summary = result.to_dict()
    reasons = {x["reason"] for x in summary["left_in_float"]}
    assert reasons == {"inside If 'by_rate' (else_branch): no calibration sample took this branch"}
    assert summary["counts"]["left_in_float"] == 2 and summary["counts"]["layers_quantized"] == 2
    assert "initial ranges calibrated in If branches" in result.format_text()
    # nested: the inner branch the data takes is quantized for training too, the one it does not take said
    nested = qtool.rewrite_train(silero_like(nested=True), calibration_data=data()).to_dict()
    inner = [x["reason"] for x in nested["left_in_float"] if x["reason"].startswith("inside If 't_inner'")]
    assert all(r.endswith("): no calibration sample took this branch") for r in inner)
    assert nested["counts"]["layers_quantized"] == 3 - len(inner)  # the outer branch's Conv, the inner ones taken
    assert not [w for w in qtool.rewrite_train(proto_without_if()).warnings if "If/Loop/Scan" in w]


@pytest.mark.parametrize("nested", [False, True])
def test_rewrite_train_without_data_trains_every_branch_their_state_named_apart(nested, tmp_path):
    """Without data every branch is quantized for training (TF's default ranges); sibling branches quantize
    the tensor they both read ('x'): the second's state, and its tensors the enclosing graph names, take fresh
    names, in the contract too, and rewrite-eval of the graph deploys every branch."""
    from qtool.onnx_rewrite.train_graph import training_contract

    q = tmp_path / "q.onnx"
    result = qtool.rewrite_train(silero_like(17, constant_weights=True, nested=nested), str(q))
    assert result.to_dict()["counts"]["layers_quantized"] == (6 if nested else 4) and not result.warnings
    state = training_contract(str(q))["state"]
    assert {"x/input_quant/min", "x/input_quant/min_1"} <= set(state)
    assert state["x/input_quant/min_1"] == "x/input_quant/min_1:updated"
    feeds = {**data(n=2), "qtool_step": np.array(0, np.int64)}
    session = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    assert {o.name for o in session.get_outputs()} == {"y", *state.values()}
    session.run(None, feeds)
    deployed = qtool.rewrite_eval(str(q))
    assert not deployed.left_in_float() and len(deployed.branches) == 2


def proto_without_if() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])], "plain", [x], [y],
                              [numpy_helper.from_array(_weights(8, 4, 3), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])



def test_a_branch_and_the_enclosing_graph_quantizing_one_tensor_train_side_by_side():
    """openWakeWord's hey_jarvis: Gemms of the enclosing graph beside an If whose branch reads the same input.
    The branches are encoded (and their state moved up) before the enclosing graph, whose own quantizer of
    ``x`` then registered ``x/input_quant/min`` a second time (an internal ValueError). It takes a fresh name;
    the graph is valid and runs."""
    model = silero_like()
    y2 = helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["N", 8, 32])
    model.graph.initializer.append(numpy_helper.from_array(_weights(8, 4, 3), "w_main"))
    model.graph.node.append(helper.make_node("Conv", ["x", "w_main"], ["y2"], pads=[1, 1], name="main_conv"))
    model.graph.output.append(y2)
    result = qtool.rewrite_train(model)
    state = result.contract["state"]
    assert len([name for name in state if name.startswith("x/input_quant/min")]) == 3  # each branch's, the graph's
    assert result.counts()["layers_quantized"] == 5
    proto = ir.serde.serialize_model(result.model)
    onnx.checker.check_model(proto, full_check=True)
    assert np.isfinite(run(proto, {**data(4), "qtool_step": np.array(0, np.int64)})).all()
