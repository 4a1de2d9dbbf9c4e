"""A model with an ``If`` (Silero VAD's exports branch on the sample rate): ``rewrite-train`` writes the
training graph, leaving the subgraphs' layers in float and saying so, and ``finetune`` refuses it in one line
naming the node, before any training."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool.api import finetune, rewrite_train
from qtool.errors import QtoolError


def _branch(name: str, scale: float):
    w = numpy_helper.from_array(np.full((4, 4), scale, np.float32), f"{name}_w")
    return helper.make_graph([helper.make_node("MatMul", ["h", f"{name}_w"], [f"{name}_y"])], name, [],
                             [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["n", 4])], [w])


def _if_model():
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("If", ["flag"], ["y"], name="/decoder/If", then_branch=_branch("then", 1.0),
                              else_branch=_branch("else", 2.0))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_finetune_refuses_an_if_in_one_line(tmp_path):
    data = {"x": np.ones((4, 4), np.float32), "flag": np.array(True)}
    rewrite_train(_if_model(), str(tmp_path / "q.onnx"))
    with pytest.raises(QtoolError) as info:
        finetune(str(tmp_path / "q.onnx"), data, None)
    message = str(info.value)
    assert "\n" not in message
    assert "node '/decoder/If' is an If (the default domain): control flow with subgraphs is not supported" in message
