"""The layer table (weight, channel axis, bias per op kind) and the Q/DQ codec, on their own."""

import numpy as np
import onnx_ir as ir
import pytest

from qtool.model import codec, layers


def layer(op, weight_shape, **attrs):
    """The layer in a graph, its weight (and bias) initializers, as an exporter writes them."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", const_value=ir.tensor(np.zeros(weight_shape, np.float32)))
    b = ir.Value(name="b", const_value=ir.tensor(np.zeros(4, np.float32)))
    inputs = [x, w] if op == "MatMul" else [x, w, b]
    node = ir.node(op, inputs, {k: ir.AttrInt64(k, v) for k, v in attrs.items()}, name="L")
    graph = ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 17})
    for v in inputs[1:]:
        graph.register_initializer(v)
    return node


@pytest.mark.parametrize("op, shape, attrs, axis, channels", [
    ("Conv", (8, 3, 3, 3), {}, 0, 8),
    ("Conv", (8, 1, 3, 3), {"group": 8}, 0, 8),  # depthwise
    ("ConvTranspose", (3, 8, 3, 3), {}, 1, 8),
    ("ConvTranspose", (4, 2, 3, 3), {"group": 2}, 1, 4),  # Cout = Cout/g * g
    ("Gemm", (8, 5), {"transB": 1}, 0, 8),
    ("Gemm", (5, 8), {}, 1, 8),
    ("MatMul", (5, 8), {}, 1, 8),  # [K, N]: per column
    ("MatMul", (2, 5, 8), {}, 2, 8),
])
def test_layer_table(op, shape, attrs, axis, channels):
    node = layer(op, shape, **attrs)
    assert layers.is_layer(node) and layers.check_layer(node) is None
    assert layers.output_channel_axis(node, len(shape)) == axis
    assert layers.output_channels(node, np.zeros(shape)) == channels
    assert layers.channel_shape(node, len(shape))[axis] == -1
    assert (layers.layer_bias(node) is None) == (op == "MatMul")


def test_grouped_conv_transpose_channel_vector_repeats_per_group():
    node = layer("ConvTranspose", (4, 2, 3, 3), group=2)
    assert layers.per_output_channel(node, np.array([1.0, 2.0]), 4).tolist() == [1.0, 2.0, 1.0, 2.0]
    assert layers.per_output_channel(node, np.array([1.0, 2.0, 3.0]), 4) is None


def test_check_layer_names_the_reason():
    x = ir.Value(name="x")
    node = ir.node("MatMul", [x, ir.Value(name="y")], name="M")
    assert "not a constant" in layers.check_layer(node)
    assert "not a layer op" in layers.check_layer(ir.node("Relu", [x]))


@pytest.mark.parametrize("bits, signed, dtype, clip", [
    (8, False, ir.DataType.UINT8, False), (8, True, ir.DataType.INT8, False),
    (4, True, ir.DataType.INT8, True), (16, False, ir.DataType.UINT16, False),
    (3, False, ir.DataType.UINT8, True), (12, True, ir.DataType.INT16, True),
])
def test_storage_containers(bits, signed, dtype, clip):
    st = codec.storage(bits, signed=signed, narrow=False)
    assert st.dtype == dtype and st.needs_clip == clip
    lo, hi = st.grid
    assert hi - lo == 2**bits - 1


def test_packed_int4_storage_only_when_asked():
    st = codec.storage(4, signed=True, narrow=False, int4=True)
    assert st.dtype == ir.DataType.INT4 and not st.needs_clip and st.opset == 21
    assert codec.storage(4, signed=True, narrow=True).opset < 21


def test_activation_params_are_tf_nudged():
    p = codec.activation_params(-1.0, 1.0, bits=8, symmetric=False)
    assert p.scale == np.float32(2 / 255) and int(p.zero_point) == 127
    assert np.float32(p.nudged[0]) == np.float32(-0.9960785)


def test_reading_an_existing_dq():
    x = ir.Value(name="q")
    scale = ir.Value(name="s", const_value=ir.tensor(np.float32(0.5)))
    zp = ir.Value(name="z", const_value=ir.tensor(np.uint8(3)))
    dq = ir.node("DequantizeLinear", [x, scale, zp])
    s, z, dtype = codec.dq_params(dq)
    assert s is scale and z is zp and dtype == ir.DataType.UINT8
    assert codec.storage_of(ir.DataType.UINT8, 8, False).dtype == ir.DataType.UINT8


@pytest.mark.parametrize("axis", [None, 0])
def test_an_all_zero_weight_channel_stores_zero_point_0(axis):
    """A dead channel (all weights 0, common in trained depthwise convolutions) has the range
    [0, 0]: scale 1 and, like every symmetric channel, zero point 0 with its codes 0. TF's
    nudging gives it the grid's minimum (-127) instead, and one odd zero point sends
    onnxruntime's QLinearConv down a generic path (50x slower on PP-OCRv4's depthwise convs)."""
    w = np.random.default_rng(0).normal(size=(4, 1, 3, 3)).astype(np.float32)
    w[2] = 0
    if axis is None:
        w[:] = 0
    stored, p = codec.weight_params(w, bits=8, symmetric=True, axis=axis)
    assert p.degenerate == 1
    assert p.zero_point.dtype == np.int8 and not np.any(p.zero_point)
    assert not np.any(stored[2]) and np.all(p.scale[2:3] == 1 if axis == 0 else p.scale == 1)
    if axis == 0:  # the live channels keep their codes
        live = codec.weight_params(w[[0, 1, 3]], bits=8, symmetric=True, axis=0)[0]
        assert np.array_equal(stored[[0, 1, 3]], live)
