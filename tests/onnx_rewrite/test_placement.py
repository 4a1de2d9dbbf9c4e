"""TF's placement rules (spec section 2): for each rule, the exact set of quantized tensors.

These run TF's rules alone (``TF_RULES``); the rules of section 2b that come after them in a
rewrite (every layer in integers) are tested in test_placement_integer.py."""

import numpy as np
import onnx_ir as ir
import pytest
from model_builders import Builder, x_data

from qtool.errors import QtoolError
from qtool.model.names import NameScope, name_unnamed_nodes
from qtool.api import rewrite_eval
from qtool.onnx_rewrite.fold_batch_norms import fold_batch_norms
from qtool.config import QuantConfig
from qtool.onnx_rewrite.placement import check_exclude, plan_quantization
from qtool.onnx_rewrite.placement.tf import TF_RULES
from qtool.config import CalibrationConfig


def plan_of(model: ir.Model, **config):
    name_unnamed_nodes(model.graph)
    check_exclude(model.graph, config.get("exclude", ()))
    fold_batch_norms(model.graph, NameScope(model.graph))
    return plan_quantization(model.graph, QuantConfig(**config), TF_RULES)


def acts(plan) -> dict[str, str]:
    return {p.value.name: p.kind for p in plan.activations}


def weights(plan) -> dict[str, int | None]:
    return {p.value.name: p.axis for p in plan.weights}


def left(plan) -> dict[str, str]:
    return {x.node: x.reason for x in plan.left_in_float}


def test_layer_with_activation_quantizes_weights_and_activation_output():
    b = Builder()
    x = b.input("x", ["N", 3, 8, 8])
    w_conv = b.conv(x, 3, 4, name="conv1/Conv")
    w_name = b.nodes[-1].input[1]
    y = b.node("Relu", [b.bn(w_conv, 4)], name="conv1/Relu", outputs=["relu"])
    plan = plan_of(b.ir([y]))
    assert acts(plan) == {"x": "input_quant", "relu": "act_quant"}
    assert set(weights(plan).values()) == {0}
    assert plan.weights[0].name == "conv1/weights_quant"
    point = {p.value.name: p for p in plan.activations}["relu"]
    assert point.name == "conv1/act_quant" and point.default_range == (0.0, 6.0)
    assert w_name not in weights(plan)  # the folded weight is quantized, not the original


def test_clip_counts_as_activation():
    b = Builder()
    x = b.input("x", ["N", 3, 8, 8])
    c = b.conv(x, 3, 4)
    y = b.node("Clip", [c, b.const(np.float32(0)), b.const(np.float32(6))], outputs=["relu6"])
    assert acts(plan_of(b.ir([y]))) == {"x": "input_quant", "relu6": "act_quant"}


def test_chain_without_activation_quantizes_last_linear_op():
    b = Builder()
    x = b.input("x", ["N", 6])
    y = b.gemm(x, 6, 4)
    plan = plan_of(b.ir([y]))
    assert acts(plan) == {"x": "input_quant", y: "act_quant"}
    assert {p.value.name: p for p in plan.activations}[y].default_range == (-6.0, 6.0)


def test_matmul_bias_add_is_the_last_linear_op():
    b = Builder()
    x = b.input("x", ["N", 6])
    y = b.matmul(x, 6, 4, bias=True)
    mm = b.nodes[-2].output[0]
    plan = plan_of(b.ir([y]))
    assert acts(plan) == {"x": "input_quant", y: "act_quant"}
    assert mm not in acts(plan)


@pytest.mark.parametrize("op", ["LeakyRelu", "Sigmoid", "HardSigmoid"])
def test_other_activations_end_the_chain_before_them(op):
    b = Builder()
    x = b.input("x", ["N", 3, 8, 8])
    conv = b.conv(x, 3, 4)
    y = b.node(op, [conv])
    plan = plan_of(b.ir([y]))
    assert acts(plan) == {"x": "input_quant", conv: "act_quant"}


def test_bypass_before_activation_quantizes_layer_output_not_the_add():
    b = Builder()
    x = b.input("x", ["N", 4, 8, 8])
    r0 = b.node("Relu", [b.conv(x, 4, 4)], outputs=["r0"])
    conv = b.bn(b.conv(r0, 4, 4, name="blk/conv/Conv"), 4)
    add = b.node("Add", [conv, r0], name="blk/add", outputs=["sum"])
    y = b.node("Relu", [add], outputs=["out"])
    plan = plan_of(b.ir([y]))
    a = acts(plan)
    assert a.pop("x") == "input_quant" and a.pop("r0") == "act_quant" and a.pop("out") == "act_quant"
    ((conv_out, kind),) = a.items()  # the folded conv's output, before the Add
    assert kind == "conv_quant"
    assert "sum" not in acts(plan)
    assert "feeds Relu" in left(plan)["blk/add"]


def test_bypass_without_activation_quantizes_both_sides():
    b = Builder()
    x = b.input("x", ["N", 4, 8, 8])
    r0 = b.node("Relu", [b.conv(x, 4, 4)], outputs=["r0"])
    conv = b.conv(r0, 4, 4)
    add = b.node("Add", [conv, r0], name="add", outputs=["sum"])
    plan = plan_of(b.ir([add]))
    # the Add is also the post-activation bypass of the first layer, which TF matches first
    assert acts(plan) == {"x": "input_quant", "r0": "act_quant", conv: "conv_quant", "sum": "post_activation_bypass_quant"}

    b = Builder()
    x = b.input("x", ["N", 4, 8, 8])
    y = b.input("y", ["N", 4, 8, 8])
    conv = b.conv(x, 4, 4)
    add = b.node("Add", [conv, y], name="add", outputs=["sum"])
    plan = plan_of(b.ir([add]))
    assert acts(plan) == {"x": "input_quant", conv: "conv_quant", "sum": "add_quant"}


def test_post_activation_bypass_is_quantized_unless_it_feeds_relu():
    b = Builder()
    x = b.input("x", ["N", 4, 8, 8])
    r0 = b.node("Relu", [b.conv(x, 4, 4)], outputs=["r0"])
    r1 = b.node("Relu", [b.conv(r0, 4, 4)], outputs=["r1"])
    post = b.node("Add", [r1, r0], name="post", outputs=["post"])
    plan = plan_of(b.ir([post]))
    assert acts(plan) == {"x": "input_quant", "r0": "act_quant", "r1": "act_quant", "post": "post_activation_bypass_quant"}

    b = Builder()
    x = b.input("x", ["N", 4, 8, 8])
    r0 = b.node("Relu", [b.conv(x, 4, 4)], outputs=["r0"])
    r1 = b.node("Relu", [b.conv(r0, 4, 4)], outputs=["r1"])
    post = b.node("Add", [r1, r0], name="post", outputs=["post"])
    y = b.node("Relu", [post], outputs=["y"])
    plan = plan_of(b.ir([y]))
    # the Add is fused with its Relu, whose output is the quantized tensor (TF's activation layers rule)
    assert acts(plan) == {"x": "input_quant", "r0": "act_quant", "r1": "act_quant", "y": "activation_Add_quant"}
    assert "feeds Relu" in left(plan)["post"]


def test_add_or_mul_of_quantized_inputs_is_quantized():
    b = Builder()
    x = b.input("x", ["N", 4, 8, 8])
    r0 = b.node("Relu", [b.conv(x, 4, 4)], outputs=["r0"])
    r1 = b.node("Relu", [b.conv(x, 4, 4)], outputs=["r1"])
    pooled = b.node("MaxPool", [r1], kernel_shape=[1, 1], outputs=["pooled"])
    m = b.node("Mul", [r0, pooled], name="mul", outputs=["prod"])
    s = b.node("Add", [m, b.const(np.float32(1.0))], name="add_const", outputs=["shifted"])
    u = b.node("Add", [s, b.node("Sigmoid", [x], outputs=["sig"])], name="add_float", outputs=["mixed"])
    plan = plan_of(b.ir([u]))
    assert acts(plan) == {
        "x": "input_quant",
        "r0": "act_quant",
        "r1": "act_quant",
        "prod": "activation_Mul_quant",  # inputs quantized (one through MaxPool)
        "shifted": "activation_Add_quant",  # the constant does not count
    }
    assert "input 'sig' is not quantized" in left(plan)["add_float"]


def test_graph_input_is_quantized_only_when_a_layer_reads_it():
    b = Builder()
    x = b.input("x", ["N", 3, 8, 8])
    z = b.input("z", ["N", 3, 8, 8])
    relu = b.node("Relu", [z], outputs=["rz"])
    c = b.conv(relu, 3, 4)
    c2 = b.conv(x, 3, 4)
    plan = plan_of(b.ir([c, c2]))
    assert acts(plan) == {"x": "input_quant", c: "act_quant", c2: "act_quant"}


def test_weight_axis_per_layer_type():
    b = Builder()
    x = b.input("x", ["N", 4, 5, 5])
    ct = b.conv_transpose(x, 4, 6, group=2, name="ct")
    g = b.input("g", ["N", 6])
    g0 = b.gemm(g, 6, 3, trans_b=0, name="g0")
    g1 = b.gemm(g, 6, 3, trans_b=1, name="g1")
    mm = b.matmul(g, 6, 3, name="mm")
    plan = plan_of(b.ir([ct, g0, g1, mm]))
    axes = {p.layers[0].name: p.axis for p in plan.weights}
    assert axes == {"ct": 1, "g0": 1, "g1": 0, "mm": 1}
    plan = plan_of(b.ir([ct, g0, g1, mm]), per_channel=False)
    assert {p.axis for p in plan.weights} == {None}


def test_layers_without_constant_weight_stay_float_with_a_reason():
    b = Builder()
    x = b.input("x", ["N", 4, 6])
    y = b.input("y", ["N", 6, 4])
    mm = b.node("MatMul", [x, y], name="attn")
    plan = plan_of(b.ir([mm]))
    assert not plan.weights and not plan.activations
    assert "not a constant" in left(plan)["attn"] and "graph input" in left(plan)["attn"]


def test_weights_shared_by_several_layers_get_one_quantizer():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    w = b.const(x_data(4, 3, 3, 3), name="shared_w")
    c1 = b.node("Conv", [x, w], name="c1", kernel_shape=[3, 3])
    c2 = b.node("Conv", [x, w], name="c2", kernel_shape=[3, 3])
    plan = plan_of(b.ir([c1, c2]))
    assert len(plan.weights) == 1
    assert [n.name for n in plan.weights[0].layers] == ["c1", "c2"]


def test_scope_weight_needs_every_consumer_in_scope():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    w = b.const(x_data(4, 3, 3, 3), name="shared_w")
    c1 = b.node("Conv", [x, w], name="a/c1", kernel_shape=[3, 3], outputs=["c1"])
    c2 = b.node("Conv", [x, w], name="b/c2", kernel_shape=[3, 3], outputs=["c2"])
    w3 = b.const(x_data(4, 3, 3, 3))
    c3 = b.node("Conv", [x, w3], name="a/c3", kernel_shape=[3, 3], outputs=["c3"])
    plan = plan_of(b.ir([c1, c2, c3]), scope="a/")
    assert [p.layers[0].name for p in plan.weights] == ["a/c3"]
    assert "shared with 'b/c2'" in left(plan)["a/c1"]
    # activation quantizers need the producer in scope (the graph input feeds b/c2 too)
    assert acts(plan) == {"c1": "act_quant", "c3": "act_quant"}


def test_exclude_keeps_a_node_in_float():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    c1 = b.conv(x, 3, 4, name="keep")
    c2 = b.conv(b.node("Relu", [c1], outputs=["r"]), 4, 4, name="quant")
    plan = plan_of(b.ir([c2]), exclude={"keep"})
    assert [p.layers[0].name for p in plan.weights] == ["quant"]
    assert acts(plan) == {"r": "act_quant", c2: "act_quant"}
    assert "excluded" in left(plan)["keep"]


def test_exclude_of_unknown_node_is_an_error():
    b = Builder()
    x = b.input("x", ["N", 3, 6, 6])
    c = b.conv(x, 3, 4)
    with pytest.raises(QtoolError, match="no node named 'nope'"):
        plan_of(b.ir([c]), exclude={"nope"})


def test_never_a_second_quantizer_where_one_follows_through_reshape():
    b = Builder()
    x = b.input("x", ["N", 6])
    g = b.gemm(x, 6, 4)
    shape = b.const(np.array([-1, 4], np.int64))
    r = b.node("Reshape", [g, shape])
    q = b.node("QuantizeLinear", [r, b.const(np.float32(0.1)), b.const(np.uint8(128))])
    dq = b.node("DequantizeLinear", [q, b.const(np.float32(0.1)), b.const(np.uint8(128))])
    plan = plan_of(b.ir([dq]))
    (point,) = [p for p in plan.activations if p.value.name == g]
    assert point.exists
    assert g not in plan.tensors_to_calibrate()


def sample_chain_model():
    b = Builder(constants=True, named=False, opset=11)
    x = b.input("x", ["N", 3, 8, 8])
    r0 = b.node("Relu", [b.bn(b.conv(x, 3, 4), 4)])
    r1 = b.node("Relu", [b.bn(b.conv(r0, 4, 4), 4)])
    add = b.node("Add", [b.bn(b.conv(r1, 4, 4, bias=False), 4), r0])
    r2 = b.node("Relu", [add])
    p = b.node("MaxPool", [r2], kernel_shape=[2, 2], strides=[2, 2])
    f = b.node("Flatten", [p])
    y = b.gemm(f, 64, 10)
    return b.proto([y])


def test_second_rewrite_changes_nothing(tmp_path):
    src = tmp_path / "m.onnx"
    __import__("onnx").save(sample_chain_model(), src)
    data = {"x": x_data(8, 3, 8, 8)}
    once, twice = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    first = rewrite_eval(str(src), str(once), calibration_data=data, calibration=CalibrationConfig(batch_size=3))
    assert first.summary["counts"]["weights_quantized"] == 4
    second = rewrite_eval(str(once), str(twice), calibration_data=data)
    assert once.read_bytes() == twice.read_bytes()
    c = second.summary["counts"]
    assert c["weights_quantized"] == 0 and c["activations_quantized"] == 0 and not second.summary["changed"]
    assert c["already_quantized_weights"] == 4
    assert c["already_quantized_activations"] == first.summary["counts"]["activations_quantized"]
    # the plan on the rewritten graph finds every point, all existing
    model = ir.load(str(once))
    plan = plan_of(model)
    assert plan.is_empty() and all(p.exists for p in plan.weights + plan.activations)
