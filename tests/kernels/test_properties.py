"""Property tests: qtool's kernels against the numpy reference of the spec, bit for bit."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qtool
from reference import fake_quant, fake_quant_grad, nudge, qdq

f32 = np.float32
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def bits(a):
    a = np.asarray(a)
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


def assert_bits_equal(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    np.testing.assert_array_equal(nan_g, nan_w)
    ok = nan_g | (bits(got) == bits(want))
    if not ok.all():
        i = np.flatnonzero(~ok.ravel())[0]
        raise AssertionError(f"{(~ok).sum()} mismatches; first at {i}: got {got.ravel()[i]!r} want {want.ravel()[i]!r}")


@st.composite
def fq_range(draw):
    kind = draw(st.sampled_from(["zero_inside", "positive", "negative", "tiny", "huge", "symmetric"]))
    if kind == "zero_inside":
        mn = -draw(st.floats(0, 100).map(np.float32))
        mx = draw(st.floats(1e-3, 100).map(np.float32))
    elif kind == "positive":
        mn = draw(st.floats(1e-3, 50).map(np.float32))
        mx = mn + draw(st.floats(1e-2, 50).map(np.float32))
    elif kind == "negative":
        mx = -draw(st.floats(1e-3, 50).map(np.float32))
        mn = mx - draw(st.floats(1e-2, 50).map(np.float32))
    elif kind == "tiny":
        mn = -draw(st.floats(0, 1e-6).map(np.float32))
        mx = mn + draw(st.floats(1e-7, 1e-6).map(np.float32))
    elif kind == "huge":
        mn = -draw(st.floats(1e3, 1e6).map(np.float32))
        mx = draw(st.floats(1e3, 1e6).map(np.float32))
    else:
        a = draw(st.floats(1e-3, 10).map(np.float32))
        mn, mx = -a, a
    mn, mx = f32(mn), f32(mx)
    if not mn < mx:
        mx = np.nextafter(mn, f32(np.inf)) if mn == mx else mx
        mn, mx = min(mn, mx), max(mn, mx)
    return mn, mx


@st.composite
def fq_case(draw, rank_min=1):
    nb = draw(st.integers(2, 16))
    narrow = draw(st.booleans())
    mn, mx = draw(fq_range())
    nmin, nmax, scale, _, _ = nudge(mn, mx, nb, narrow)
    n = draw(st.integers(1, 64))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    width = float(nmax) - float(nmin)
    x = rng.uniform(float(nmin) - 0.2 * width, float(nmax) + 0.2 * width, n).astype(f32)
    # ties: exactly half-way between grid points, and the grid points themselves
    levels = rng.integers(0, 2**nb - 1, n)
    ties = (nmin + (levels.astype(f32) + f32(0.5)) * scale).astype(f32)
    grid = (nmin + levels.astype(f32) * scale).astype(f32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, nmin, nmax, mn, mx], f32)
    x = np.concatenate([x, ties, grid, specials])
    rng.shuffle(x)
    return nb, narrow, mn, mx, x


@SETTINGS
@given(fq_case())
def test_fake_quant_args_matches_reference(case):
    nb, narrow, mn, mx, x = case
    got = qtool.fake_quant_with_min_max_args(x, min=float(mn), max=float(mx), num_bits=nb, narrow_range=narrow)
    assert_bits_equal(got, fake_quant(x, mn, mx, nb, narrow, "mul"))


@SETTINGS
@given(fq_case())
def test_fake_quant_vars_matches_reference_divide_variant(case):
    nb, narrow, mn, mx, x = case
    got = qtool.fake_quant_with_min_max_vars(x, mn, mx, num_bits=nb, narrow_range=narrow)
    assert_bits_equal(got, fake_quant(x, mn, mx, nb, narrow, "div"))


@SETTINGS
@given(fq_case(), st.integers(1, 5), st.integers(0, 3))
def test_fake_quant_per_channel_matches_reference(case, depth, extra_rank):
    nb, narrow, mn, mx, x = case
    rng = np.random.default_rng(len(x) * depth)
    # each channel gets its own range derived from the drawn one
    mins = (mn * rng.uniform(0.5, 1.5, depth)).astype(f32)
    maxs = (mx * rng.uniform(0.5, 1.5, depth)).astype(f32)
    swap = mins >= maxs
    mins[swap], maxs[swap] = f32(mn), f32(mx)
    lead = [2] * extra_rank
    xs = np.resize(x, int(np.prod(lead, dtype=int)) * depth).reshape(lead + [depth])
    got = qtool.fake_quant_with_min_max_vars_per_channel(xs, mins, maxs, num_bits=nb, narrow_range=narrow)
    want = np.stack([fake_quant(xs[..., c], mins[c], maxs[c], nb, narrow, "mul") for c in range(depth)], axis=-1)
    assert_bits_equal(got, want)
    g = np.resize(np.linspace(-3, 3, 7, dtype=f32), xs.shape).astype(f32)
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_per_channel_gradient(g, xs, mins, maxs, nb, narrow)
    for c in range(depth):
        wd, wmin, wmax = fake_quant_grad(g[..., c], xs[..., c], mins[c], maxs[c], nb, narrow)
        assert_bits_equal(d[..., c], wd)
        np.testing.assert_allclose([dmin[c], dmax[c]], [wmin, wmax], rtol=1e-5, atol=1e-5)


@SETTINGS
@given(fq_case())
def test_fake_quant_gradients_match_reference(case):
    nb, narrow, mn, mx, x = case
    g = np.random.default_rng(x.size).normal(size=x.shape).astype(f32)
    wd, wmin, wmax = fake_quant_grad(g, x, mn, mx, nb, narrow)
    d = qtool.fake_quant_with_min_max_args_gradient(g, x, min=float(mn), max=float(mx), num_bits=nb, narrow_range=narrow)
    assert_bits_equal(d, wd)
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(g, x, mn, mx, num_bits=nb, narrow_range=narrow)
    assert_bits_equal(d, wd)
    np.testing.assert_allclose([dmin, dmax], [wmin, wmax], rtol=1e-5, atol=1e-5)


@SETTINGS
@given(fq_case(), st.booleans())
def test_quantize_codes_dequantize_to_the_fake_quant_output(case, per_channel):
    nb, narrow, mn, mx, x = case
    x = x[np.isfinite(x)]
    nmin, nmax, scale, zp = qtool.nudged_range(mn, mx, nb, narrow)
    if per_channel:
        q = qtool.quantize_codes(x.reshape(-1, 1), [mn], [mx], nb, narrow, axis=1).ravel()
        want = fake_quant(x, mn, mx, nb, narrow, "mul")
    else:
        q = qtool.quantize_codes(x, mn, mx, nb, narrow)
        want = fake_quant(x, mn, mx, nb, narrow, "div")
    assert q.dtype == np.int32
    assert q.min(initial=2**nb) >= (1 if narrow else 0) and q.max(initial=0) <= 2**nb - 1
    assert_bits_equal((q - zp).astype(f32) * scale, want)


@st.composite
def qdq_case(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    signed = draw(st.booleans())
    nb = draw(st.integers(2, 16))
    narrow = draw(st.booleans())
    half_up = draw(st.booleans())
    range_given = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lo = -draw(st.floats(0, 100)) if draw(st.booleans()) else draw(st.floats(0, 10))
    hi = lo + draw(st.floats(1e-3, 100))
    n = draw(st.integers(1, 80))
    x = rng.uniform(lo - 1, hi + 1, n).astype(dtype)
    # ties at half steps of the scale the kernel will choose
    steps = rng.integers(-(2 ** (nb - 1)), 2 ** (nb - 1), n).astype(dtype)
    unit = dtype(max(abs(lo), abs(hi)) / (2 ** (nb - 1) - 1))
    x = np.concatenate([x, (steps + dtype(0.5)) * unit, np.array([0, -0.0], dtype)])
    return dtype, signed, nb, narrow, half_up, range_given, dtype(lo), dtype(hi), x


@SETTINGS
@given(qdq_case())
def test_quantize_and_dequantize_matches_reference(case):
    dtype, signed, nb, narrow, half_up, range_given, lo, hi, x = case
    got = qtool.quantize_and_dequantize_v2(
        x, lo, hi, signed_input=signed, num_bits=nb, range_given=range_given,
        round_mode="HALF_UP" if half_up else "HALF_TO_EVEN", narrow_range=narrow,
    )
    assert_bits_equal(got, qdq(x, lo, hi, signed, nb, range_given, half_up, narrow))
    g = np.ones_like(x) * dtype(-2)
    d = qtool.quantize_and_dequantize_v2_gradient(g, x, lo, hi)
    assert_bits_equal(d, g * ((lo <= x) & (x <= hi)).astype(dtype))


@SETTINGS
@given(qdq_case(), st.integers(0, 2), st.booleans())
def test_quantize_and_dequantize_per_axis_equals_per_slice(case, axis, range_given):
    dtype, signed, nb, narrow, half_up, _, lo, hi, x = case
    shape = [2, 3, 4]
    xs = np.resize(x, 24).reshape(shape).astype(dtype)
    depth = shape[axis]
    mins = np.array([lo - i for i in range(depth)], dtype)
    maxs = np.array([hi + i for i in range(depth)], dtype)
    mode = "HALF_UP" if half_up else "HALF_TO_EVEN"
    got = qtool.quantize_and_dequantize_v2(xs, mins, maxs, signed, nb, range_given, mode, narrow, axis=axis)
    for c in range(depth):
        sl = np.take(xs, c, axis=axis)
        want = qdq(sl, mins[c], maxs[c], signed, nb, range_given, half_up, narrow)
        assert_bits_equal(np.take(got, c, axis=axis), want)
    # a negative axis counts from the end
    again = qtool.quantize_and_dequantize_v2(xs, mins, maxs, signed, nb, range_given, mode, narrow, axis=axis - 3)
    assert_bits_equal(again, got)
    g = np.full(xs.shape, -1.5, dtype)
    d = qtool.quantize_and_dequantize_v2_gradient(g, xs, mins, maxs, axis=axis)
    for c in range(depth):
        sl = np.take(xs, c, axis=axis)
        assert_bits_equal(np.take(d, c, axis=axis), np.take(g, c, axis=axis) * ((mins[c] <= sl) & (sl <= maxs[c])).astype(dtype))


@pytest.mark.parametrize("nb", range(2, 17))
@pytest.mark.parametrize("narrow", [False, True])
def test_every_bit_width_on_a_dense_grid_with_ties(nb, narrow):
    # exhaustive over all levels of the grid plus every half step
    mn, mx = f32(-0.731), f32(1.913)
    nmin, nmax, scale, _, _ = nudge(mn, mx, nb, narrow)
    levels = np.arange(0, min(2**nb, 4096), dtype=f32)
    x = np.concatenate([nmin + levels * scale, nmin + (levels + f32(0.5)) * scale]).astype(f32)
    for variant, fn in (("mul", qtool.fake_quant_with_min_max_args), ("div", qtool.fake_quant_with_min_max_vars)):
        got = fn(x, float(mn), float(mx), nb, narrow) if variant == "mul" else fn(x, mn, mx, nb, narrow)
        assert_bits_equal(got, fake_quant(x, mn, mx, nb, narrow, variant))
