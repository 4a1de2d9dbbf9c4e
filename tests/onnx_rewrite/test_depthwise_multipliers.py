"""A depthwise conv with a channel multiplier written as Gather + plain depthwise conv
(``onnx_rewrite/depthwise_multipliers.py``).

onnxruntime's QLinearConv runs a grouped conv with one input and ``m > 1`` output channels per group group by
group: FastViT-T8's stride-2 7x7 patch embeddings (48 -> 96 channels on a 56 px map) took 6.3 ms in int8 against
0.59 ms in float, and the whole int8 model was 1.35x float."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from model_builders import Builder, run
from test_exported_models import paths
from test_placement_integer import optimized_ops

import qtool
from qtool.model.names import NameScope
from qtool.onnx_rewrite.depthwise_multipliers import multipliers_as_depthwise


def _conv_groups(model: onnx.ModelProto) -> list[int]:
    return sorted(next((a.i for a in n.attribute if a.name == "group"), 1) for n in model.graph.node
                  if n.op_type in ("Conv", "QLinearConv"))


@pytest.mark.parametrize("name", ["dynamo_MultiplierBlock", "legacy17_MultiplierBlock"])
def test_fastvit_patch_embedding_runs_as_a_plain_depthwise_conv(name, tmp_path):
    """Both exporters' block: the 8 -> 16 conv of 8 groups deploys as a Gather of the uint8 input and a QLinearConv
    of 16 groups (one input and one output channel each: onnxruntime's depthwise kernel); output as float's."""
    model, data = paths(name)
    feeds = dict(np.load(data))
    result = qtool.rewrite_eval(model, calibration_data=feeds)
    assert result.summary["counts"]["depthwise_multipliers"] == len(result.summary["depthwise_multipliers"]) == 1
    proto = ir.serde.serialize_model(result.model)
    opt = tmp_path / "opt.onnx"
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(opt)
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(opt))
    assert _conv_groups(optimized) == [1, 1, 16], _conv_groups(optimized)
    ops = optimized_ops(proto, tmp_path)
    assert ops["QLinearConv"] == 3 and ops["Gather"] == 1 and not ops["Conv"] and not ops["FusedConv"], ops
    want, got = run(onnx.load(model), feeds)[0], run(proto, feeds)[0]
    assert got.shape == want.shape and np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def _graph(cin, cout, group, k=(3, 3), x_shape=None):
    b = Builder(opset=17)
    x_shape = x_shape or ["batch", cin, 9, 9]
    x = b.input("x", x_shape)
    w = np.random.default_rng(0).normal(size=(cout, cin // group, *k)).astype(np.float32)
    y = b.node("Conv", [x, b.const(w), b.const(np.arange(cout, dtype=np.float32))], name="conv", group=group,
               kernel_shape=list(k), strides=[2] * len(k))
    return b, b.node("Relu", [y])


@pytest.mark.parametrize("cin,m", [(4, 2), (3, 3), (2, 5)])
def test_exact_in_float(cin, m):
    b, out = _graph(cin, cin * m, cin)
    model = b.ir([out])
    proto = b.proto([out])
    assert multipliers_as_depthwise(model.graph, NameScope(model.graph)) == ["conv"]
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert conv.attributes.get_int("group") == cin * m and conv.inputs[0].producer().op_type == "Gather"
    x = np.random.default_rng(1).normal(size=(2, cin, 9, 9)).astype(np.float32)
    want, got = run(proto, {"x": x})[0], run(ir.serde.serialize_model(model), {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cin,cout,group,k", [
    (4, 4, 4, (3, 3)),  # plain depthwise
    (4, 8, 2, (3, 3)),  # two input channels per group
    (4, 8, 1, (3, 3)),  # not grouped
    (4, 8, 4, (3,)),  # 1-D: left alone
])
def test_left_alone(cin, cout, group, k):
    shape = ["batch", cin] + [9] * len(k)
    b, out = _graph(cin, cout, group, k, shape)
    model = b.ir([out])
    assert multipliers_as_depthwise(model.graph, NameScope(model.graph)) == []
    assert [n.op_type for n in model.graph] == ["Conv", "Relu"]


def test_out_of_scope():
    b, out = _graph(4, 8, 4)
    model = b.ir([out])
    assert multipliers_as_depthwise(model.graph, NameScope(model.graph), lambda n: "excluded") == []
