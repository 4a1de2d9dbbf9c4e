"""Every published vector of spec/kernels.md section 3, one test each."""

import numpy as np
import pytest

import qtool

f32 = np.float32

FQ_VECTORS = [
    # (num_bits, narrow, min, max, inputs, expected)
    (8, False, -10.0, 53.75, [-10.1, -10.0, -9.9, -9.75, 53.75, 53.8], [-10, -10, -10, -9.75, 53.75, 53.75]),
    (8, False, -0.1, 63.65, [-0.1, 0, 0.1, 0.25, 63.75, 63.8], [0, 0, 0, 0.25, 63.75, 63.75]),
    (8, True, -0.1275, 63.3725, [-0.26, -0.25, -0.24, 0, 63.25, 63.3], [-0.25, -0.25, -0.25, 0, 63.25, 63.25]),
    (8, False, -63.65, 0.1, [-63.8, -63.75, -63.7, -63.5, 0, 0.1], [-63.75, -63.75, -63.75, -63.5, 0, 0]),
    (4, False, -6, 1.5, [-6.1, -6, -5.9, -5.5, 1.5, 1.6], [-6, -6, -6, -5.5, 1.5, 1.5]),
    (4, False, -7.3, 0.2, [-7.6, -7.5, -7.4, -7.2, 0, 0.1], [-7.5, -7.5, -7.5, -7.0, 0, 0]),
    (2, False, -0.1, 1.4, [-0.2, 0.1, 0.7, 1.0, 1.3, 1.6], [0, 0, 0.5, 1, 1.5, 1.5]),
    (2, True, -0.4, 0.6, [-0.6, -0.5, -0.24, 0, 0.5, 0.6], [-0.5, -0.5, -0.0, 0, 0.5, 0.5]),
]


def _ids(v):
    return f"{v[0]}bit-{'narrow' if v[1] else 'wide'}-[{v[2]},{v[3]}]"


@pytest.mark.parametrize("vec", FQ_VECTORS, ids=_ids)
def test_fake_quant_published_vectors_all_three_ops(vec):
    nb, narrow, mn, mx, x, want = vec
    x = np.array(x, f32)
    want = np.array(want, f32)
    args = qtool.fake_quant_with_min_max_args(x, min=mn, max=mx, num_bits=nb, narrow_range=narrow)
    var = qtool.fake_quant_with_min_max_vars(x, mn, mx, num_bits=nb, narrow_range=narrow)
    pc = qtool.fake_quant_with_min_max_vars_per_channel(
        x.reshape(-1, 1), [mn], [mx], num_bits=nb, narrow_range=narrow
    ).ravel()
    for got in (args, var, pc):
        np.testing.assert_array_equal(got, want)


def test_vars_zero_point_exactly_half_rounds_away_from_zero():
    # (8, F, -0.125, 63.625): zp_from_min is exactly 0.5 and rounds to 1
    x = np.array([-0.26, -0.25, -0.24, 0, 63.5, 63.6], f32)
    out = qtool.fake_quant_with_min_max_vars(x, -0.125, 63.625)
    np.testing.assert_array_equal(out, np.array([-0.25, -0.25, -0.25, 0, 63.5, 63.5], f32))
    nmin, nmax, scale, zp = qtool.nudged_range(-0.125, 63.625)
    assert (nmin, nmax, zp) == (f32(-0.25), f32(63.5), 1)


@pytest.mark.parametrize(
    "mn,mx,nb,narrow,want",
    [
        (0.5, 128, 8, False, (0, 127.5)),
        (-128, -0.5, 8, False, (-127.5, 0)),
        (0.1, 127.1, 8, True, (0, 127)),
        (-0.1, 62.9, 7, True, (0, 63)),
    ],
)
def test_nudged_ranges(mn, mx, nb, narrow, want):
    nmin, nmax, _, _ = qtool.nudged_range(mn, mx, nb, narrow)
    assert (nmin, nmax) == (f32(want[0]), f32(want[1]))


def test_nudge_min_minus1_max1_precision():
    # spec 1.1: zp_from_min is 127.49999 in float32, so zp = 127
    nmin, nmax, scale, zp = qtool.nudged_range(-1.0, 1.0)
    assert zp == 127
    assert nmin == f32(-0.9960785) and nmax == f32(1.0039216)


def test_gradient_published_vector():
    x = np.array([-0.26, -0.25, -0.24, 0, 63.5, 63.6], f32)
    g = np.array([1.5, 2, 3, 4, 5, 6.25], f32)
    d = qtool.fake_quant_with_min_max_args_gradient(g, x, min=-0.125, max=63.625)
    np.testing.assert_array_equal(d, g * np.array([0, 1, 1, 1, 1, 0], f32))
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(g, x, -0.125, 63.625)
    np.testing.assert_array_equal(d, g * np.array([0, 1, 1, 1, 1, 0], f32))
    assert dmin == g[0] and dmax == g[5]
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(
        g.reshape(-1, 1), x.reshape(-1, 1), [-0.125], [63.625]
    )
    np.testing.assert_array_equal(d.ravel(), g * np.array([0, 1, 1, 1, 1, 0], f32))
    np.testing.assert_array_equal(dmin, [g[0]])
    np.testing.assert_array_equal(dmax, [g[5]])


QDQ = qtool.quantize_and_dequantize_v2


def test_qdq_signed_8bit_no_range():
    np.testing.assert_array_equal(QDQ(np.array([-3.5], f32), 0.0, 0.0), np.array([-3.5], f32))


def test_qdq_signed_4bit_no_range_both_roundings():
    x = np.array([-1, -0.5, 0, 0.3125, 0.8, 0.555], f32)
    np.testing.assert_array_equal(QDQ(x, 0.0, 0.0, num_bits=4), np.array([-1, -0.5, 0, 0.25, 0.75, 0.5], f32))
    up = QDQ(x, 0.0, 0.0, num_bits=4, round_mode="HALF_UP")
    assert up[3] == f32(0.375)


def test_qdq_signed_8bit_range_given():
    x = np.array([-0.8, -0.5, 0, 0.3, 0.8, 0.555, -2, 33], f32)
    want = np.array([-102, -64, 0, 38, 102, 70, -128, 127], f32) / f32(127)
    want[-1] = f32(1)
    got = QDQ(x, -1.0, 1.0, range_given=True)
    np.testing.assert_array_equal(got, (np.array([-102, -64, 0, 38, 102, 70, -128, 127], f32) * (f32(1) / f32(127))))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    up = QDQ(x, -1.0, 1.0, range_given=True, round_mode="HALF_UP")
    assert up[1] == f32(-63) * (f32(1) / f32(127))


def test_qdq_unsigned_8bit_range_given():
    x = np.array([-0.5, 0, 0.3, 0.8], f32)
    inv = f32(1) / f32(255)
    got = QDQ(x, 0.0, 1.0, signed_input=False, range_given=True)
    np.testing.assert_array_equal(got, np.array([0, 0, 76, 204], f32) * inv)
    up = QDQ(x, 0.0, 1.0, signed_input=False, range_given=True, round_mode="HALF_UP")
    assert up[2] == f32(77) * inv
    assert f32(0.3) * f32(255) == f32(76.5)  # the tie the two modes disagree on


def test_qdq_range_adjustment_examples():
    # range [-10, 5]: scale 12.8 and max becomes 9.921875
    x = np.array([-10, 5, 20], f32)
    out = QDQ(x, -10.0, 5.0, range_given=True)
    assert out[2] == f32(9.921875) and out[0] == f32(-10)
    # range [-10, 10]: scale 12.7 and min becomes -10.07874
    out = QDQ(np.array([-20, 10], f32), -10.0, 10.0, range_given=True)
    assert out[0] == f32(-128) * (f32(10) / f32(127))
    np.testing.assert_allclose(out[0], -10.07874, rtol=1e-6)


def test_qdq_invalid_range_error():
    with pytest.raises(ValueError, match="Invalid range"):
        QDQ(np.zeros(3, f32), 1.0, 0.0, range_given=True)
