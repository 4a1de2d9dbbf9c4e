"""Validation errors, special values, layouts and the out= argument."""

import numpy as np
import pytest

import qtool

f32 = np.float32
X = np.array([-7.0, -1.3, 0.0, 0.4, 2.5, 9.0], f32)


@pytest.mark.parametrize("nb", [0, 1, 17, 32, -3, 2.5, True])
def test_num_bits_out_of_range_is_an_error_with_tf_message(nb):
    calls = [
        lambda: qtool.fake_quant_with_min_max_args(X, num_bits=nb),
        lambda: qtool.fake_quant_with_min_max_args_gradient(X, X, num_bits=nb),
        lambda: qtool.fake_quant_with_min_max_vars(X, -1.0, 1.0, num_bits=nb),
        lambda: qtool.fake_quant_with_min_max_vars_gradient(X, X, -1.0, 1.0, num_bits=nb),
        lambda: qtool.fake_quant_with_min_max_vars_per_channel(X, [-1.0] * 6, [1.0] * 6, num_bits=nb),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="num_bits must be"):
            call()


@pytest.mark.parametrize("mn,mx", [(1.0, 1.0), (2.0, -2.0)])
def test_args_min_not_below_max_is_an_error(mn, mx):
    with pytest.raises(ValueError, match="min has to be smaller than max"):
        qtool.fake_quant_with_min_max_args(X, min=mn, max=mx)
    with pytest.raises(ValueError, match="min has to be smaller than max"):
        qtool.fake_quant_with_min_max_args_gradient(X, X, min=mn, max=mx)


def test_vars_inverted_range_is_an_error_not_garbage():
    with pytest.raises(ValueError, match="min has to be smaller than max"):
        qtool.fake_quant_with_min_max_vars(X, 3.0, -3.0)
    with pytest.raises(ValueError, match=r"channel 1"):
        qtool.fake_quant_with_min_max_vars_per_channel(X.reshape(3, 2), [-1.0, 2.0], [1.0, 1.0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_ranges_are_errors(bad):
    with pytest.raises(ValueError, match="finite"):
        qtool.fake_quant_with_min_max_vars(X, bad, 1.0)
    with pytest.raises(ValueError, match="finite"):
        qtool.fake_quant_with_min_max_vars(X, -1.0, bad)


def test_vars_zero_range_gives_zeros_and_passes_gradients():
    g = np.arange(1, 7, dtype=f32)
    np.testing.assert_array_equal(qtool.fake_quant_with_min_max_vars(X, 0.0, 0.0), np.zeros(6, f32))
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(g, X, 0.0, 0.0)
    np.testing.assert_array_equal(d, g)
    assert dmin == 0 and dmax == 0
    # per channel: only channel 0 has the zero range
    x2 = X.reshape(3, 2)
    out = qtool.fake_quant_with_min_max_vars_per_channel(x2, [0.0, -8.0], [0.0, 8.0])
    np.testing.assert_array_equal(out[:, 0], np.zeros(3, f32))
    np.testing.assert_array_equal(out[:, 1], qtool.fake_quant_with_min_max_vars_per_channel(x2[:, 1:], [-8.0], [8.0]).ravel())
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(g.reshape(3, 2), x2, [0.0, -1.0], [0.0, 1.0])
    np.testing.assert_array_equal(d[:, 0], g.reshape(3, 2)[:, 0])
    assert dmin[0] == 0 and dmax[0] == 0


@pytest.mark.parametrize(
    "mins,maxs,shape,match",
    [
        ([-1.0] * 3, [1.0] * 2, (4, 2), r"must have shape \(2,\)"),
        ([[-1.0, -1.0]], [[1.0, 1.0]], (4, 2), r"must have shape \(2,\).*\(1, 2\)"),
        (-1.0, 1.0, (4, 2), r"must have shape \(2,\).*\(\)"),
    ],
)
def test_per_channel_shape_errors_name_expected_and_actual(mins, maxs, shape, match):
    with pytest.raises(ValueError, match=match):
        qtool.fake_quant_with_min_max_vars_per_channel(np.zeros(shape, f32), mins, maxs)


def test_per_channel_rank0_input_is_an_error():
    with pytest.raises(ValueError, match="rank >= 1"):
        qtool.fake_quant_with_min_max_vars_per_channel(np.float32(1), [0.0], [1.0])


def test_gradient_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(3,\).*\(6,\)"):
        qtool.fake_quant_with_min_max_vars_gradient(np.zeros(3, f32), X, -1.0, 1.0)


def test_vars_min_must_be_scalar():
    with pytest.raises(ValueError, match=r"scalar, got shape \(2,\)"):
        qtool.fake_quant_with_min_max_vars(X, [-1.0, -2.0], 1.0)


def test_float64_inputs_to_fake_quant_are_rejected_clearly():
    with pytest.raises(ValueError, match="float32, got float64"):
        qtool.fake_quant_with_min_max_vars(X.astype(np.float64), -1.0, 1.0)


def test_lists_convert_like_tensorflow():
    out = qtool.fake_quant_with_min_max_args([0.1, 0.2], -1.0, 1.0)
    assert out.dtype == f32 and out.shape == (2,)


def test_nan_propagates_and_inf_clamps():
    x = np.array([np.nan, np.inf, -np.inf, 0.5], f32)
    out = qtool.fake_quant_with_min_max_vars(x, -1.0, 1.0)
    nmin, nmax, _, _ = qtool.nudged_range(-1.0, 1.0)
    assert np.isnan(out[0]) and out[1] == nmax and out[2] == nmin
    out = qtool.fake_quant_with_min_max_args(x, -1.0, 1.0)
    assert np.isnan(out[0]) and out[1] == nmax and out[2] == nmin
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(np.ones(4, f32), x, -1.0, 1.0)
    np.testing.assert_array_equal(d, [0, 0, 0, 1])
    assert dmin == 1 and dmax == 1
    q = qtool.quantize_and_dequantize_v2(x, -1.0, 1.0, range_given=True)
    assert np.isnan(q[0]) and q[1] == f32(1) and q[2] == f32(-128) * (f32(1) / f32(127))
    # range_given=False ignores NaN when finding the range
    q = qtool.quantize_and_dequantize_v2(np.array([np.nan, -1, 0.5], f32), 0.0, 0.0)
    assert np.isnan(q[0]) and q[1] == f32(-1)


def test_masked_negative_gradient_is_negative_zero():
    d = qtool.fake_quant_with_min_max_args_gradient(np.array([-2.0], f32), np.array([100.0], f32))
    assert d[0] == 0 and np.signbit(d[0])


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0)])
def test_empty_arrays(shape):
    x = np.zeros(shape, f32)
    assert qtool.fake_quant_with_min_max_args(x).shape == shape
    assert qtool.fake_quant_with_min_max_vars(x, -1.0, 1.0).shape == shape
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(x, x, -1.0, 1.0)
    assert d.shape == shape and dmin == 0 and dmax == 0
    depth = shape[-1]
    out = qtool.fake_quant_with_min_max_vars_per_channel(x, [-1.0] * depth, [1.0] * depth)
    assert out.shape == shape
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(x, x, [-1.0] * depth, [1.0] * depth)
    assert d.shape == shape and dmin.shape == (depth,)
    assert qtool.quantize_and_dequantize_v2(x, 0.0, 0.0).shape == shape
    assert qtool.quantize_and_dequantize_v2(x, 0.0, 1.0, range_given=True).shape == shape
    assert qtool.quantize_and_dequantize_v2_gradient(x, x, 0.0, 1.0).shape == shape


def test_non_contiguous_inputs_and_outputs():
    base = np.random.default_rng(0).normal(size=(6, 8)).astype(f32) * 3
    view = base[:, ::2]
    assert not view.flags.c_contiguous
    want = qtool.fake_quant_with_min_max_vars(np.ascontiguousarray(view), -2.0, 2.0)
    np.testing.assert_array_equal(qtool.fake_quant_with_min_max_vars(view, -2.0, 2.0), want)
    out_base = np.zeros((6, 8), f32)
    out = out_base[:, 1::2]
    ret = qtool.fake_quant_with_min_max_vars(view, -2.0, 2.0, out=out)
    assert ret is out
    np.testing.assert_array_equal(out_base[:, 1::2], want)
    np.testing.assert_array_equal(out_base[:, ::2], 0)
    t = base.T  # Fortran order
    zeros = np.zeros(6, f32)
    np.testing.assert_array_equal(
        qtool.quantize_and_dequantize_v2(t, zeros, zeros, axis=1),
        qtool.quantize_and_dequantize_v2(np.ascontiguousarray(t), zeros, zeros, axis=1),
    )


def test_out_argument_is_written_and_returned():
    out = np.empty_like(X)
    ret = qtool.fake_quant_with_min_max_args(X, out=out)
    assert ret is out
    np.testing.assert_array_equal(out, qtool.fake_quant_with_min_max_args(X))
    out = np.empty_like(X)
    d, _, _ = qtool.fake_quant_with_min_max_vars_gradient(X, X, -1.0, 1.0, out=out)
    assert d is out
    with pytest.raises(ValueError, match=r"shape \(6,\) and dtype float32"):
        qtool.fake_quant_with_min_max_args(X, out=np.empty(5, f32))
    with pytest.raises(ValueError, match="dtype float32"):
        qtool.fake_quant_with_min_max_args(X, out=np.empty(6, np.float64))


def test_in_place_operation_through_out():
    x = X.copy()
    want = qtool.fake_quant_with_min_max_vars(X, -2.0, 2.0)
    qtool.fake_quant_with_min_max_vars(x, -2.0, 2.0, out=x)
    np.testing.assert_array_equal(x, want)


def test_qdq_validation_messages():
    q = qtool.quantize_and_dequantize_v2
    with pytest.raises(ValueError, match="num_bits is out of range: 1"):
        q(X, 0.0, 0.0, num_bits=1)
    with pytest.raises(ValueError, match="num_bits is out of range: 62"):
        q(X, 0.0, 0.0, num_bits=62)
    q(X, 0.0, 0.0, num_bits=62, signed_input=False)  # unsigned allows < 63
    q(X, 0.0, 0.0, num_bits=1, signed_input=False)
    with pytest.raises(ValueError, match="Round mode string must be 'HALF_UP' or 'HALF_TO_EVEN', is 'UP'"):
        q(X, 0.0, 0.0, round_mode="UP")
    with pytest.raises(ValueError, match=r"input_min must have shape \(2,\)"):
        q(X.reshape(3, 2), [0.0, 0.0, 0.0], [1.0, 1.0], axis=1)
    with pytest.raises(ValueError, match="out of range for an input of rank 2"):
        q(X.reshape(3, 2), [0.0] * 2, [1.0] * 2, axis=2)
    with pytest.raises(ValueError, match=r"Invalid range: input_min 2.0 > input_max 1.0 at index 1"):
        q(X.reshape(3, 2), [0.0, 2.0], [1.0, 1.0], range_given=True, axis=1)
    with pytest.raises(ValueError, match="float32 or float64, got int64"):
        q(np.arange(3), 0.0, 1.0)
    with pytest.raises(ValueError, match="float32 or float64, got float16"):
        q(np.zeros(3, np.float16), 0.0, 1.0)


def test_qdq_all_zero_input_gives_zeros():
    for dtype in (np.float32, np.float64):
        out = qtool.quantize_and_dequantize_v2(np.zeros(5, dtype), 0.0, 0.0)
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, 0)


def test_qdq_unsigned_with_negative_data_keeps_negative_outputs():
    out = qtool.quantize_and_dequantize_v2(np.array([-1.0, 0.5, 1.0], f32), 0.0, 0.0, signed_input=False)
    assert out[0] < 0  # TF behaviour, kept


def test_qdq_float64_keeps_dtype_and_precision():
    x = np.array([0.1, -0.7, 0.33333333333], np.float64)
    out = qtool.quantize_and_dequantize_v2(x, -1.0, 1.0, range_given=True)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, np.rint(x * 127.0) * (1.0 / 127.0))


def test_minmax_ignores_nan_and_handles_axes():
    x = np.array([[np.nan, 2.0, -3.0], [4.0, np.nan, 0.5]], f32)
    assert qtool.minmax(x) == (f32(-3.0), f32(4.0))
    # axis names the channel axis: one (min, max) per index along it
    lo, hi = qtool.minmax(x, axis=0)
    np.testing.assert_array_equal(lo, [-3.0, 0.5])
    np.testing.assert_array_equal(hi, [2.0, 4.0])
    lo, hi = qtool.minmax(x, axis=1)
    np.testing.assert_array_equal(lo, [4.0, 2.0, -3.0])
    big = np.random.default_rng(1).normal(size=300_000).astype(f32)
    assert qtool.minmax(big) == (big.min(), big.max())
    lo, hi = qtool.minmax(big.reshape(1000, 300), axis=0)
    np.testing.assert_array_equal(lo, big.reshape(1000, 300).min(axis=1))
    lo, hi = qtool.minmax(big.reshape(1000, 300), axis=1)
    np.testing.assert_array_equal(hi, big.reshape(1000, 300).max(axis=0))
    lo, hi = qtool.minmax(np.zeros(0, f32))
    assert lo == np.inf and hi == -np.inf


def test_large_tensors_take_the_parallel_paths():
    # several chunks: per-axis channel tracking across chunk boundaries
    rng = np.random.default_rng(2)
    x = rng.normal(size=(70_001, 3)).astype(f32)
    mins, maxs = np.array([-1, -2, -0.5], f32), np.array([1, 0.5, 3], f32)
    got = qtool.fake_quant_with_min_max_vars_per_channel(x, mins, maxs)
    for c in range(3):
        want = qtool.fake_quant_with_min_max_args(np.ascontiguousarray(x[:, c]), float(mins[c]), float(maxs[c]))
        np.testing.assert_array_equal(got[:, c], want)
    g = rng.normal(size=x.shape).astype(f32)
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(g, x, mins, maxs)
    for c in range(3):
        nmin, nmax, _, _ = qtool.nudged_range(mins[c], maxs[c])
        np.testing.assert_allclose(dmin[c], g[:, c][x[:, c] < nmin].sum(dtype=np.float64), rtol=1e-5)
        np.testing.assert_allclose(dmax[c], g[:, c][x[:, c] > nmax].sum(dtype=np.float64), rtol=1e-5)
    y = rng.normal(size=(3, 50_000, 2)).astype(np.float64)
    out = qtool.quantize_and_dequantize_v2(y, np.zeros(50_000), np.zeros(50_000), axis=1)
    for j in (0, 12345, 49_999):
        np.testing.assert_array_equal(out[:, j, :], qtool.quantize_and_dequantize_v2(np.ascontiguousarray(y[:, j, :]), 0.0, 0.0))


@pytest.mark.cpu_only  # device arrays are not scanned for NaN
def test_quantize_codes_rejects_nan_and_clamps_inf():
    with pytest.raises(ValueError, match=r"NaN at index \[1\]"):
        qtool.quantize_codes(np.array([0.0, np.nan], f32), -1.0, 1.0)
    q = qtool.quantize_codes(np.array([np.inf, -np.inf], f32), -1.0, 1.0)
    np.testing.assert_array_equal(q, [255, 0])


@pytest.mark.parametrize("narrow", [False, True])
def test_quantize_codes_half_to_even_are_quantize_linear_codes_on_tf_grid(narrow):
    """round_mode="HALF_TO_EVEN": rint(clamp(x / scale, qmin - zp, qmax - zp)) + zp with TF's nudged scale
    and zero point (what a --round-mode half_to_even training graph computes), per tensor and per channel;
    a [0, 0] channel gives its zero point. HALF_UP (the default) stays TF's FakeQuant codes."""
    rng = np.random.default_rng(3)
    lo, hi = np.array([-0.9, -2.3, 0.0], f32), np.array([1.7, 0.4, 0.0], f32)
    _, _, scale, zp = qtool.nudged_range(lo, hi, 8, narrow)
    qmin = 1 if narrow else 0
    k = rng.integers(-130, 130, (3, 400)).astype(f32) + f32(0.5)
    x = np.concatenate([(k * scale[:, None]).astype(f32), rng.uniform(-3, 3, (3, 400)).astype(f32)], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        levels = np.clip(np.rint(x / scale[:, None]), (qmin - zp)[:, None], (255 - zp)[:, None])
    want = np.where(scale[:, None] == 0, zp[:, None], levels + zp[:, None]).astype(np.int32)
    got = qtool.quantize_codes(x, lo, hi, 8, narrow, axis=0, round_mode="HALF_TO_EVEN")
    np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(qtool.quantize_codes(x, lo, hi, 8, narrow, axis=0) != want) > 100  # ties round up
    np.testing.assert_array_equal(qtool.quantize_codes(x[0], lo[0], hi[0], 8, narrow, round_mode="HALF_TO_EVEN"), want[0])
    np.testing.assert_array_equal(qtool.quantize_codes(x[2], 0.0, 0.0, 8, narrow, round_mode="HALF_TO_EVEN"), want[2])
    with pytest.raises(ValueError, match="Round mode string must be 'HALF_UP' or 'HALF_TO_EVEN', is 'half_up'"):
        qtool.quantize_codes(x, lo, hi, 8, narrow, axis=0, round_mode="half_up")


def test_round_half_away_keeps_the_sign_of_zero_like_std_round():
    from qtool.kernels import cpu

    nmin, nmax, scale, inv, zp, qz = cpu.nudge(f32(-1.0), f32(1.0), f32(0), f32(255))
    assert zp == 127
    from qtool.kernels._scalar import round_half_away

    for v, want in [(-0.3, -0.0), (-0.5, -1.0), (-2.5, -3.0), (2.5, 3.0), (0.49999997, 0.0), (-0.0, -0.0), (1.5, 2.0)]:
        got = round_half_away(f32(v))
        assert got == want and np.signbit(got) == np.signbit(want), (v, got)


def test_qdq_gradient_pass_through_is_the_identity():
    x = np.array([-5.0, 0.5, np.nan, 7.0, 0.25], f32)
    g = np.array([1.5, -0.0, 2.0, -3.0, np.nan], f32)
    d = qtool.quantize_and_dequantize_v2_gradient(g, x, -1.0, 1.0, pass_through=True)
    np.testing.assert_array_equal(d.view(np.int32), g.view(np.int32))
    d = qtool.quantize_and_dequantize_v2_gradient(g.reshape(1, 5), x.reshape(1, 5), [-1.0] * 5, [1.0] * 5, axis=1, pass_through=True)
    np.testing.assert_array_equal(d.ravel().view(np.int32), g.view(np.int32))
    masked = qtool.quantize_and_dequantize_v2_gradient(g, x, -1.0, 1.0)
    assert masked[0] == 0 and masked[3] == 0 and np.signbit(masked[3])
