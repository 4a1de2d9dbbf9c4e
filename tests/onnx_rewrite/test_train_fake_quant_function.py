"""qtool::FakeQuant's function body equals the FakeQuant kernels bit for bit (kernels.md section 1).

One onnxruntime session holds a FakeQuant node per (num_bits, narrow_range)
configuration, so every width and both grids run in one call; inputs cover
exact ties (values halfway between two levels), ranges without zero, the
published vectors, and special values.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_builders import RNG
from onnx import TensorProto, helper

from qtool.kernels import (
    fake_quant_with_min_max_vars,
    fake_quant_with_min_max_vars_per_channel,
    nudged_range,
)
from qtool.onnx_rewrite.fake_quant_function import DOMAIN, DOMAIN_VERSION, NAME, fake_quant_model, function_proto

CONFIGS = [(bits, narrow) for bits in range(2, 17) for narrow in (False, True)]


def bits_of(a):
    return np.asarray(a, np.float32).view(np.uint32)


def many_model(range_shape, x_rank, opset=13):
    """x_i, min_i, max_i -> y_i = FakeQuant(num_bits, narrow) for every config."""
    f = TensorProto.FLOAT
    nodes, inputs, outputs = [], [], []
    for i, (bits, narrow) in enumerate(CONFIGS):
        nodes.append(helper.make_node(NAME, [f"x{i}", f"min{i}", f"max{i}"], [f"y{i}"], domain=DOMAIN,
                                      num_bits=bits, narrow_range=int(narrow)))
        inputs += [helper.make_tensor_value_info(f"x{i}", f, [None] * x_rank),
                   helper.make_tensor_value_info(f"min{i}", f, list(range_shape)),
                   helper.make_tensor_value_info(f"max{i}", f, list(range_shape))]
        outputs.append(helper.make_tensor_value_info(f"y{i}", f, [None] * x_rank))
    graph = helper.make_graph(nodes, "many", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                              functions=[function_proto(opset)])
    model.ir_version = 9
    return model


def session(model, optimize=True):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def tie_inputs(lo, hi, bits, narrow, n=200):
    """Random values, exact half-level ties, the grid itself, the range ends and beyond."""
    nmin, nmax, scale, _ = nudged_range(np.asarray(lo, np.float32).reshape(-1), np.asarray(hi, np.float32).reshape(-1),
                                        num_bits=bits, narrow_range=narrow)
    nmin, nmax, scale = float(nmin[0]), float(nmax[0]), float(scale[0])
    levels = (1 << bits) - (1 if narrow else 0)
    k = RNG.integers(0, levels, n)
    ties = (np.float32(nmin) + (k + 0.5).astype(np.float32) * np.float32(scale)).astype(np.float32)
    grid = (np.float32(nmin) + k.astype(np.float32) * np.float32(scale)).astype(np.float32)
    width = hi - lo
    rand = RNG.uniform(lo - 0.3 * width, hi + 0.3 * width, n).astype(np.float32)
    ends = np.array([lo, hi, nmin, nmax, 0.0, -0.0, np.nextafter(np.float32(nmin), np.float32(-1)),
                     np.nextafter(np.float32(nmax), np.float32(1e9))], np.float32)
    return np.concatenate([ties, grid, rand, ends]).astype(np.float32)


RANGE_KINDS = ["around_zero", "positive", "negative", "tiny", "wide", "symmetric"]


def draw_range(kind):
    if kind == "around_zero":
        lo = -RNG.uniform(0.01, 10); hi = RNG.uniform(0.01, 10)
    elif kind == "positive":  # 0 < min < max: the range shifts to [0, max - min]
        lo = RNG.uniform(0.1, 5); hi = lo + RNG.uniform(0.1, 5)
    elif kind == "negative":  # min < max < 0
        hi = -RNG.uniform(0.1, 5); lo = hi - RNG.uniform(0.1, 5)
    elif kind == "tiny":
        lo = -RNG.uniform(1e-6, 1e-4); hi = RNG.uniform(1e-6, 1e-4)
    elif kind == "wide":
        lo = -RNG.uniform(100, 1e4); hi = RNG.uniform(100, 1e4)
    else:
        hi = RNG.uniform(0.5, 3); lo = -hi
    return np.float32(lo), np.float32(hi)


@pytest.mark.parametrize("optimize", [True, False])
def test_fake_quant_function_per_tensor_equals_vars_kernel_all_widths(optimize):
    sess = session(many_model([], 1), optimize)
    for kind in RANGE_KINDS:
        feeds, expected = {}, {}
        for i, (bits, narrow) in enumerate(CONFIGS):
            lo, hi = draw_range(kind)
            x = tie_inputs(lo, hi, bits, narrow)
            feeds.update({f"x{i}": x, f"min{i}": np.array(lo), f"max{i}": np.array(hi)})
            expected[i] = fake_quant_with_min_max_vars(x, lo, hi, bits, narrow)
        outs = sess.run(None, feeds)
        for i, (bits, narrow) in enumerate(CONFIGS):
            np.testing.assert_array_equal(bits_of(outs[i]), bits_of(expected[i]),
                                          err_msg=f"{kind} bits={bits} narrow={narrow}")


def test_fake_quant_function_per_channel_equals_per_channel_kernel_all_widths():
    """min/max [C,1,1,1] against a Conv-weight-shaped x: the multiply variant, channel by channel."""
    c = 5
    sess = session(many_model([c, 1, 1, 1], 4))
    for kind in RANGE_KINDS:
        feeds, expected = {}, {}
        for i, (bits, narrow) in enumerate(CONFIGS):
            ranges = [draw_range(kind) for _ in range(c)]
            lo = np.array([r[0] for r in ranges], np.float32)
            hi = np.array([r[1] for r in ranges], np.float32)
            x = np.stack([tie_inputs(lo[j], hi[j], bits, narrow, n=30)[:48] for j in range(c)])  # [C, 48]
            x = x.reshape(c, 3, 4, 4)
            feeds.update({f"x{i}": x, f"min{i}": lo.reshape(c, 1, 1, 1), f"max{i}": hi.reshape(c, 1, 1, 1)})
            # the kernel wants channels on the last axis
            last = np.ascontiguousarray(np.moveaxis(x, 0, -1))
            ref = fake_quant_with_min_max_vars_per_channel(last, lo, hi, bits, narrow)
            expected[i] = np.moveaxis(ref, -1, 0)
        outs = sess.run(None, feeds)
        for i, (bits, narrow) in enumerate(CONFIGS):
            np.testing.assert_array_equal(bits_of(outs[i]), bits_of(expected[i]),
                                          err_msg=f"{kind} bits={bits} narrow={narrow}")


def test_divide_and_multiply_variants_follow_the_range_rank():
    """A scalar range divides (vars), a [1] range multiplies (per_channel): the last bit differs somewhere."""
    x = RNG.uniform(-1, 1, 200_000).astype(np.float32)
    lo, hi = np.float32(-0.7131), np.float32(0.9173)
    scalar = session(fake_quant_model([None], [], num_bits=8, narrow_range=False))
    vector = session(fake_quant_model([None], [1], num_bits=8, narrow_range=False))
    y_div = scalar.run(None, {"x": x, "min": np.array(lo), "max": np.array(hi)})[0]
    y_mul = vector.run(None, {"x": x, "min": lo.reshape(1), "max": hi.reshape(1)})[0]
    np.testing.assert_array_equal(bits_of(y_div), bits_of(fake_quant_with_min_max_vars(x, lo, hi)))
    np.testing.assert_array_equal(
        bits_of(y_mul), bits_of(fake_quant_with_min_max_vars_per_channel(x.reshape(-1, 1), lo.reshape(1), hi.reshape(1)).reshape(-1)))


SPEC_VECTORS = [  # kernels.md section 3: (bits, narrow, min, max, inputs, expected)
    (8, False, -10.0, 53.75, [-10.1, -10.0, -9.9, -9.75, 53.75, 53.8], [-10, -10, -10, -9.75, 53.75, 53.75]),
    (8, False, -0.1, 63.65, [-0.1, 0, 0.1, 0.25, 63.75, 63.8], [0, 0, 0, 0.25, 63.75, 63.75]),
    (8, True, -0.1275, 63.3725, [-0.26, -0.25, -0.24, 0, 63.25, 63.3], [-0.25, -0.25, -0.25, 0, 63.25, 63.25]),
    (8, False, -63.65, 0.1, [-63.8, -63.75, -63.7, -63.5, 0, 0.1], [-63.75, -63.75, -63.75, -63.5, 0, 0]),
    (8, False, -0.125, 63.625, [-0.26, -0.25, -0.24, 0, 63.5, 63.6], [-0.25, -0.25, -0.25, 0, 63.5, 63.5]),
    (4, False, -6, 1.5, [-6.1, -6, -5.9, -5.5, 1.5, 1.6], [-6, -6, -6, -5.5, 1.5, 1.5]),
    (4, False, -7.3, 0.2, [-7.6, -7.5, -7.4, -7.2, 0, 0.1], [-7.5, -7.5, -7.5, -7.0, 0, 0]),
    (2, False, -0.1, 1.4, [-0.2, 0.1, 0.7, 1.0, 1.3, 1.6], [0, 0, 0.5, 1, 1.5, 1.5]),
    (2, True, -0.4, 0.6, [-0.6, -0.5, -0.24, 0, 0.5, 0.6], [-0.5, -0.5, -0.0, 0, 0.5, 0.5]),
]


@pytest.mark.parametrize("bits,narrow,lo,hi,x,expected", SPEC_VECTORS)
def test_fake_quant_function_published_vectors(bits, narrow, lo, hi, x, expected):
    sess = session(fake_quant_model([None], [], num_bits=bits, narrow_range=narrow))
    y = sess.run(None, {"x": np.array(x, np.float32), "min": np.array(lo, np.float32),
                        "max": np.array(hi, np.float32)})[0]
    np.testing.assert_array_equal(y, np.array(expected, np.float32))  # values (the list writes -0.0 loosely)
    np.testing.assert_array_equal(bits_of(y), bits_of(fake_quant_with_min_max_vars(np.array(x, np.float32), lo, hi, bits, narrow)))


def test_fake_quant_function_special_values_and_zero_range():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 0.3], np.float32)
    sess_t = session(fake_quant_model([None], [], num_bits=8, narrow_range=False))
    for lo, hi in ((-1.0, 1.0), (0.0, 0.0), (0.5, 2.0)):
        lo, hi = np.float32(lo), np.float32(hi)
        y = sess_t.run(None, {"x": x, "min": np.array(lo), "max": np.array(hi)})[0]
        np.testing.assert_array_equal(bits_of(y), bits_of(fake_quant_with_min_max_vars(x, lo, hi)))
    # per channel, one channel [0, 0]: zeros there (NaN stays NaN), normal elsewhere
    sess_c = session(fake_quant_model([2, None], [2, 1], num_bits=8, narrow_range=True))
    xs = np.stack([x, x])
    lo = np.array([0.0, -2.0], np.float32)
    hi = np.array([0.0, 3.0], np.float32)
    y = sess_c.run(None, {"x": xs, "min": lo.reshape(2, 1), "max": hi.reshape(2, 1)})[0]
    ref = fake_quant_with_min_max_vars_per_channel(np.ascontiguousarray(xs.T), lo, hi, 8, True).T
    np.testing.assert_array_equal(bits_of(y), bits_of(ref))


def test_fake_quant_function_passes_the_checker_at_several_opsets():
    for opset in (13, 17, 18, 21):
        model = fake_quant_model([3, 4], [], num_bits=8, narrow_range=False, opset=opset)
        onnx.checker.check_model(model, full_check=True)
        y = session(model).run(None, {"x": np.ones((3, 4), np.float32), "min": np.array(-1, np.float32),
                                      "max": np.array(1, np.float32)})[0]
        np.testing.assert_array_equal(y, fake_quant_with_min_max_vars(np.ones((3, 4), np.float32), -1.0, 1.0))
