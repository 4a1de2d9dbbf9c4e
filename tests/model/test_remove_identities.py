"""``model.graph.remove_identities`` on the shapes torch's and paddle2onnx's exporters write: an Identity
feeding a graph output, of a graph input, between two consumers, read from the enclosing graph by an If
branch. The graph's input and output names never change, and the model computes what it did."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper

from qtool.model.graph import remove_identities

X = np.array([[-1.5, 0.25, 2.0]], np.float32)


def _model(nodes, outputs, inputs=("x",)) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3]) for n in inputs]
    ins += [helper.make_tensor_value_info("c", TensorProto.BOOL, [])] if any(n.op_type == "If" for n in nodes) else []
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3]) for n in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs), opset_imports=[helper.make_opsetid("", 17)])


def _removed(proto: onnx.ModelProto) -> tuple[int, onnx.ModelProto]:
    model = ir.serde.deserialize_model(proto)
    count = remove_identities(model.graph)
    out = ir.serde.serialize_model(model)
    onnx.checker.check_model(out, full_check=True)
    return count, out


def _run(proto: onnx.ModelProto, **feeds) -> list[np.ndarray]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in {"x": X, "c": np.array(True), **feeds}.items() if k in names})


def _same_interface_and_outputs(before: onnx.ModelProto, after: onnx.ModelProto, **feeds) -> None:
    assert [i.name for i in after.graph.input] == [i.name for i in before.graph.input]
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    for got, want in zip(_run(after, **feeds), _run(before, **feeds)):
        np.testing.assert_array_equal(got, want)


def test_an_identity_feeding_a_graph_output_goes_and_the_output_keeps_its_name():
    proto = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["out"])], ["out"])
    count, out = _removed(proto)
    assert count == 1 and [(n.op_type, n.output[0]) for n in out.graph.node] == [("Relu", "out")]
    _same_interface_and_outputs(proto, out)


def test_an_identity_from_a_graph_input_to_a_graph_output_stays():
    proto = _model([helper.make_node("Identity", ["x"], ["out"]), helper.make_node("Relu", ["x"], ["r"])],
                   ["out", "r"])
    count, out = _removed(proto)
    assert count == 0 and [n.op_type for n in out.graph.node] == ["Identity", "Relu"]
    _same_interface_and_outputs(proto, out)


def test_an_identity_of_a_graph_input_or_output_is_read_through_and_neither_is_renamed():
    proto = _model([helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("Relu", ["xi"], ["r"]),
                    helper.make_node("Identity", ["r"], ["ri"]), helper.make_node("Neg", ["ri"], ["n"])], ["r", "n"])
    count, out = _removed(proto)
    assert count == 2 and [(list(n.input), list(n.output)) for n in out.graph.node] == [(["x"], ["r"]), (["r"], ["n"])]
    _same_interface_and_outputs(proto, out)


def test_an_identity_between_two_consumers_gives_the_tensor_its_output_name():
    """torch writes ``x -> Identity -> y`` where ``x`` has readers of its own: every reader reads one tensor,
    named as the Identity's output (the name the ranges of what follows are kept under)."""
    proto = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["a"]),
                    helper.make_node("Identity", ["r"], ["y"]), helper.make_node("Abs", ["y"], ["b"]),
                    helper.make_node("Add", ["a", "b"], ["out"])], ["out"])
    count, out = _removed(proto)
    assert count == 1 and [list(n.input) for n in out.graph.node] == [["x"], ["y"], ["y"], ["a", "b"]]
    assert out.graph.node[0].output[0] == "y"
    _same_interface_and_outputs(proto, out)


def test_if_branches_that_read_the_identity_output_from_the_enclosing_graph_read_its_input():
    def branch(op, name):
        return helper.make_graph([helper.make_node(op, ["y"], [name])], name, [],
                                 [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 3])])

    proto = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"]),
                    helper.make_node("If", ["c"], ["out"], then_branch=branch("Neg", "t"),
                                     else_branch=branch("Abs", "e"))], ["out"])
    count, out = _removed(proto)
    assert count == 1 and [n.op_type for n in out.graph.node] == ["Relu", "If"]
    assert {a.g.node[0].input[0] for a in out.graph.node[1].attribute} == {out.graph.node[0].output[0]}
    for c in (True, False):
        _same_interface_and_outputs(proto, out, c=np.array(c))


def test_the_identities_of_a_branch_are_its_own_and_stay():
    """Only the graph's own Identity nodes go (a branch is rewritten as a model of its own, and its
    Identities go then): an If's output behind a top-level Identity keeps the graph output's name."""
    body = helper.make_graph([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Identity", ["n"], ["t"])],
                             "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 3])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 3])])
    proto = _model([helper.make_node("If", ["c"], ["i"], then_branch=body, else_branch=other),
                    helper.make_node("Identity", ["i"], ["output"])], ["output"])
    count, out = _removed(proto)
    assert count == 1 and [(n.op_type, n.output[0]) for n in out.graph.node] == [("If", "output")]
    then = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["Neg", "Identity"]
    for c in (True, False):
        _same_interface_and_outputs(proto, out, c=np.array(c))
